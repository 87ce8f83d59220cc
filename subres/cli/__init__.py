"""The virtctl-like client: one module per verb. Never imports the server side."""
