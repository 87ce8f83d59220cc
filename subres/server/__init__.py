"""Wiring: options to config to the aiohttp application, routes, discovery, health, TLS."""
