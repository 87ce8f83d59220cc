"""A real BMC for the tests: OpenIPMI's ipmi_sim on loopback, its serial port a TCP socket we serve.

`bmc(tmp)` starts `SerialPort` (an asyncio TCP server on 127.0.0.1, a free
port) and ipmi_sim as a child (`-c lan.conf -f emu`, its LAN channel on
127.0.0.1 and a free UDP port, user "admin" with password `PASSWORD`); it
is ready once it answers an RMCP presence ping and its serial line has
connected. ipmi_sim is the serial line's TCP client: what the BMC writes
to the host's serial port arrives at `SerialPort`, and what we write there is
the host's output. Children are stopped by PID, every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from subres.protocol.ipmi import wire
from tests.support import free_port

USERNAME = "admin"
PASSWORD = "s3cret-pw"
STEP = 20.0
"""Seconds any one wait of these helpers may take."""

needs_ipmi_sim = pytest.mark.full
"""OpenIPMI's ipmi_sim and ipmitool: Debian packages that scripts/test installs, so these tests
run in the whole suite only; where the programs are missing they fail saying so (`bmc`)."""


def _lan_conf(udp: int, serial: int) -> str:
    return f"""name "subres"
set_working_mc 0x20
  startlan 1
    addr 127.0.0.1 {udp}
    priv_limit admin
    allowed_auths_callback none md5 straight
    allowed_auths_user none md5 straight
    allowed_auths_operator none md5 straight
    allowed_auths_admin none md5 straight
    guid a123456789abcdefa123456789abcdef
  endlan
  sol "tcp:127.0.0.1:{serial}" 115200
  user 2 true "{USERNAME}" "{PASSWORD}" admin 10 none md5 straight
"""


# mc_setbmc names the BMC; without mc_add and mc_enable there is no BMC at all.
EMU = """mc_setbmc 0x20
mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02
mc_enable 0x20
"""


@dataclass
class SerialPort:
    """The host's side of the BMC's serial port: a TCP server ipmi_sim connects to."""

    received: bytearray = field(default_factory=bytearray)
    echo: bool = False
    """Write back what arrives (the benchmark's round trips) instead of keeping it."""
    _writer: asyncio.StreamWriter | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._connected, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer = writer
        self._changed.set()
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if self.echo:
                    writer.write(data)
                    continue
                self.received += data
                self._changed.set()

    async def _wait(self, ready: Callable[[], bool]) -> None:
        async with asyncio.timeout(STEP):
            while not ready():
                self._changed.clear()
                await self._changed.wait()

    async def connected(self) -> None:
        """Wait until ipmi_sim's serial line is connected."""
        await self._wait(lambda: self._writer is not None and not self._writer.is_closing())

    async def until(self, size: int) -> bytes:
        """Wait until `size` bytes arrived from the BMC; take them."""
        await self._wait(lambda: len(self.received) >= size)
        data = bytes(self.received[:size])
        del self.received[:size]
        return data

    async def until_match(self, pattern: bytes) -> None:
        """Wait until `pattern` (a regex) appears in what arrived."""
        await self._wait(lambda: re.search(pattern, bytes(self.received)) is not None)

    async def write(self, data: bytes) -> None:
        """The host writes `data` to its serial port."""
        assert self._writer is not None
        self._writer.write(data)
        await self._writer.drain()

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STEP):
                    await self._server.wait_closed()


@dataclass
class Bmc:
    """ipmi_sim on 127.0.0.1:`port` (UDP) with its serial line on `serial`."""

    directory: Path
    port: int
    serial: SerialPort
    process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"ipmi://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.serial._writer = None
        self.process = await asyncio.create_subprocess_exec(
            "ipmi_sim",
            "-c", str(self.directory / "lan.conf"),
            "-f", str(self.directory / "emu"),
            "-s", str(self.directory / "state"),
            "-n",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await self._answers_ping()
        await self.serial.connected()

    async def _answers_ping(self) -> None:
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            sock.connect(("127.0.0.1", self.port))
            async with asyncio.timeout(STEP):
                while True:
                    assert self.process is not None and self.process.returncode is None
                    with contextlib.suppress(ConnectionRefusedError):
                        sock.send(wire.ASF_PING)
                    try:
                        async with asyncio.timeout(0.1):
                            await loop.sock_recv(sock, 512)
                        return
                    except (TimeoutError, ConnectionRefusedError):
                        continue

    async def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            async with asyncio.timeout(STEP):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()

    async def restart(self) -> None:
        await self.stop()
        await self.start()


@contextlib.asynccontextmanager
async def bmc(tmp: Path, *, echo: bool = False) -> AsyncIterator[Bmc]:
    """A running BMC whose files live in `tmp` (the caller's temporary directory); with
    `echo`, its host echoes what the serial port receives."""
    for program in ("ipmi_sim", "ipmitool"):
        assert shutil.which(program), f"{program} is missing: scripts/test installs it"
    directory = tmp / "bmc"
    (directory / "state").mkdir(parents=True)
    serial = SerialPort(echo=echo)
    serial_port = await serial.start()
    udp = free_port(socket.SOCK_DGRAM)
    (directory / "lan.conf").write_text(_lan_conf(udp, serial_port))
    (directory / "emu").write_text(EMU)
    sim = Bmc(directory, udp, serial)
    try:
        await sim.start()
        yield sim
    finally:
        await sim.stop()
        await serial.close()
