"""Coverage-guided fuzzing of the parsers with atheris: `python -m tests.fuzz TARGET`."""
