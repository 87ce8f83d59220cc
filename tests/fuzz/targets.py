"""The fuzz targets: each feeds one parser what a hostile peer or editor could send.

Every target takes the fuzzer's bytes, drives the code under test with them
(often through `atheris.FuzzedDataProvider`, so the bytes choose structure:
chunk sizes, frame types, header names), lets through only the errors the
code documents for bad input, and checks invariants a user relies on (round
trips give back what went in, buffers stay bounded). Anything else that
escapes is a finding. Import this module inside `atheris.instrument_imports()`
so the code under test is coverage-instrumented.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import struct
from collections.abc import Callable
from typing import Any

import atheris
import yaml

from subres import config, fields
from subres.backends import addresses, endpoint
from subres.protocol import (
    channels,
    consolelog,
    displayrec,
    portforward_spdy,
    portforward_ws,
    rfb,
    rfbwatch,
)
from subres.protocol.spdy import errors as spdy_errors
from subres.protocol.spdy import frames as spdy_frames
from subres.protocol.spdy.connection import Role, SpdyConnection
from subres.protocol.spdy.headers import HeaderDecoder, HeaderEncoder
from subres.protocol.spdy.limits import Limits as SpdyLimits
from subres.protocol.websocket import FrameDecoder, Opcode, ProtocolError, parse_close
from tests.fuzz import hostile, ipmi
from tests.fuzz.support import Provider, chunks
from tests.wsframes import Reader, client_frame

__all__ = ["TARGETS"]

SPDY_LIMITS = SpdyLimits()
RFB_LIMITS = rfb.Limits(max_pixels=64 * 64, max_text=4096, max_messages=64)
"""Small enough that a framebuffer costs the fuzzer nothing; the bounds are the point."""


# -- SPDY ---------------------------------------------------------------------------------


def _header_list(fdp: Provider) -> list[tuple[str, str]]:
    names = [":host", "streamtype", "port", "requestid", "content-type", "x"]
    pairs: list[tuple[str, str]] = []
    for _ in range(fdp.ConsumeIntInRange(0, 6)):
        name = names[fdp.ConsumeIntInRange(0, len(names) - 1)]
        if fdp.ConsumeBool():
            name = fdp.ConsumeUnicodeNoSurrogates(8).lower() or name
        if name not in (n for n, _ in pairs):
            pairs.append((name, fdp.ConsumeUnicodeNoSurrogates(12)))
    return pairs


def _forged_frame(fdp: Provider, encoder: HeaderEncoder) -> bytes:
    """A frame with a valid header and a structured or arbitrary payload."""
    if fdp.ConsumeBool():  # DATA
        stream_id = fdp.ConsumeIntInRange(0, 12)
        body: bytes = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300))
        flags = fdp.ConsumeIntInRange(0, 255)
        return struct.pack(">II", stream_id, flags << 24 | len(body)) + body
    kind = fdp.ConsumeIntInRange(1, 10)
    flags = fdp.ConsumeIntInRange(0, 3)
    if kind in (1, 2, 8) and fdp.ConsumeBool():  # SYN_STREAM, SYN_REPLY, HEADERS
        stream_id = fdp.ConsumeIntInRange(0, 12)
        fixed = struct.pack(">I", stream_id)
        if kind == 1:
            fixed += struct.pack(">IH", fdp.ConsumeIntInRange(0, 12), 0)
        try:
            block = encoder.encode(_header_list(fdp))
        except ValueError:
            block = encoder.compress(fdp.ConsumeBytes(40))
        payload = fixed + block
    else:
        payload = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
    head = 0x80000000 | spdy_frames.VERSION << 16 | kind
    return struct.pack(">II", head, flags << 24 | len(payload)) + payload


def spdy(data: bytes) -> None:
    """A session's inbound byte stream, forged frames or raw bytes, in any chunking."""
    fdp = atheris.FuzzedDataProvider(data)
    role = Role.SERVER if fdp.ConsumeBool() else Role.CLIENT
    connection = SpdyConnection(role, SPDY_LIMITS)
    encoder = HeaderEncoder()
    stream = b"".join(
        _forged_frame(fdp, encoder) if fdp.ConsumeBool() else fdp.ConsumeBytes(50)
        for _ in range(fdp.ConsumeIntInRange(0, 12))
    )
    for chunk in chunks(fdp, stream):
        connection.receive_data(chunk)  # peer faults become events, never exceptions
        assert connection._parser.buffered <= SPDY_LIMITS.max_control_frame_length + 8
        if fdp.ConsumeBool():
            connection.data_to_send()
    for stream_id in connection.open_stream_ids:
        with contextlib.suppress(spdy_errors.UsageError):
            connection.reply(stream_id, [("x", "y")])
    assert isinstance(connection.data_to_send(), bytes)


def spdy_headers(data: bytes) -> None:
    """Header blocks: arbitrary deflate data, and round trips of what the encoder made."""
    fdp = atheris.FuzzedDataProvider(data)
    limits = {"max_block_size": 4096, "max_count": SPDY_LIMITS.max_header_count}
    # A hostile peer's deflate stream, and separately one that only our encoder feeds.
    hostile, decoder, encoder = HeaderDecoder(**limits), HeaderDecoder(**limits), HeaderEncoder()
    for _ in range(fdp.ConsumeIntInRange(1, 4)):
        if fdp.ConsumeBool():
            try:
                hostile.decode(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 200)))
            except spdy_errors.ProtocolError:
                return  # the stream is out of step: the session ends here
            except spdy_errors.HeaderBlockError:
                continue
        else:
            pairs = _header_list(fdp)
            try:
                block = encoder.encode(pairs)
            except ValueError:
                continue
            assert decoder.decode(block) == tuple(pairs)


# -- WebSocket channels and port-forward --------------------------------------------------


def _message(fdp: Provider) -> bytes | str:
    size = fdp.ConsumeIntInRange(0, 200)
    message: bytes | str = (
        fdp.ConsumeBytes(size) if fdp.ConsumeBool() else fdp.ConsumeUnicodeNoSurrogates(size)
    )
    return message


def channel_framing(data: bytes) -> None:
    """Client messages in every dialect, resize payloads, subprotocol offers."""
    fdp = atheris.FuzzedDataProvider(data)
    dialects = list(channels.DIALECTS.values())
    dialect = dialects[fdp.ConsumeIntInRange(0, len(dialects) - 1)]
    message = _message(fdp)
    try:
        event = channels.decode(dialect, message)
    except channels.ChannelError:
        event = None
    if isinstance(event, channels.ChannelData) and dialect.framing is not channels.Framing.RAW:
        again = channels.decode(dialect, channels.encode(dialect, event.channel, event.data))
        assert again == event, (again, event)
    with contextlib.suppress(channels.ChannelError):
        for size in channels.parse_resize(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 120))):
            assert 0 <= size.width <= 0xFFFF and 0 <= size.height <= 0xFFFF
    offers = [fdp.ConsumeUnicodeNoSurrogates(30) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    if fdp.ConsumeBool():
        offers.append(channels.BEARER_PREFIX + fdp.ConsumeUnicodeNoSurrogates(40))
    chosen = channels.negotiate(offers, channels.DIALECTS)
    assert chosen is None or chosen.name in channels.without_bearer(offers) or not chosen.name
    channels.bearer_token(offers)
    port_dialects = list(portforward_ws.DIALECTS.values())
    ports_dialect = port_dialects[fdp.ConsumeIntInRange(0, len(port_dialects) - 1)]
    with contextlib.suppress(channels.ChannelError):
        portforward_ws.decode(ports_dialect, _message(fdp), port_count=fdp.ConsumeIntInRange(1, 4))
    with contextlib.suppress(portforward_ws.PortsError):
        for port in portforward_ws.parse_ports([fdp.ConsumeUnicodeNoSurrogates(30)]):
            assert 0 < port <= 0xFFFF


def portforward_pairing(data: bytes) -> None:
    """Streams with fuzzed headers paired by request id, with time moving on."""
    fdp = atheris.FuzzedDataProvider(data)
    pairing = portforward_spdy.Pairing(timeout=5.0)
    now = 0.0
    added: set[int] = set()
    used: set[int] = set()
    for stream_id in range(1, 2 * fdp.ConsumeIntInRange(0, 20), 2):
        headers = [
            ("port", fdp.PickValueInList(["22", "0", "65536", "x", "", "8080", "٣"])),
            ("streamtype", fdp.PickValueInList(["error", "data", "", "other"])),
        ]
        if fdp.ConsumeBool():
            headers.append(("requestid", fdp.PickValueInList(["0", "1", "2", "a"])))
        try:
            stream = portforward_spdy.check(stream_id, headers)
        except portforward_spdy.StreamRefused:
            continue
        assert 0 < stream.port <= 0xFFFF
        added.add(stream_id)
        event = pairing.add(stream, now=now)
        if isinstance(event, portforward_spdy.PairCompleted):
            pair = {event.error_id, event.data_id}
            assert pair <= added and not pair & used, (pair, used)
            used |= pair
        now += fdp.ConsumeIntInRange(0, 3)
        for timed_out in pairing.expire(now):
            assert timed_out.message
    pairing.expire(math.inf)
    assert len(pairing) == 0 and pairing.next_deadline() is None


# -- RFB ----------------------------------------------------------------------------------

_HANDSHAKE = b"RFB 003.008\n\x01\x01\x00\x00\x00\x00"


def _vnc_server(fdp: Provider, *, smallest: int) -> list[bytes]:
    """A VNC server's bytes, after a valid handshake or from the first byte, in any chunks."""
    stream = b""
    if fdp.ConsumeBool():
        width, height = fdp.ConsumeIntInRange(smallest, 70), fdp.ConsumeIntInRange(smallest, 70)
        stream = _HANDSHAKE + struct.pack(">HH", width, height) + b"\x00" * 16 + b"\0\0\0\0"
    stream += fdp.ConsumeBytes(fdp.remaining_bytes())
    return chunks(fdp, stream) if stream else []


def rfb_client(data: bytes) -> None:
    """A VNC server's bytes, after a valid handshake or from the first byte."""
    fdp = atheris.FuzzedDataProvider(data)
    client = rfb.ScreenshotClient(limits=RFB_LIMITS)
    try:
        for chunk in _vnc_server(fdp, smallest=0):
            for event in client.receive_data(chunk):
                if isinstance(event, rfb.FramebufferCaptured):
                    assert event.width * event.height <= RFB_LIMITS.max_pixels
                    assert len(event.rgb) == event.width * event.height * 3
            assert len(client.data_to_send()) < 4096
    except rfb.RfbError:
        pass


def rfb_watch(data: bytes) -> None:
    """A VNC server's bytes to a display recording's watcher, which asks again and again."""
    fdp = atheris.FuzzedDataProvider(data)
    client = rfbwatch.WatchClient(limits=RFB_LIMITS)
    try:
        for chunk in _vnc_server(fdp, smallest=1):
            for event in client.receive_data(chunk):
                width, height = client.size
                assert width * height <= RFB_LIMITS.max_pixels
                if isinstance(event, rfbwatch.Changed):
                    for x, y, w, h in event.rects:
                        assert len(client.pixels(x, y, w, h)) == w * h * 3
                client.request()
            assert len(client.data_to_send()) < 65536
    except rfb.RfbError:
        pass


def display_recording(data: bytes) -> None:
    """A display recording file as a player reads it: header, blocks, records, the screen."""
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeBool():
        head = displayrec.Header(1, fdp.ConsumeUnicodeNoSurrogates(16)).encode()
        body = fdp.ConsumeBytes(fdp.remaining_bytes())
        blob = (
            head + displayrec.seal(fdp.ConsumeBool(), 0, body) if fdp.ConsumeBool() else head + body
        )
    else:
        blob = fdp.ConsumeBytes(fdp.remaining_bytes())
    assert displayrec.complete_size(blob) <= len(blob)
    screen = displayrec.Screen()
    try:
        _, offset = displayrec.read_header(blob)
        for ref in displayrec.blocks(blob, offset):
            for record in displayrec.records(blob[ref.offset : ref.offset + ref.length]):
                screen.apply(record)
                assert len(screen.rgb) == screen.width * screen.height * 3
    except displayrec.DisplayRecordingError:
        pass


# -- endpoints, addresses, field paths ----------------------------------------------------


def endpoints(data: bytes) -> None:
    """Endpoint URLs, host names, IP addresses in every spelling, field paths."""
    fdp = atheris.FuzzedDataProvider(data)
    prefix = fdp.PickValueInList(["tcp://", "unix://", "ssh://", "", "tcp://[", "ssh://u@"])
    url = prefix + fdp.ConsumeUnicodeNoSurrogates(60)
    try:
        parsed = endpoint.parse(url)
    except endpoint.EndpointInvalid:
        parsed = None
    if parsed is not None and parsed.scheme in ("tcp", "unix"):
        # What an endpoint prints parses back to it (a tcp zone id is written %25 in a URL).
        printed = str(parsed) if parsed.scheme == "unix" else str(parsed).replace("%", "%25")
        assert endpoint.parse(printed) == parsed, (url, parsed)
    with contextlib.suppress(endpoint.EndpointInvalid):
        endpoint.host(fdp.ConsumeUnicodeNoSurrogates(40))
    raw = fdp.ConsumeBytes(16 if fdp.ConsumeBool() else 4)
    if len(raw) in (4, 16):
        ip = ipaddress.ip_address(raw)
        forms = addresses.forms(ip)
        assert forms[0] == addresses.canonical(ip)
        assert all(f.version == 4 for f in forms[1:])
        endpoint.allowed(ip, config.EndpointPolicySpec())
    with contextlib.suppress(fields.FieldError):
        source = fields.value_source(fdp.ConsumeUnicodeNoSurrogates(40) or ".a")
        obj = {"status": {"a": fdp.ConsumeUnicodeNoSurrogates(20)}, "metadata": {"name": "n"}}
        value = source.get(obj) if isinstance(source, fields.FieldPath) else source.render(obj)
        assert value is None or isinstance(value, str | dict | list | int | float | bool)


# -- the configuration file ---------------------------------------------------------------

_KEYS = {
    "": ["group", "version", "parents", "endpointPolicy", "session", "endpointsFromSpec"],
    "parents": ["resource", "kind", "source", "subresources", "instance", "singular"],
    "source": ["group", "version", "resource"],
    "subresources": ["console", "vnc", "screenshot", "portforward", "usbredir", "other"],
    "console": ["endpoint", "address", "ports", "require", "ssh", "name", "consoles", "slots"],
    "consoles": ["serial1", "sol", "serial0", "Bad", "console"],
    "ssh": ["credentials", "hostKey", "command", "term", "via"],
    "endpointPolicy": ["schemes", "allowCIDRs", "denyCIDRs", "socketDirs"],
    "session": [
        "pingInterval",
        "relayHeartbeat",
        "readSize",
        "screenshotMaxPixels",
        "screenshotConcurrency",
    ],
}
_LEAVES: list[Any] = [
    ".status.a", ".spec.a", "unix:///run/{.metadata.uid}/s", "any", "10.0.0.0/8", "::/0",
    "unix:///run/{.metadata.uid}/usb-{slot}", "serial1", 4,
    "bad/99", 0, -1, 1, 1.5, True, None, "", [], {}, 1e400, "{", ".a[", [".status.phase"],
]  # fmt: skip


def _value(fdp: Provider, key: str, depth: int) -> Any:
    """A YAML value for `key`: often the shape the loader expects, sometimes anything."""
    if depth > 4 or fdp.ConsumeIntInRange(0, 3) == 0:
        return fdp.PickValueInList(_LEAVES)
    children = _KEYS.get(key if key in _KEYS else "console", _KEYS["console"])
    if key in ("parents", "schemes", "allowCIDRs", "denyCIDRs", "socketDirs"):
        return [_value(fdp, "source" if key == "parents" else "x", depth + 1)
                for _ in range(fdp.ConsumeIntInRange(0, 2))]  # fmt: skip
    return {
        fdp.PickValueInList(children): _value(fdp, fdp.PickValueInList(children), depth + 1)
        for _ in range(fdp.ConsumeIntInRange(0, 4))
    }


def config_loader(data: bytes) -> None:
    """The configuration file: structured documents, and raw YAML text."""
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeBool():
        document = _value(fdp, "", 0)
    else:
        try:
            document = yaml.safe_load(fdp.ConsumeUnicodeNoSurrogates(300))
        except yaml.YAMLError:
            return
    try:
        loaded = config.parse(document)
    except config.ConfigError:
        return
    assert loaded.parents and all(p.resource for p in loaded.parents), (document, loaded)


# -- the console log ----------------------------------------------------------------------

_LOG_OPTIONS = [
    "follow", "tailLines", "sinceSeconds", "sinceTime", "limitBytes", "timestamps", "previous",
    "console", "other",
]  # fmt: skip
_LOG_VALUES = [
    "true", "1", "F", "0", "-1", "20", "9" * 18, "9" * 19, "", "2024-05-01T10:02:03.5Z",
    "0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59.999999999-23:59", "serial1", "..",
]  # fmt: skip


def console_log(data: bytes) -> None:
    """`log`'s query options, and the text of kept output: lines, stamps and byte limits."""
    fdp = atheris.FuzzedDataProvider(data)
    query = {}
    for _ in range(fdp.ConsumeIntInRange(0, 5)):
        name = fdp.PickValueInList(_LOG_OPTIONS)
        query[name] = (
            fdp.PickValueInList(_LOG_VALUES) if fdp.ConsumeBool()
            else fdp.ConsumeUnicodeNoSurrogates(40)
        )  # fmt: skip
    try:
        options = consolelog.parse(query, now_ns=fdp.ConsumeIntInRange(0, 1 << 62))
    except consolelog.OptionError:
        options = consolelog.LogOptions(
            tail_lines=fdp.ConsumeIntInRange(0, 8) if fdp.ConsumeBool() else None,
            timestamps=fdp.ConsumeBool(),
            limit_bytes=fdp.ConsumeIntInRange(1, 400) if fdp.ConsumeBool() else None,
        )
    text = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 400))
    offsets = sorted({0, *(fdp.ConsumeIntInRange(0, max(0, len(text) - 1)) for _ in range(3))})
    times = sorted(fdp.ConsumeIntInRange(-(1 << 62), 1 << 62) for _ in offsets)
    out = consolelog.render(consolelog.Excerpt(text, offsets, times), options)
    assert options.limit_bytes is None or len(out) <= options.limit_bytes
    if not options.timestamps and options.limit_bytes is None:
        assert text.endswith(out)
    stamper = consolelog.Stamper(options, sent=len(out))
    followed = b"".join(stamper.feed(chunk, 0) for chunk in chunks(fdp, text))
    if options.limit_bytes is not None:
        assert len(out) + len(followed) <= max(options.limit_bytes, len(out))
    elif not options.timestamps:
        assert followed == text


# -- WebSocket ----------------------------------------------------------------------------

WS_MAX_MESSAGE = 1024
_WS_OPCODES = [0, 1, 2, 3, 8, 9, 10, 11]


def _ws_frame(fdp: Provider) -> bytes:
    """A client frame whose every field the fuzzer picks, lengths declared true or not."""
    payload = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300))
    length = None
    if fdp.ConsumeIntInRange(0, 7) == 0:
        length = fdp.ConsumeIntInRange(0, (1 << 64) - 1)
    return client_frame(
        _WS_OPCODES[fdp.ConsumeIntInRange(0, len(_WS_OPCODES) - 1)],
        payload,
        fin=fdp.ConsumeIntInRange(0, 3) > 0,
        rsv=fdp.ConsumeIntInRange(0, 7) if fdp.ConsumeIntInRange(0, 15) == 0 else 0,
        mask=fdp.ConsumeBytes(4).ljust(4, b"\0"),
        masked=fdp.ConsumeIntInRange(0, 15) > 0,
        length=length,
    )


def websocket_frames(data: bytes) -> None:
    """Client frames, well formed or not, in any chunking, through the server's decoder.

    Either the decoder refuses them with a close code or it gives whole
    messages; every span lies in what it consumed and what it leaves is at
    most a header or a control frame (`Reader` checks both); no message is
    over the limit, no control payload over 125 bytes.
    """
    fdp = atheris.FuzzedDataProvider(data)
    frames = [_ws_frame(fdp) for _ in range(fdp.ConsumeIntInRange(0, 8))]
    wire = b"".join(frames) + fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
    reader = Reader(FrameDecoder(max_message=WS_MAX_MESSAGE))
    try:
        for chunk in chunks(fdp, wire):
            reader.receive(chunk)
    except ProtocolError as exc:
        assert 1000 <= exc.code <= 1011, exc.code
        return
    assert all(len(payload) <= WS_MAX_MESSAGE for _, payload in reader.messages)
    for opcode, payload in reader.controls:
        assert len(payload) <= 125
        if opcode is Opcode.CLOSE:
            with contextlib.suppress(ProtocolError):
                code, _ = parse_close(payload)
                assert 1000 <= code <= 4999


TARGETS: dict[str, Callable[[bytes], None]] = {
    "spdy": spdy,
    "spdy-headers": spdy_headers,
    "channels": channel_framing,
    "portforward": portforward_pairing,
    "rfb": rfb_client,
    "rfb-watch": rfb_watch,
    "display-recording": display_recording,
    "endpoints": endpoints,
    "config": config_loader,
    "console-log": console_log,
    "websocket": websocket_frames,
    **hostile.TARGETS,
    **ipmi.TARGETS,
}
"""Every target by the name `python -m tests.fuzz` takes."""
