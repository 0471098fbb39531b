"""Read the sandbox apiserver's audit log: who called what, with which outcome.

Least privilege is a claim about calls: the poller must use exactly the verbs
its ClusterRole grants and never meet a 403; an idle cycle must write
nothing. The apiserver's audit log (JSON lines, Metadata level) is the one
record of that which the poller cannot influence, so the tests and the
benchmarks ask it. Reads are incremental: `mark()` gives an offset, and a
later query can start there to see only what happened since.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["AUDIT_POLICY_YAML", "AuditCall", "AuditLog"]

# Metadata is enough to answer "who did which verb on what, and how did it
# end"; request bodies would make the log large during the scale benchmark.
AUDIT_POLICY_YAML = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  users: ["system:apiserver"]
- level: None
  nonResourceURLs: ["/healthz*", "/readyz*", "/livez*"]
- level: Metadata
"""

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass(frozen=True)
class AuditCall:
    """One completed request as the apiserver recorded it."""

    user: str
    verb: str
    resource: str
    subresource: str
    api_group: str
    namespace: str
    name: str
    code: int
    uri: str
    timestamp: str
    user_agent: str = ""

    @property
    def is_write(self) -> bool:
        return self.verb in WRITE_VERBS


class AuditLog:
    """Incremental reader of one apiserver's JSON audit log."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        """An offset meaning "from now on", for `calls(..., since=mark)`."""
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def events(self, since: int = 0) -> Iterator[AuditCall]:
        """Completed requests recorded after byte offset `since`."""
        try:
            handle = self.path.open("rb")
        except FileNotFoundError:
            return
        with handle:
            handle.seek(since)
            for raw in handle:
                if not raw.endswith(b"\n"):
                    break  # a line still being written
                try:
                    event = json.loads(raw)
                except ValueError:
                    continue
                if event.get("stage") not in ("ResponseComplete", "Panic"):
                    continue
                ref = event.get("objectRef") or {}
                yield AuditCall(
                    user=event.get("user", {}).get("username", ""),
                    verb=event.get("verb", ""),
                    resource=ref.get("resource", ""),
                    subresource=ref.get("subresource", ""),
                    api_group=ref.get("apiGroup", ""),
                    namespace=ref.get("namespace", ""),
                    name=ref.get("name", ""),
                    code=int((event.get("responseStatus") or {}).get("code", 0)),
                    uri=event.get("requestURI", ""),
                    timestamp=event.get("requestReceivedTimestamp", ""),
                    user_agent=event.get("userAgent", ""),
                )

    def calls_by(self, user: str, since: int = 0) -> list[AuditCall]:
        """Every completed request of `user` after `since`."""
        return [call for call in self.events(since) if call.user == user]

    def summary(self, user: str, since: int = 0) -> Counter[tuple[str, str, str, int]]:
        """Counts of (verb, resource, subresource, response code) for `user`."""
        return Counter(
            (call.verb, call.resource, call.subresource, call.code)
            for call in self.calls_by(user, since)
        )
