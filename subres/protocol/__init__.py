"""Sans-I/O codecs: bytes in, events out. No asyncio, no sockets, no clock."""
