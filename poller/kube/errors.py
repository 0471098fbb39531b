"""The errors of the API layer, as the poller, the CLI and the sandbox meet them.

One hierarchy: `ApiError` carries an error status with the apiserver's own
words, which end up in a job's message, and three kinds of it are decisions
the caller makes differently, so they are classes of their own: `NotFound`
(404, the object is gone), `Conflict` (409, another writer got there first:
decide again next cycle) and `NotOwned` (the name the poller would write is
someone else's object: never overwrite it). An ``except ApiError`` clause
therefore catches them too; where one is handled differently its clause
comes first. Whether the same
request may succeed later is one property, `ApiError.transient`, which the
operator (`poller.cycle.act`, `poller.cycle.podio`, `poller.cycle.poison`), the CLI
(`lmeval_cli.errors.ApiError`, which adds what was asked) and the sandbox
(`lmeval_sandbox.podsetup.ApiError`) all inherit.
"""

from __future__ import annotations

import json

__all__ = ["ApiError", "Conflict", "NotFound", "NotOwned"]


class ApiError(Exception):
    """The apiserver answered with an error status (the operator's `Kube` raises
    the subclasses below for 404 and 409; the CLI and the sandbox raise it for
    any status outside 2xx)."""

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


class _Named(ApiError):
    """An `ApiError` the API layer names itself, with a message of its own."""

    STATUS = 0

    def __init__(self, message: str, body: str = "") -> None:
        super().__init__(self.STATUS, message, body)

    @property
    def message(self) -> str:
        return self.reason

    def __str__(self) -> str:
        return self.reason


class NotFound(_Named):
    """The object does not exist (404)."""

    STATUS = 404


class Conflict(_Named):
    """A write lost a race (409): re-read and decide again next cycle."""

    STATUS = 409


class NotOwned(_Named):
    """An object under the name the poller would write belongs to someone else:
    never overwritten (a refusal for good, as the apiserver's 409 would be)."""

    STATUS = 409
