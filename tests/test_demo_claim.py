"""One demo per state directory: the lock, the note it leaves, and what a second demo says."""

from __future__ import annotations

from pathlib import Path

import pytest

from subres.demo import claim as claims


def test_a_second_claim_quotes_the_running_demo(tmp_path: Path) -> None:
    with claims.claim(tmp_path) as first:
        first.announce(url="https://127.0.0.1:8443", kubeconfig=tmp_path / "kubeconfig")
        with pytest.raises(claims.DemoRunning) as refused, claims.claim(tmp_path):
            pass
    message = str(refused.value)
    assert message.startswith(f"a demo is already running in {tmp_path} (pid ")
    assert "https://127.0.0.1:8443" in message
    assert f"subres --kubeconfig {tmp_path / 'kubeconfig'} console demo" in message
    # Released with the first: the directory can be claimed again.
    with claims.claim(tmp_path):
        pass


def test_a_dead_demos_note_is_not_quoted(tmp_path: Path) -> None:
    (tmp_path / claims.LOCK).write_text('{"pid": 1, "url": "https://dead:1", "kubeconfig": "k"}')
    with (
        claims.claim(tmp_path),
        pytest.raises(claims.DemoRunning) as refused,
        claims.claim(tmp_path),
    ):
        pass
    assert str(refused.value).startswith(f"a demo is already starting in {tmp_path}")
