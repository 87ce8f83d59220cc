"""IPMI v2.0 RMCP+ "lanplus" sessions and Serial-over-LAN, sans I/O.

Bytes in, events out: `client.Client` runs one remote console's session
(RAKP with HMAC-SHA1, HMAC-SHA1-96 integrity, AES-CBC-128 confidentiality)
and its SOL payload; `wire` holds the packet layouts, `rakp` the handshake
messages, `sol` the SOL packets and their flow, `crypto` the cipher suites
and keys. The asyncio driver is `subres.backends.ipmi`.

Why not pyghmi: it speaks SOL, but owns its I/O. Its sessions share one
module-level socket serviced by a select loop it runs itself (in the caller's
thread, or in eventlet's green threads), its waits block that thread, and its
console delivers data through callbacks from that loop; driving it from
asyncio would need a thread per replica bridging both loops and would leave
its timeouts and retries out of our control (and untestable without a BMC).
The protocol itself is small enough to keep here in the sans-I/O shape every
other codec of subres has.
"""
