"""JSON from someone else, parsed with bounded work and one error type.

Why this module exists: ``json.loads`` does what its input asks. A document
nested 100,000 deep makes it recurse until ``RecursionError`` (which is not a
``ValueError``, so ``except ValueError`` lets it through), and 6 MB of
``[{},{},...]`` becomes two million dicts, about 150 MiB of Python objects
from a few KB of compressed log. Pod logs, an exec'd results file and the
``status.results`` text of a job are all written by people the poller must
not trust, so every such document goes through :func:`parse_untrusted_json`.

The limits are checked *before* ``json`` parses a document: first by four
counts that strings can only inflate (enough for a log marker, a flat
object), else exactly, by whole-buffer operations that run in C (a regular
expression that removes the strings, count, translate, accumulate). Either
way it is a few linear passes over input that is itself capped, and a
document over a limit costs no Python objects at all. The exact check is
exact for valid UTF-8 JSON: outside its strings, each ``,`` and ``:``
separates one element from the next and only brackets nest. Standard
library only (the in-pod driver imports it too).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from array import array
from dataclasses import dataclass
from typing import Any

__all__ = ["JsonLimits", "UntrustedJsonError", "parse_untrusted_json"]


class UntrustedJsonError(ValueError):
    """The document is not JSON, or is larger, deeper or wider than allowed."""


@dataclass(frozen=True)
class JsonLimits:
    """What one untrusted JSON document may cost."""

    max_bytes: int
    # Nesting of arrays and objects (a scalar at the top is depth 0).
    max_depth: int
    # Values and keys, counted as separators + containers + 1 (exact for
    # valid JSON up to empty containers, which count one more).
    max_elements: int
    # NaN, Infinity and numbers too large for a float: kept as floats, or
    # replaced by None (for values that end up in an API request body).
    finite_only: bool = False


_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
# Opening brackets step the depth up one, closing ones down one (int8 -1).
_DEPTH_STEP = bytes.maketrans(_BRACKETS, b"\x01\xff\x01\xff")
# One JSON string, escapes included (the unrolled form: no backtracking).
_STRING_RE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def _finite_or_none(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _none(_constant: str) -> None:
    return None


def _check_shape(data: bytes, limits: JsonLimits) -> None:
    """Raise unless `data` (UTF-8) nests and branches within `limits`."""
    # Everything but the strings (one copy, at most as large as `data`); the
    # count stops one past the limit, which is all that needs knowing.
    outside, strings = _STRING_RE.subn(b"", data, count=limits.max_elements + 1)
    if strings > limits.max_elements:
        raise UntrustedJsonError(f"more than {limits.max_elements} JSON elements")
    containers = outside.count(b"[") + outside.count(b"{")
    elements = outside.count(b",") + outside.count(b":") + containers + 1
    if elements > limits.max_elements:
        raise UntrustedJsonError(f"more than {limits.max_elements} JSON elements")
    steps = array("b", outside.translate(None, _NOT_BRACKETS).translate(_DEPTH_STEP))
    depth = max(itertools.accumulate(steps), default=0)
    if depth > limits.max_depth:
        raise UntrustedJsonError(f"JSON nested deeper than {limits.max_depth} levels")


# Decoders made once (json.loads with arguments makes one per call).
_DECODER = json.JSONDecoder()
_FINITE_DECODER = json.JSONDecoder(parse_constant=_none, parse_float=_finite_or_none)


def _surely_within(data: bytes, limits: JsonLimits) -> bool:
    """Whether counts that strings can only inflate already prove `data` within `limits`.

    Depth is at most the number of opening brackets, elements at most the
    separators and openings plus one, wherever they are: true of most log
    markers (a flat object), which then cost four counts instead of a scan.
    """
    opening = data.count(b"[") + data.count(b"{")
    if opening > limits.max_depth:
        return False
    return data.count(b",") + data.count(b":") + opening + 1 <= limits.max_elements


def parse_untrusted_json(raw: bytes | str, limits: JsonLimits) -> Any:
    """Parse `raw` within `limits`; raises only `UntrustedJsonError`.

    Whatever the input (invalid UTF-8, a non-UTF-8 encoding, junk, a bomb),
    the cost is bounded by `limits` and any failure is an `UntrustedJsonError`
    whose message says what was wrong.
    """
    try:
        if isinstance(raw, str):
            text = raw
            data = raw.encode("utf-8", "surrogatepass")
        else:
            data = raw
            text = None
        if len(data) > limits.max_bytes:
            raise UntrustedJsonError(f"JSON larger than {limits.max_bytes} bytes")
        if not _surely_within(data, limits):
            _check_shape(data, limits)
        if text is None:
            text = data.decode("utf-8")  # strict: the shape check assumed UTF-8
        return (_FINITE_DECODER if limits.finite_only else _DECODER).decode(text)
    except UntrustedJsonError:
        raise
    except UnicodeError:
        raise UntrustedJsonError("not UTF-8 text") from None
    except ValueError as error:  # json's own errors, and ints over Python's digit limit
        raise UntrustedJsonError(f"not valid JSON: {error}") from None
    except (RecursionError, MemoryError) as error:  # only if a limit above is too generous
        raise UntrustedJsonError(f"JSON too costly to parse ({type(error).__name__})") from None
