"""The embedded default: a standalone server with a demo machine on loopback."""
