"""What identifies a run, repeated in its final marker; and what the model server says it serves.

Why a module of its own: a finished job's log window may no longer hold the
``started`` marker, so the final marker repeats the driver's and lm_eval's
versions and the (redacted) command line; for an API model it adds the ids
the model server lists at its ``/models`` endpoint, which name what really
answered (a ``model=`` argument is only what was asked for). The listing is
best effort: one GET with a short timeout, the trust the evaluation has
(the job's CA bundle, driver.trust), and any failure is a note in the log,
never a failed run. Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # json, ssl and urllib are imported when used: the driver
    # reads task sources (below) before lm_eval starts, and starts fast
    from driver.child import Sink
    from driver.payloads import FinalDetails, ShardFields, StartedFields, TaskSourceFields

__all__ = [
    "MAX_MODELS_BYTES",
    "MAX_SERVER_MODELS_CHARS",
    "TIMEOUT",
    "fetch_server_models",
    "final_provenance",
    "model_base_url",
    "models_url",
    "read_task_sources",
    "server_models",
]

TIMEOUT = 5.0
# A models listing is a few hundred bytes per model; more is not read.
MAX_MODELS_BYTES = 1024 * 1024
# What the final marker carries (driver.itemscores keeps 512 per server field).
MAX_SERVER_MODELS_CHARS = 512
_MODEL_ARGS_FLAGS = ("--model_args", "--model-args", "-a")


_COMMIT_SUFFIX = ".commit"
_COMMIT_CHARS = frozenset("0123456789abcdef")
# A name is a file's stem (the poller writes indices); the markers stay small.
_MAX_TASK_SOURCES = 64


def read_task_sources(directory: str) -> list[TaskSourceFields] | str:
    """The commit of each ``<name>.commit`` file in `directory`, by name; or why not."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(_COMMIT_SUFFIX))
    except OSError as exc:
        return f"cannot read the task sources in {directory}: {exc}"
    if len(names) > _MAX_TASK_SOURCES:
        return f"{len(names)} task sources in {directory}, at most {_MAX_TASK_SOURCES}"
    sources: list[TaskSourceFields] = []
    for name in names:
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as fh:
                text = fh.read(200).decode("ascii", "replace").strip()
        except OSError as exc:
            return f"cannot read {path}: {exc}"
        if len(text) not in (40, 64) or not _COMMIT_CHARS.issuperset(text):
            return f"{path} holds no full commit hash: {text[:80]!r}"
        stem = name[: -len(_COMMIT_SUFFIX)][:64]
        sources.append({"name": stem, "commit": text})
    return sources


def _model_args_tokens(argv: Sequence[str]) -> list[str]:
    tokens: list[str] = []
    taking = False
    for token in argv:
        flag, eq, value = token.partition("=")
        if flag in _MODEL_ARGS_FLAGS[:2] and eq:
            tokens.append(value)
            taking = False
        elif token in _MODEL_ARGS_FLAGS:
            taking = True
        elif taking and not token.startswith("-"):
            tokens.append(token)
        else:
            taking = False
    return tokens


def model_base_url(argv: Sequence[str]) -> str | None:
    """The ``base_url`` of lm_eval's ``--model_args`` (``k=v,k=v`` tokens or JSON), if any."""
    import json

    for token in _model_args_tokens(argv):
        text = token.strip()
        if text.startswith("{"):
            try:
                parsed = json.loads(text)
            except ValueError:
                continue
            value = parsed.get("base_url") if isinstance(parsed, dict) else None
            if isinstance(value, str) and value:
                return value
            continue
        for pair in text.split(","):
            key, eq, value = pair.partition("=")
            if eq and key.strip() == "base_url" and value:
                return value.strip()
    return None


def models_url(base_url: str) -> str | None:
    """The server's models listing: `base_url` with its endpoint replaced by ``models``.

    ``.../v1/completions`` and ``.../v1/chat/completions`` both give
    ``.../v1/models`` (OpenAI's layout, which vLLM, TGI and llama.cpp follow).
    """
    import urllib.parse

    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    path = parts.path.rstrip("/")
    if path.endswith("/chat/completions"):
        path = path[: -len("/chat/completions")]
    else:
        path = path.rsplit("/", 1)[0]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path + "/models", "", ""))


def _shown(url: str) -> str:
    """`url` fit for a log line: no user or password, bounded."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))[:200]


def fetch_server_models(url: str, cafile: str | None, api_key: str | None) -> str:
    """The model ids `url` lists, comma-separated; raises OSError or ValueError."""
    import ssl
    import urllib.request

    context = ssl.create_default_context(cafile=cafile) if url.startswith("https:") else None
    request = urllib.request.Request(url, headers={"Accept": "application/json"})  # noqa: S310
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(request, timeout=TIMEOUT, context=context) as response:  # noqa: S310
        body = response.read(MAX_MODELS_BYTES + 1)
    if len(body) > MAX_MODELS_BYTES:
        raise ValueError(f"the listing is longer than {MAX_MODELS_BYTES} bytes")
    from driver.boundedjson import JsonLimits, parse_untrusted_json

    parsed = parse_untrusted_json(body, JsonLimits(MAX_MODELS_BYTES, 16, 100_000))
    data = parsed.get("data") if isinstance(parsed, dict) else None
    if not isinstance(data, list):
        raise ValueError("the listing has no 'data' list")
    ids = [str(m["id"]) for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
    if not ids:
        raise ValueError("the listing names no model")
    text = ",".join(ids)
    if len(text) > MAX_SERVER_MODELS_CHARS:
        text = text[: MAX_SERVER_MODELS_CHARS - 3] + "..."
    return text


def server_models(argv: Sequence[str], env: Mapping[str, str], sink: Sink) -> str:
    """The server's model ids, comma-separated; "" for a local model or a failure (noted).

    `env` is the child's environment: its ``SSL_CERT_FILE`` is the combined
    CA bundle when the job names one, and ``OPENAI_API_KEY`` the key lm_eval
    sends.
    """
    base = model_base_url(argv)
    if base is None:
        return ""
    url = models_url(base)
    if url is None:
        sink.note(f"server models: cannot derive a models URL from base_url {_shown(base)!r}")
        return ""
    try:
        return fetch_server_models(url, env.get("SSL_CERT_FILE"), env.get("OPENAI_API_KEY"))
    except Exception as exc:  # best effort: any failure is only a note
        sink.note(f"server models: GET {_shown(url)} failed: {type(exc).__name__}: {exc}"[:500])
        return ""


def final_provenance(
    started: StartedFields | None, child_argv: Sequence[str], models: str | None
) -> FinalDetails:
    """The final marker's provenance: the started marker's, or the driver's own before a start."""
    from driver import __version__
    from driver.argv import lm_eval_version, redact_argv
    from driver.protocol import bounded_argv

    details: FinalDetails = {
        "driver_version": __version__,
        "lm_eval_version": started["lm_eval_version"] if started else lm_eval_version(),
        "argv": started["argv"] if started else bounded_argv(redact_argv(child_argv)),
    }
    if models:
        details["server_models"] = models
    return details


# shards.json is the merge's own record, read back whole: far below this.
_SHARDS_RECORD_MAX = 256 * 1024
# Each shard's summary in the final marker: 32 shards stay a third of a marker.
_SHARD_SUMMARY_CHARS = 200


def shard_records(results_file: str) -> list[ShardFields]:
    """What each shard contributed to a merged results file (the ``shards.json``
    beside it, `driver.shardmerge`); [] for an unsharded run or an unreadable record."""
    import json

    from driver.contract import MAX_SHARDS, SHARDS_RECORD

    path = os.path.join(os.path.dirname(results_file), SHARDS_RECORD)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_SHARDS_RECORD_MAX + 1)
        record = json.loads(raw) if len(raw) <= _SHARDS_RECORD_MAX else None
    except (OSError, ValueError):
        return []
    listed = record.get("shards") if isinstance(record, dict) else None
    shards: list[ShardFields] = []
    for entry in (listed if isinstance(listed, list) else [])[:MAX_SHARDS]:
        if not isinstance(entry, dict):
            continue
        documents = entry.get("documents")
        count = (
            sum(v for v in documents.values() if isinstance(v, int))
            if isinstance(documents, dict)
            else 0
        )
        shards.append(
            {
                "index": _count(entry.get("index")),
                "documents": count,
                "requests": _count(entry.get("requests")),
                "cached": _count(entry.get("cached")),
                "samples_sha256": str(entry.get("samples_sha256") or "")[:64],
                "summary": str(entry.get("shard_summary") or "")[:_SHARD_SUMMARY_CHARS],
            }
        )
    return shards


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
