"""Talking to the main apiserver: clients, the parent cache, Status objects."""
