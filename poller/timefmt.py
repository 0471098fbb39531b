"""Times as Kubernetes writes them (RFC 3339, UTC), and the current time.

Why this module exists: the API's times are strings, written by the poller
(status, events, the Lease), by the sandbox's kubelet stand-ins and by the
apiserver, and read back by the poller, its metrics and the CLI. Written and
read in one place, a time one part writes is read back the same everywhere,
and a naive or malformed string is handled one way (naive means UTC;
malformed gives None). `now` is the default clock only: code whose
decisions depend on the time (the poller's cycle, the leader election)
takes its clock as an argument, so tests set it.
"""

from __future__ import annotations

import datetime as dt

__all__ = [
    "format_micro_time",
    "format_time",
    "now",
    "parse_time",
    "seconds_between",
    "timestamp",
]


def now() -> dt.datetime:
    """The current time, in UTC."""
    return dt.datetime.now(dt.UTC)


def format_time(moment: dt.datetime) -> str:
    """RFC 3339 with second precision, as Kubernetes writes times (``metav1.Time``)."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(moment: dt.datetime) -> str:
    """RFC 3339 with microseconds (``metav1.MicroTime``: a Lease's times, log stamps)."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: object) -> dt.datetime | None:
    """The inverse of `format_time` and `format_micro_time`, always with a time zone.

    None for anything but a non-empty string that is a time; a time without
    a zone is taken as UTC (Kubernetes never writes one).
    """
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def timestamp(text: object) -> float | None:
    """Seconds since the epoch of an RFC 3339 time, or None (see `parse_time`)."""
    moment = parse_time(text)
    return None if moment is None else moment.timestamp()


def seconds_between(start: str | None, end: dt.datetime) -> float:
    """Seconds from the RFC 3339 time `start` to `end`; 0.0 when `start` is unset
    or not a time (see `parse_time`)."""
    begun = parse_time(start)
    return (end - begun).total_seconds() if begun else 0.0
