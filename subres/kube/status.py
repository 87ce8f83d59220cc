"""Kubernetes `Status` objects: the one shape every error answer takes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["REASONS", "StatusError", "exited", "failure", "success", "warning"]

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    426: "UpgradeRequired",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class StatusError(Exception):
    """An error that is answered with a `Status` object and its HTTP code."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details
        self.headers = tuple(headers)
        """Extra response headers (name, value); a name may repeat."""

    def to_dict(self) -> dict[str, Any]:
        """The `Status` object for this error."""
        return failure(self.code, self.message, reason=self.reason, details=self.details)


def failure(
    code: int, message: str, *, reason: str | None = None, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A `Status` with `status: Failure`."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or REASONS.get(code, "Unknown"),
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def success() -> dict[str, Any]:
    """A `Status` with `status: Success`, as remote-command error channels send."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}


def exited(code: int | None) -> dict[str, Any]:
    """How a remote command's end is reported, as kubelet reports an exec's exit status.

    0 or unknown (None) is Success; anything else a Failure with reason
    `NonZeroExitCode` and the code as the `ExitCode` cause, which clients
    such as kubectl turn into their own exit code.
    """
    if not code:
        return success()
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: exit code {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


def warning(text: str) -> str:
    """A `Warning` header value, as kube-apiserver sends them and kubectl prints them."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'299 - "{escaped}"'
