"""The only code that holds transports while a session is live: adapters and the pump."""
