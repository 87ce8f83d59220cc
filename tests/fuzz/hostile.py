"""Fuzz targets of what the third hostile review opened: the VNC guard, the relay framing,
recordings' names and the sessions list's query.

Same rules as `targets.py`: only the documented errors may escape, and each
target checks what a user relies on (bounded buffers, the same bytes
whatever the chunking, round trips).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import atheris

from subres.auth import attributes
from subres.protocol import asciicast, digits, relay, rfbguard
from subres.sessions import recordfiles
from tests.fuzz.support import Provider, chunks

__all__ = ["TARGETS"]

_VERSIONS = (b"RFB 003.003\n", b"RFB 003.007\n", b"RFB 003.008\n")
_MESSAGE_TYPES = (0, 2, 3, 4, 5, 6, 150, 248, 250, 251, 253, 255, 99)


def _viewer_stream(fdp: Provider, version: bytes) -> bytes:
    """What a viewer sends: a plausible handshake, then messages of every kind, or noise."""
    stream: bytes = version if fdp.ConsumeBool() else fdp.ConsumeBytes(12)
    if version != _VERSIONS[0] and fdp.ConsumeBool():
        stream += bytes([fdp.PickValueInList([1, 2, 19])])
    if fdp.ConsumeBool():
        stream += fdp.ConsumeBytes(16)  # a VNC authentication response, maybe
    stream += bytes([fdp.ConsumeIntInRange(0, 1)])  # ClientInit
    for _ in range(fdp.ConsumeIntInRange(0, 12)):
        kind = fdp.PickValueInList(list(_MESSAGE_TYPES))
        head = bytes([kind, fdp.ConsumeIntInRange(0, 255)])
        if fdp.ConsumeBool():  # a length field of the fuzzer's choosing
            head += struct.pack(">H", fdp.ConsumeIntInRange(0, 0xFFFF))
            head += struct.pack(">i", fdp.ConsumeIntInRange(-(1 << 21), 1 << 21))
        stream += head + fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
    tail: bytes = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
    return stream + tail


def _guarded(view_only: bool, server: bytes, chunks: list[bytes]) -> tuple[bytes, str]:
    """The bytes the guard lets through, and why it refused (if it did)."""
    guard = rfbguard.ViewerGuard(view_only=view_only)
    guard.from_server(server)
    out = bytearray()
    for chunk in chunks:
        try:
            out += guard.from_client(chunk)
        except rfbguard.ViewerRefused as exc:
            return bytes(out), str(exc)
        # Between calls the guard holds a header at most, or what an RFB 3.3 viewer sent
        # before the server chose (refused past MAX_EARLY).
        assert guard.buffered <= max(rfbguard.HEAD_LIMIT, rfbguard.MAX_EARLY), guard.buffered
    return bytes(out), ""


def rfb_guard(data: bytes) -> None:
    """A viewer's bytes through the guard, RFB 3.3, 3.7 and 3.8, view-only or not."""
    fdp = atheris.FuzzedDataProvider(data)
    version = fdp.PickValueInList(list(_VERSIONS))
    view_only = fdp.ConsumeBool()
    server = version + struct.pack(">I", fdp.PickValueInList([0, 1, 2, 16]))
    server = server[: fdp.ConsumeIntInRange(0, len(server))]  # a guest may stop anywhere
    stream = _viewer_stream(fdp, version)
    whole, refused = _guarded(view_only, server, [stream])
    cut, cut_refused = _guarded(view_only, server, chunks(fdp, stream))
    if not refused and not cut_refused:
        assert cut == whole, (cut, whole)
    if view_only:
        # Nothing is added but the shared flag, which replaces the viewer's own.
        assert len(whole) <= len(stream)


def _frames(fdp: Provider, *, peer: bool) -> tuple[bytes, bytes, list[object], bool]:
    """A relay byte stream, the DATA payloads of its encoded frames, the other events they
    make (heartbeats make none), and whether it holds nothing else (RESIZE, CLOSE and EXIT
    frames only between peers)."""
    stream, payloads = bytearray(), bytearray()
    others: list[object] = []
    clean = True
    for _ in range(fdp.ConsumeIntInRange(0, 10)):
        choice = fdp.ConsumeIntInRange(0, 8 if peer else 5)
        if choice == 6:
            width, height = fdp.ConsumeIntInRange(-1, 70000), fdp.ConsumeIntInRange(-1, 70000)
            stream += relay.resize(width, height)
            others.append(
                relay.ResizeReceived(min(max(width, 0), 0xFFFF), min(max(height, 0), 0xFFFF))
            )
        elif choice == 7:
            code, reason = fdp.ConsumeIntInRange(0, 0xFFFF), fdp.ConsumeUnicodeNoSurrogates(40)
            stream += relay.close(code, reason)
            others.append(relay.CloseReceived(code, reason.encode()[:123].decode(errors="replace")))
        elif choice == 8:
            status = fdp.ConsumeIntInRange(-(1 << 33), 1 << 33)
            stream += relay.exit_status(status)
            others.append(relay.ExitReceived(min(max(status, -(1 << 31)), (1 << 31) - 1)))
        elif choice == 0:
            payload = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300))
            stream += relay.data(payload)
            payloads += payload
        elif choice == 1:
            stream += relay.eof()
        elif choice == 2:
            stream += relay.error(fdp.ConsumeUnicodeNoSurrogates(40))
        elif choice == 3:  # a header of any type and length, then whatever follows
            kind, length = fdp.ConsumeIntInRange(0, 255), fdp.ConsumeIntInRange(0, 0xFFFFFFFF)
            stream += struct.pack(">BI", kind, length)
            clean = False
        elif choice == 5:
            stream += relay.heartbeat()  # swallowed: no event
        else:
            stream += fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 20))
            clean = False
    return bytes(stream), bytes(payloads), others, clean


def _events(partial: bool, peer: bool, pieces: list[bytes]) -> list[relay.Event] | None:
    """What a new decoder makes of `pieces`, adjacent DATA joined; None once it refuses."""
    decoder = relay.FrameDecoder(partial=partial, peer=peer)
    events: list[relay.Event] = []
    try:
        for piece in pieces:
            for event in decoder.feed(piece):
                last = events[-1] if events else None
                if isinstance(event, relay.DataReceived) and isinstance(last, relay.DataReceived):
                    events[-1] = relay.DataReceived(last.data + event.data)
                else:
                    events.append(event)
    except relay.FrameError:
        return None
    return events


def relay_framing(data: bytes) -> None:
    """Relay frames between a replica and an agent (streams, datagrams) or two replicas
    (with RESIZE, CLOSE and EXIT), in any chunking."""
    fdp = atheris.FuzzedDataProvider(data)
    partial, peer = fdp.ConsumeBool(), fdp.ConsumeBool()
    relay.heartbeat_interval(fdp.ConsumeUnicodeNoSurrogates(12))  # any Subres-Heartbeat value
    stream, payloads, others, clean = _frames(fdp, peer=peer)
    cut = chunks(fdp, stream)
    # Whatever the stream, however cut: the same events, or the same refusal.
    assert _events(partial, peer, cut) == _events(partial, peer, [stream])
    decoder = relay.FrameDecoder(partial=partial, peer=peer)
    received = bytearray()
    seen: list[object] = []
    failed = False
    for chunk in cut:
        try:
            events = decoder.feed(chunk)
        except relay.FrameError:
            failed = True
            break
        for event in events:
            if isinstance(event, relay.DataReceived):
                received += event.data
            elif isinstance(event, relay.ErrorReceived) and clean:
                assert len(event.reason.encode("utf-8", "surrogatepass")) <= 4 * 1024
            elif isinstance(event, relay.Control):
                assert peer, event  # an agent's decoder refuses them
                seen.append(event)
        # Held back: at most one frame's header and payload.
        assert len(decoder._buffer) <= relay.MAX_FRAME + 5, len(decoder._buffer)
    if clean:
        # What was encoded decodes, whatever the cuts: the DATA bytes in order.
        assert not failed and bytes(received) == payloads, (received, payloads)
        assert seen == others, (seen, others)


_NAMES = ["default", "vm1", "machines", "", ".", "..", "a/b", "Default", "x" * 254, "é", "a\x00"]


def _name(fdp: Provider) -> str:
    """A namespace, resource or object name: a plausible one, or any text."""
    if fdp.ConsumeBool():
        return str(fdp.PickValueInList(_NAMES))
    return str(fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 300)))


def recording_names(data: bytes) -> None:
    """A recording's folder and file names from a URL, and the header line a listing reads."""
    fdp = atheris.FuzzedDataProvider(data)
    namespace, resource, name, uid = _name(fdp), _name(fdp), _name(fdp), _name(fdp)
    try:
        where = recordfiles.folder(namespace=namespace, resource=resource, name=name, uid=uid)
    except ValueError:
        where = None
    if where is not None:
        # Every part is one plain path component: no separator, no NUL, no dot entries.
        for part in where.parts:
            assert part and "/" not in part and "\x00" not in part and part not in (".", ".."), part
            assert len(part.encode()) <= 1016
        assert where.namespace == namespace and where.name == name
    file = str(fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 80)))
    if recordfiles.FILE_NAME.match(file):
        assert "/" not in file and file.endswith(".cast") and file.isascii()
    try:
        header, _ = asciicast.read([fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 600))])
    except asciicast.RecordingError:
        return
    assert 0 < header.width < 10000 and 0 < header.height < 10000
    assert 0 <= header.timestamp < 10**12


_PATHS = [
    "/apis/{g}/{v}/sessions",
    "/apis/{g}/{v}/namespaces/{ns}/sessions",
    "/apis/{g}/{v}/namespaces/{ns}/machines/{name}/sessions",
    "/apis/{g}/{v}/namespaces/{ns}/machines/{name}/recordings/{name}",
    "/{g}/{v}/{ns}",
]
_WATCH = ["true", "false", "1", "0", "t", "T", "TRUE", "yes", "", "tRuE", "9" * 5000]


def sessions_query(data: bytes) -> None:
    """How a sessions list request's path and query are read: for the SubjectAccessReview and
    for the list's own checks; never an exception, never a name with a separator."""
    fdp = atheris.FuzzedDataProvider(data)
    template = str(fdp.PickValueInList(_PATHS))
    path = template.format(g=_name(fdp), v=_name(fdp), ns=_name(fdp), name=_name(fdp))
    if fdp.ConsumeBool():
        path = str(fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 200)))
    query: dict[str, str] = {}
    if fdp.ConsumeBool():
        query["watch"] = (
            str(fdp.PickValueInList(_WATCH))
            if fdp.ConsumeBool()
            else str(fdp.ConsumeUnicodeNoSurrogates(20))
        )
    if fdp.ConsumeBool():
        query["tail"] = str(fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 5000)))
    method = str(fdp.PickValueInList(["GET", "POST", "HEAD", "DELETE", "PATCH", "x"]))
    attrs = attributes.from_request(method, path, query)
    watch = attributes.parse_bool(query.get("watch", ""))
    for part in (attrs.namespace, attrs.name, attrs.resource, attrs.subresource):
        assert "/" not in part, attrs
    reads = method in ("GET", "HEAD")  # both are kube-apiserver's `get`
    if attrs.verb == "watch":
        assert reads and watch is True and not attrs.name, attrs
    if attrs.resource_request and reads and not attrs.name:
        assert attrs.verb == ("watch" if watch else "list"), attrs
    tail = query.get("tail", "")
    if digits.plain(tail):
        assert 0 <= digits.value(tail, cap=(1 << 31) - 1) <= 1 << 31


TARGETS: dict[str, Callable[[bytes], None]] = {
    "rfb-guard": rfb_guard,
    "relay": relay_framing,
    "recording-names": recording_names,
    "sessions-query": sessions_query,
}
