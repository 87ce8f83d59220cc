"""The sessions domain: who holds, watches, keeps and records each console and display."""
