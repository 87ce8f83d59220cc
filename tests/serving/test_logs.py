"""`--logging-format=json`: every line parses, shaped as Kubernetes components' JSON logs."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect

from subres.serving.logs import JsonFormatter, TextFormatter
from tests.cli.conftest import Demo, run_cli, running_demo
from tests.support import Backend, machine, start_standalone, wait_for


def _record(level: int, msg: str, *args: object, **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord(
        "subres.test", level, "/src/subres/server/run.py", 42, msg, args, None
    )
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_info_with_fields() -> None:
    record = _record(logging.INFO, "%s ended", "console", fields={"user": "alice", "bytesUp": 3})
    line = JsonFormatter().format(record)
    entry = json.loads(line)
    assert "\n" not in line
    assert entry == {
        "ts": record.created * 1000,
        "caller": "server/run.py:42",
        "msg": "console ended",
        "v": 0,
        "logger": "subres.test",
        "user": "alice",
        "bytesUp": 3,
    }


def test_fields_never_replace_the_standard_keys() -> None:
    fields = {"msg": "forged", "ts": 0, "v": 9, "err": "x", "path": Path("/p")}
    entry = json.loads(JsonFormatter().format(_record(logging.DEBUG, "real", fields=fields)))
    assert (entry["msg"], entry["v"], entry["path"]) == ("real", 4, "/p")
    assert entry["ts"] > 0 and "err" not in entry


def test_errors_carry_err_and_the_stack() -> None:
    try:
        raise ValueError("bad thing")
    except ValueError:
        record = _record(logging.ERROR, "it failed")
        record.exc_info = sys.exc_info()
    entry = json.loads(JsonFormatter().format(record))
    assert entry["err"] == "ValueError: bad thing"
    assert "v" not in entry
    assert "Traceback" in entry["stacktrace"]
    # Without an exception, the message is the error.
    assert json.loads(JsonFormatter().format(_record(logging.ERROR, "plain")))["err"] == "plain"


def _lines(demo: Demo) -> list[dict[str, Any]]:
    text = (demo.state_dir / "server.log").read_text()
    return [json.loads(line) for line in text.splitlines()]


async def test_the_demo_logs_json_and_the_session_end_has_its_fields(tmp_path: Path) -> None:
    with running_demo("--logging-format=json") as demo:
        done = run_cli(
            ["--kubeconfig", demo.kubeconfig, "console", "demo"],
            home=tmp_path,
            stdin=b"exit\n",
        )
        assert done.returncode == 0, done.stderr
        # The server logs the session's end once both sides closed: no event to wait on.
        await wait_for(lambda: any("subresource" in e for e in _lines(demo)))
        entries = _lines(demo)
    serving = next(e for e in entries if e["msg"].startswith("serving on https://127.0.0.1:"))
    assert serving["v"] == 0 and serving["caller"].startswith("server/run.py:")
    assert isinstance(serving["ts"], float)
    ended = next(e for e in entries if "subresource" in e)
    assert (ended["subresource"], ended["user"], ended["name"]) == ("console", "demo", "demo")
    assert ended["bytesUp"] >= len(b"exit\n")
    # The console went through the demo's SSH server, whose library logs at INFO: not here.
    others = [e for e in entries if not e["logger"].startswith("subres") and e.get("v") == 0]
    assert [e for e in others if e["logger"] != "aiohttp.access"] == []


def test_text_lines_escape_what_users_chose() -> None:
    forged = "mallory\n2026-12-01 10:00:00,000 INFO subres: console of default/vm1 by admin"
    record = _record(logging.INFO, "console by %s ended\r\x1b[2J\u2028", forged)
    line = TextFormatter().format(record)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\u2028" not in line
    assert line.endswith(
        "console by mallory\\x0a2026-12-01 10:00:00,000 INFO subres: console of default/vm1 "
        "by admin ended\\x0d\\x1b[2J\\u2028"
    )
    try:
        raise ValueError("bad")
    except ValueError:
        record = _record(logging.ERROR, "failed for %s", "a\nb")
        record.exc_info = sys.exc_info()
    head, *trace = TextFormatter().format(record).splitlines()
    assert head.endswith("failed for a\\x0ab") and trace[0] == "Traceback (most recent call last):"


async def test_a_user_name_with_a_newline_forges_no_line_of_the_servers_log(
    tmp_path: Path,
) -> None:
    forged = "mallory\n2026-12-01 10:00:00,000 INFO subres: ended by admin"  # a CN, <= 64
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    echo = await Backend().start_tcp()
    try:
        async with start_standalone(tmp_path, machine("vm1", console=echo.url)) as subres:
            tls = subres.client_cert_ssl(forged, ["devs"])
            async with connect(subres.url("vm1"), ssl=tls) as ws:
                await ws.send(b"hi")
                assert await ws.recv() == b"hi"
            await wait_for(lambda: "mallory" in stream.getvalue())
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        await echo.stop()
    lines = stream.getvalue().splitlines()
    assert any("mallory\\x0a2026-12-01" in line for line in lines)
    stamp = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")
    assert all(stamp.match(line) or line.startswith(("Traceback", " ")) for line in lines), lines
