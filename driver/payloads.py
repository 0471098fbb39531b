"""The payload of each ``::lmeval::`` marker: its typed fields, and how a reader gets them.

Why a module of its own: :mod:`driver.protocol` is the contract and
re-exports everything here; the payload types and their reader are the
longest part of it. The types are the wire: the driver builds markers from
them, a test checks that every marker a real driver writes conforms, and the
poller reads untrusted bodies through :func:`read_fields`, which keeps only
well-typed values, so mypy checks every key that either side uses.
Standard library only.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict, TypeVar

__all__ = [
    "FinalDetails",
    "FinalFields",
    "ItemsChunkFields",
    "ProgressFields",
    "ResultsChunkFields",
    "ShardFields",
    "StartedFields",
    "TaskSourceFields",
    "read_complete_fields",
    "read_fields",
]

# What each marker carries besides ``v`` and ``event``, in the order the
# driver writes it (the order is part of the wire: tests compare bytes). The
# driver builds these; a reader gets them from `read_fields`, which keeps only
# well-typed values, so on the reading side every key may be absent.


class TaskSourceFields(TypedDict):
    """A task source cloned from Git before the run: its name and the commit checked out."""

    name: str  # the stem of its <name>.commit file (the poller's index of the source)
    commit: str  # full hash, 40 or 64 hex digits


class ShardFields(TypedDict):
    """A merged job's shard, as the merge pod's final marker reports it (provenance)."""

    index: int
    documents: int  # how many documents it evaluated, over every task
    requests: int  # the model requests its documents needed
    cached: int  # of which its response cache answered
    samples_sha256: str  # of the document indices it was given (its samples.json)
    summary: str  # its own one-line report, e.g. "shard 1/4: 412 requests, 130 ..."


class StartedFields(TypedDict):
    """``started``: the child is running; how the driver was configured."""

    run_id: str
    ts: float
    driver_version: str
    lm_eval_version: str | None
    output_dir: str
    argv: list[str]  # the child's command line, secrets redacted
    pid: int
    python: str
    progress_interval: float
    grace_period: float
    hold_seconds: float
    task_sources: NotRequired[list[TaskSourceFields]]  # with --task-sources only


class ProgressFields(TypedDict):
    """``progress``: lm_eval's newest tqdm bar (at most one per interval)."""

    run_id: str
    ts: float
    phase: str
    percent: float | None
    n: int | float
    total: int | float | None
    elapsed: float | None
    remaining: float | None
    rate: str | None


class ResultsChunkFields(TypedDict):
    """``results``: chunk `seq` of `total` of the zlib+base64 results file."""

    seq: int
    run_id: str
    total: int
    sha256: str  # of the uncompressed results
    size: int  # uncompressed bytes
    encoding: str
    data: str


class ItemsChunkFields(ResultsChunkFields):
    """``items``: chunk `seq` of `total` of the zlib+base64 per-item scores.

    The same shape as a results chunk (one encoder writes both); the payload
    is `driver.itemscores` JSON, its sha256 and size those of that JSON.
    """


class FinalDetails(TypedDict, total=False):
    """The final marker's fields that depend on how the run ended (see FinalFields)."""

    child_exit_code: int | None
    last_line: str | None  # killed by a signal: lm_eval's last words
    killed: bool  # cancelled: whether the grace period ran out
    # completed: where the results are, and whether the log carries them
    results_path: str
    results_file: str
    results_size: int
    results_sha256: str
    results_chunks: int
    results_note: str  # why results_chunks is 0
    task_sources: list[TaskSourceFields]  # with --task-sources, whatever the outcome
    # completed with --oci-push: the artifact pushed, or why the push failed
    results_artifact: str  # <registry>/<repository>@sha256:<hex>
    results_artifact_error: str
    # completed with --mlflow-tracking-uri: the run logged (its ID, 32 hex
    # digits; its page, the tracking URI's; its experiment), or why not
    mlflow_run_id: str
    mlflow_run_url: str
    mlflow_experiment_id: str
    mlflow_error: str
    # completed with per-item scores (lm_eval's samples): the `items` markers
    # sent after the results (0 when they are not in the log), the file, why not
    items_chunks: int
    items_sha256: str  # of the uncompressed driver.itemscores JSON
    items_size: int
    items_path: str
    items_note: str
    # provenance, whatever the outcome: the started marker may be out of a
    # finished log's window, so the final marker repeats what identifies the run
    driver_version: str
    lm_eval_version: str | None
    argv: list[str]  # lm_eval's command line, secrets redacted
    server_models: str  # API models: what the server's /models lists, comma-separated
    shards: list[ShardFields]  # a merge pod: what each shard of the job contributed


class FinalFields(FinalDetails):
    """``completed``, ``failed`` or ``cancelled``: exactly one per run, the last marker.

    On the wire: run_id, ts, exit_code, message, duration, signal, then the
    details. A usage error is reported before there is a run: exit_code,
    signal and message only.
    """

    run_id: NotRequired[str]
    ts: NotRequired[float]
    exit_code: int
    message: str
    duration: NotRequired[float]
    signal: int | None


_Fields = TypeVar("_Fields")
# Per payload type: each key's type, and the keys it requires.
_SHAPES: dict[object, tuple[dict[str, Any], frozenset[str]]] = {}


def _conforms(value: object, hint: Any) -> bool:
    """Whether a JSON value has the payload type `hint` (bool is no number)."""
    if hint is type(None):
        return value is None
    if hint is int:
        return type(value) is int
    if hint is float:  # JSON writes 5.0 as 5.0, but a reader need not care
        return type(value) in (int, float)
    if hint is str or hint is bool:
        return type(value) is hint
    if typing.is_typeddict(hint):
        if not isinstance(value, dict):
            return False
        hints, required = _shape(hint)
        return required.issubset(value) and all(
            _conforms(value[key], hints[key]) for key in hints if key in value
        )
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(_conforms(v, item) for v in value)
    # A union (X | None): any of its members.
    return any(_conforms(value, member) for member in typing.get_args(hint))


def _shape(kind: object) -> tuple[dict[str, Any], frozenset[str]]:
    shape = _SHAPES.get(kind)
    if shape is None:
        # __required_keys__ cannot see NotRequired in postponed annotations
        # (Python 3.11), so the required keys are read from the hints.
        marked = typing.get_type_hints(kind, include_extras=True)
        optional: frozenset[str] = getattr(kind, "__optional_keys__", frozenset())
        required = frozenset(
            key
            for key, hint in marked.items()
            if key not in optional and typing.get_origin(hint) is not NotRequired
        )
        shape = _SHAPES[kind] = (typing.get_type_hints(kind), required)
    return shape


def read_fields(body: Mapping[str, object], kind: type[_Fields]) -> _Fields:
    """The payload `kind` (one of the ``*Fields`` types) of an untrusted marker body.

    Keys whose value does not have the declared type are left out, as are
    keys the payload does not declare: whoever controls the job's pod writes
    the log, so read every key with ``.get``.
    """
    hints, _required = _shape(kind)
    kept = {key: body[key] for key in hints if key in body and _conforms(body[key], hints[key])}
    return typing.cast(_Fields, kept)


def read_complete_fields(body: Mapping[str, object], kind: type[_Fields]) -> _Fields | None:
    """Like `read_fields`, but None unless every required key is there, well typed."""
    fields = read_fields(body, kind)
    _hints, required = _shape(kind)
    return fields if required.issubset(typing.cast(Mapping[str, object], fields)) else None
