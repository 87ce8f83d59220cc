"""What every fuzz target shares: the provider's type and cutting a stream where the fuzzer says."""

from __future__ import annotations

from typing import Any

__all__ = ["Provider", "chunks"]

Provider = Any
"""`atheris.FuzzedDataProvider` (untyped)."""


def chunks(fdp: Provider, data: bytes) -> list[bytes]:
    """`data` cut where the fuzzer says: a peer may send any split."""
    pieces, pos = [], 0
    while pos < len(data):
        size = fdp.ConsumeIntInRange(1, max(1, len(data) - pos))
        pieces.append(data[pos : pos + size])
        pos += size
    return pieces
