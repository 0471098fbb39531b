"""The errors of the API layer, as the poller, the CLI and the sandbox meet them.

Each is a decision the caller makes differently: a 404 means the object is
gone, a 409 that another writer got there first (decide again next cycle),
`NotOwned` that the name the poller would write is someone else's object
(never overwrite it), and `ApiError` carries any other status with the
apiserver's own words, which end up in a job's message. Whether the same
request may succeed later is one property, `ApiError.transient`, which the
operator (`poller.act`, `poller.podreads`, `poller.poison`), the CLI
(`poller.cli.errors.ApiError`, which adds what was asked) and the sandbox
(`poller.sandbox.podsetup.ApiError`) all inherit.
"""

from __future__ import annotations

import json

__all__ = ["ApiError", "Conflict", "NotFound", "NotOwned"]


class NotFound(Exception):
    """The object does not exist (404)."""


class Conflict(Exception):
    """A write lost a race (409): re-read and decide again next cycle."""


class NotOwned(Exception):
    """An object under the name the poller would write belongs to someone else."""


class ApiError(Exception):
    """The apiserver answered with an error status (the operator's `Kube` raises
    it for any but 404 and 409; the CLI and the sandbox for any outside 2xx)."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(status, reason, body)
        self.status = status
        self.reason = reason
        self.body = body

    @property
    def transient(self) -> bool:
        """The apiserver (or a kubelet behind it) failed, or asks to slow down:
        the same request may succeed next cycle, unlike a refusal for good."""
        return self.status >= 500 or self.status == 429

    @property
    def said(self) -> str | None:
        """The message of the Status object the apiserver answered with, if any."""
        try:
            message = json.loads(self.body or "{}").get("message")
        except (ValueError, AttributeError):
            return None
        return str(message) if message else None

    @property
    def message(self) -> str:
        """The apiserver's own words, else the reason."""
        return self.said or self.reason

    def __str__(self) -> str:
        detail = self.said or self.body.strip()[:300]
        head = f"{self.status} {self.reason}"
        return f"{head}: {detail}" if detail else head
