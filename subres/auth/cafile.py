"""A PEM bundle of CA certificates that follows its file."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from cryptography import x509

__all__ = ["CAFile"]

log = logging.getLogger(__name__)


class CAFile:
    """The certificates in `path`, re-read when the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.certificates: list[x509.Certificate] = []
        self._stamp: tuple[int, int, int] | None = None
        if not self.reload_if_changed():
            raise ValueError(f"{path}: no CA certificates could be loaded")

    def reload_if_changed(self) -> bool:
        """Re-read the bundle if it changed; a broken file keeps the old certificates."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp == self._stamp:
                return False
            certs = x509.load_pem_x509_certificates(self.path.read_bytes())
        except (OSError, ValueError) as exc:
            log.warning("CA file %s not loaded: %s", self.path, exc)
            return False
        self.certificates, self._stamp = certs, stamp
        return True
