"""One SPDY/3.1 session as a sans-I/O state machine.

`SpdyConnection` takes the bytes a peer sent and returns events; commands
(`open_stream`, `reply`, `send_data`, ...) queue bytes that `data_to_send`
hands to whatever does the I/O. It keeps the stream table, checks stream ids,
answers pings, and turns the peer's faults into queued RST_STREAM or GOAWAY
frames instead of exceptions. It has no clock: timeouts and keepalive
intervals belong to the I/O layer.

Flow control is deliberately absent. The Go peer (moby/spdystream) neither
sends nor obeys WINDOW_UPDATE, so this side accepts and ignores it and never
waits for window; backpressure comes from the I/O layer watching
`bytes_to_send` and from not calling `receive_data` while it is high.

The connection queues nothing on its own before it receives a frame or gets a
command, so a server never speaks before the client's first frame.
"""

from __future__ import annotations

from collections import deque
from enum import Enum

from subres.protocol.spdy import events as ev
from subres.protocol.spdy.errors import (
    ConnectionClosedError,
    ProtocolError,
    StreamClosedError,
    StreamError,
    UsageError,
)
from subres.protocol.spdy.frames import (
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    SynReplyFrame,
    SynStreamFrame,
    WindowUpdateFrame,
    data_frame_header,
    serialize,
)
from subres.protocol.spdy.headers import (
    HeaderDecoder,
    HeaderEncoder,
    HeadersLike,
    normalize_headers,
)
from subres.protocol.spdy.limits import Limits
from subres.protocol.spdy.parser import FrameParser
from subres.protocol.spdy.status import GoAwayStatus, RstStatus, goaway_status, rst_status
from subres.protocol.spdy.streams import Stream, StreamInput, StreamState, StreamTable

__all__ = ["Role", "SpdyConnection"]

_MAX_ID = 0x7FFFFFFF


class Role(Enum):
    """Which end of the session this is; it fixes the parity of new ids."""

    CLIENT = "client"
    SERVER = "server"


class SpdyConnection:
    """The state of one SPDY/3.1 session, seen from one end."""

    def __init__(self, role: Role, limits: Limits | None = None) -> None:
        self.role = role
        self.limits = limits if limits is not None else Limits()
        decoder = HeaderDecoder(
            max_block_size=self.limits.max_header_block_size,
            max_count=self.limits.max_header_count,
        )
        self._parser = FrameParser(decoder, self.limits)
        self._encoder = HeaderEncoder()
        # Output as a queue of pieces (frame headers, payloads) joined only when
        # taken: a payload is copied once, not on every queue operation.
        self._out: deque[bytes | memoryview] = deque()
        self._out_size = 0
        self._parity = 1 if role is Role.CLIENT else 0
        self._streams = StreamTable(
            local_parity=self._parity, max_remembered_resets=self.limits.max_remembered_resets
        )
        self._next_ping_id = self._streams.next_local_id
        self._pings: dict[int, None] = {}
        self._goaway_sent = False
        self._goaway_received = False
        self._terminated = False

    # -- state -------------------------------------------------------------

    @property
    def bytes_to_send(self) -> int:
        """Bytes queued for `data_to_send`; stop reading while this is high."""
        return self._out_size

    @property
    def terminated(self) -> bool:
        """A protocol error ended the session; only the queued bytes remain."""
        return self._terminated

    @property
    def goaway_sent(self) -> bool:
        """This side queued a GOAWAY."""
        return self._goaway_sent

    @property
    def goaway_received(self) -> bool:
        """The peer sent a GOAWAY."""
        return self._goaway_received

    @property
    def open_stream_ids(self) -> tuple[int, ...]:
        """Ids of the streams not yet closed, in the order they opened."""
        return self._streams.ids()

    def stream_state(self, stream_id: int) -> StreamState:
        """The state of a stream; ids never used are IDLE, forgotten ones CLOSED."""
        return self._streams.state_of(stream_id)

    def data_to_send(self, max_bytes: int | None = None) -> bytes:
        """Take up to `max_bytes` (all by default) of the queued output."""
        limit = self._out_size if max_bytes is None else min(max_bytes, self._out_size)
        if limit <= 0:
            return b""
        out = self._out
        parts: list[bytes | memoryview] = []
        taken = 0
        while taken < limit:
            piece = out.popleft()
            room = limit - taken
            if len(piece) > room:
                # A view of the rest: splitting a long piece never copies what stays queued.
                out.appendleft(memoryview(piece)[room:])
                piece = memoryview(piece)[:room]
            parts.append(piece)
            taken += len(piece)
        self._out_size -= taken
        if len(parts) == 1 and type(parts[0]) is bytes:
            return parts[0]
        return b"".join(parts)

    # -- commands ------------------------------------------------------------

    def open_stream(self, headers: HeadersLike, *, fin: bool = False, priority: int = 0) -> int:
        """Queue a SYN_STREAM and return the new stream's id."""
        self._require_open_session()
        pairs = normalize_headers(headers)
        stream_id = self._streams.next_local_id
        if stream_id > _MAX_ID:
            raise ConnectionClosedError("stream ids are used up; open a new connection")
        self._queue(SynStreamFrame(stream_id, pairs, priority=priority, fin=fin))
        self._streams.next_local_id += 2
        stream = Stream(stream_id, local=True)
        self._streams.add(stream)
        stream.apply(StreamInput.SEND_SYN)
        if fin:
            self._sent_fin(stream)
        return stream_id

    def reply(self, stream_id: int, headers: HeadersLike = (), *, fin: bool = False) -> None:
        """Accept a stream the peer opened: queue its SYN_REPLY."""
        stream = self._live_stream(stream_id)
        if stream.local or stream.replied:
            raise UsageError(f"stream {stream_id} takes no SYN_REPLY from this side")
        self._queue(SynReplyFrame(stream_id, normalize_headers(headers), fin=fin))
        stream.replied = True
        if fin:
            self._sent_fin(stream)

    def send_data(self, stream_id: int, data: bytes, *, fin: bool = False) -> None:
        """Queue `data` as DATA frames of at most `max_send_frame_size` bytes."""
        stream = self._live_stream(stream_id)
        if not stream.can_send:
            raise StreamClosedError(f"stream {stream_id} is {stream.state.value}")
        if not stream.local and not stream.replied:
            raise UsageError(f"reply to stream {stream_id} before sending data on it")
        if not data and not fin:
            return
        if type(data) is not bytes:
            data = bytes(data)  # the caller may reuse a mutable buffer: keep our own
        size = self.limits.max_send_frame_size
        if len(data) <= size:
            self._emit(data_frame_header(stream_id, len(data), fin=fin))
            self._emit(data)
        else:
            last = (len(data) - 1) // size * size
            view = memoryview(data)
            for start in range(0, last + 1, size):
                chunk = view[start : start + size]
                self._emit(data_frame_header(stream_id, len(chunk), fin=fin and start == last))
                self._emit(chunk)
        if fin:
            self._sent_fin(stream)

    def end_stream(self, stream_id: int) -> None:
        """Half-close a stream: queue an empty DATA frame with FIN."""
        self.send_data(stream_id, b"", fin=True)

    def reset_stream(self, stream_id: int, status: RstStatus = RstStatus.CANCEL) -> None:
        """Queue a RST_STREAM; a stream already closed or unknown is left alone."""
        if self._terminated:
            raise ConnectionClosedError("the session has ended")
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        stream.apply(StreamInput.SEND_RST)
        self._streams.forget(stream)
        self._queue_reset(stream_id, status)

    def ping(self) -> int:
        """Queue a PING and return its id; `PingAcknowledged` reports the echo."""
        if self._terminated:
            raise ConnectionClosedError("the session has ended")
        ping_id = self._next_ping_id
        self._next_ping_id = ping_id + 2 if ping_id + 2 <= 0xFFFFFFFF else 2 - self._parity
        self._pings[ping_id] = None
        if len(self._pings) > self.limits.max_outstanding_pings:
            del self._pings[next(iter(self._pings))]
        self._queue(PingFrame(ping_id))
        return ping_id

    def goaway(self, status: GoAwayStatus = GoAwayStatus.OK) -> None:
        """Queue a GOAWAY once: the peer's streams after the last seen are refused."""
        if self._goaway_sent or self._terminated:
            return
        self._goaway_sent = True
        self._queue(GoAwayFrame(self._streams.last_peer_id, status))

    def close(self, status: GoAwayStatus = GoAwayStatus.OK) -> None:
        """Reset every open stream (CANCEL), then queue a GOAWAY."""
        if self._terminated:
            return
        for stream_id in self._streams.ids():
            self.reset_stream(stream_id, RstStatus.CANCEL)
        self.goaway(status)

    # -- input -----------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[ev.Event]:
        """Take bytes from the peer; return what they meant, in order."""
        if self._terminated:
            return []
        self._parser.feed(data)
        events: list[ev.Event] = []
        # Every pass takes a frame from the parser or leaves; the parser's
        # buffer bounds the number of passes.
        while not self._terminated:
            try:
                frame = self._parser.next_frame()
                if frame is None:
                    break
                self._handle(frame, events)
            except StreamError as exc:
                self._stream_error(exc.stream_id, exc.status, events)
            except ProtocolError as exc:
                self._terminate(exc.status, str(exc), events)
        return events

    def _handle(self, frame: Frame, events: list[ev.Event]) -> None:
        match frame:
            case DataFrame():
                self._on_data(frame, events)
            case SynStreamFrame():
                self._on_syn_stream(frame, events)
            case SynReplyFrame():
                self._on_syn_reply(frame, events)
            case HeadersFrame():
                self._on_headers(frame, events)
            case RstStreamFrame():
                self._on_rst_stream(frame, events)
            case SettingsFrame():
                events.append(ev.SettingsReceived(frame.entries))
            case PingFrame():
                self._on_ping(frame, events)
            case GoAwayFrame():
                self._on_goaway(frame, events)
            case WindowUpdateFrame():
                pass

    def _on_syn_stream(self, frame: SynStreamFrame, events: list[ev.Event]) -> None:
        stream_id = frame.stream_id
        if stream_id % 2 == self._parity:
            raise ProtocolError(f"peer opened stream {stream_id}, an id of this side's parity")
        if stream_id <= self._streams.last_peer_id:
            raise ProtocolError(
                f"peer opened stream {stream_id} after {self._streams.last_peer_id}"
            )
        if self._goaway_sent:
            return
        self._streams.last_peer_id = stream_id
        if self._streams.peer_count >= self.limits.max_concurrent_streams:
            self._queue_reset(stream_id, RstStatus.REFUSED_STREAM)
            return
        stream = Stream(stream_id, local=False)
        stream.apply(StreamInput.RECV_SYN)
        self._streams.add(stream)
        events.append(ev.StreamOpened(stream_id, frame.headers, frame.fin, frame.associated_id))
        if frame.fin:
            self._received_fin(stream, events)

    def _on_syn_reply(self, frame: SynReplyFrame, events: list[ev.Event]) -> None:
        stream = self._stream_for_frame(frame.stream_id, events)
        if stream is None:
            return
        if not stream.local:
            raise StreamError(
                "SYN_REPLY on a peer's stream",
                stream_id=stream.stream_id,
                status=RstStatus.PROTOCOL_ERROR,
            )
        if stream.replied:
            raise StreamError(
                "second SYN_REPLY", stream_id=stream.stream_id, status=RstStatus.STREAM_IN_USE
            )
        stream.replied = True
        events.append(ev.StreamReplied(stream.stream_id, frame.headers, frame.fin))
        if frame.fin:
            self._received_fin(stream, events)

    def _on_headers(self, frame: HeadersFrame, events: list[ev.Event]) -> None:
        stream = self._receiving_stream(frame.stream_id, events)
        if stream is not None:
            events.append(ev.HeadersReceived(stream.stream_id, frame.headers, frame.fin))
            if frame.fin:
                self._received_fin(stream, events)

    def _on_data(self, frame: DataFrame, events: list[ev.Event]) -> None:
        stream = self._receiving_stream(frame.stream_id, events)
        if stream is not None:
            if frame.data:
                events.append(ev.DataReceived(stream.stream_id, frame.data, frame.fin))
            if frame.fin:
                self._received_fin(stream, events)

    def _on_rst_stream(self, frame: RstStreamFrame, events: list[ev.Event]) -> None:
        stream = self._streams.get(frame.stream_id)
        if stream is None:
            return
        stream.apply(StreamInput.RECV_RST)
        self._streams.forget(stream)
        events.append(ev.StreamReset(stream.stream_id, rst_status(frame.status)))

    def _on_ping(self, frame: PingFrame, events: list[ev.Event]) -> None:
        if frame.ping_id % 2 != self._parity:
            self._queue(frame)
            events.append(ev.PingReceived(frame.ping_id))
        elif frame.ping_id in self._pings:
            del self._pings[frame.ping_id]
            events.append(ev.PingAcknowledged(frame.ping_id))

    def _on_goaway(self, frame: GoAwayFrame, events: list[ev.Event]) -> None:
        self._goaway_received = True
        events.append(ev.GoAwayReceived(frame.last_stream_id, goaway_status(frame.status)))
        for stream in self._streams.local_streams_above(frame.last_stream_id):
            stream.apply(StreamInput.RECV_RST)
            self._streams.forget(stream)
            events.append(ev.StreamReset(stream.stream_id, RstStatus.REFUSED_STREAM))

    # -- stream bookkeeping -----------------------------------------------------

    def _receiving_stream(self, stream_id: int, events: list[ev.Event]) -> Stream | None:
        stream = self._stream_for_frame(stream_id, events)
        if stream is not None and not stream.can_receive:
            raise StreamError(
                f"frame after FIN on stream {stream_id}",
                stream_id=stream_id,
                status=RstStatus.STREAM_ALREADY_CLOSED,
            )
        return stream

    def _stream_for_frame(self, stream_id: int, events: list[ev.Event]) -> Stream | None:
        """The live stream a peer's frame names, or None after answering for it."""
        stream = self._streams.get(stream_id)
        if stream is not None or self._streams.was_reset(stream_id):
            return stream
        if self._streams.is_used(stream_id):
            self._stream_error(stream_id, RstStatus.STREAM_ALREADY_CLOSED, events)
        elif not self._goaway_sent:
            self._stream_error(stream_id, RstStatus.INVALID_STREAM, events)
        return None

    def _sent_fin(self, stream: Stream) -> None:
        stream.apply(StreamInput.SEND_FIN)
        if stream.state is StreamState.CLOSED:
            self._streams.forget(stream)

    def _received_fin(self, stream: Stream, events: list[ev.Event]) -> None:
        stream.apply(StreamInput.RECV_FIN)
        events.append(ev.StreamEnded(stream.stream_id))
        if stream.state is StreamState.CLOSED:
            self._streams.forget(stream)

    def _stream_error(self, stream_id: int, status: RstStatus, events: list[ev.Event]) -> None:
        stream = self._streams.get(stream_id)
        if stream is not None:
            stream.apply(StreamInput.SEND_RST)
            self._streams.forget(stream)
            events.append(ev.StreamReset(stream_id, status, by_peer=False))
        self._queue_reset(stream_id, status)

    def _queue_reset(self, stream_id: int, status: RstStatus) -> None:
        self._queue(RstStreamFrame(stream_id, status))
        self._streams.remember_reset(stream_id)

    # -- session ------------------------------------------------------------------

    def _terminate(self, status: GoAwayStatus, reason: str, events: list[ev.Event]) -> None:
        if not self._goaway_sent:
            self._goaway_sent = True
            self._queue(GoAwayFrame(self._streams.last_peer_id, status))
        self._terminated = True
        self._streams.clear()
        events.append(ev.ConnectionTerminated(status, reason))

    def _require_open_session(self) -> None:
        if self._terminated or self._goaway_sent or self._goaway_received:
            raise ConnectionClosedError("the session takes no new streams")

    def _live_stream(self, stream_id: int) -> Stream:
        if self._terminated:
            raise ConnectionClosedError("the session has ended")
        stream = self._streams.get(stream_id)
        if stream is None:
            raise StreamClosedError(f"stream {stream_id} is {self.stream_state(stream_id).value}")
        return stream

    def _queue(self, frame: Frame) -> None:
        self._emit(serialize(frame, self._encoder))

    def _emit(self, piece: bytes | memoryview) -> None:
        if piece:
            self._out.append(piece)
            self._out_size += len(piece)
