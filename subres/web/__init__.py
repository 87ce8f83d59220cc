"""The browser terminal and VNC page."""
