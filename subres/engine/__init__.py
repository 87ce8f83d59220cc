"""asyncio engines over the sans-I/O codecs of `subres.protocol`, for the server and the CLI."""
