"""The provenance of a run: what identifies it, read from its pod, its log and its results.

Why a module of its own: a score means something only with what produced it
(the image the kubelet actually ran, lm_eval's and the driver's versions, the
command line, the model, the seeds, a hash of every task's documents and
prompts), and two runs can be compared only when those agree. The poller
gathers them once, when a job finishes, into a short record in status
(`Provenance.status_fields`, status.provenance) and a full one stored beside
the results (`Provenance.document`, the results ConfigMap's provenance.json).

Everything here but the kubelet's image fields is written by whoever
controls the job: the driver's markers and lm_eval's results JSON come from
the pod's log. So a value is kept only when it has the expected type, every
string and collection is bounded (a value over its bound is left out, never
cut into something that looks whole), text with control characters is left
out, and secrets are never copied: of lm_eval's model_args (which may hold
base_url, api keys, headers) only the model's name is read, and the argv is
redacted again here although the driver redacted it. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from math import isfinite
from typing import Any

from driver.decoder import Outcome
from driver.protocol import (
    MAX_TASKS,
    ItemScores,
    ShardFields,
    StartedFields,
    read_fields,
    redact_argv,
    redact_text,
)
from poller import api

__all__ = [
    "DOCUMENT_MAX_BYTES",
    "FORMAT_VERSION",
    "STATUS_ARGV_CHARS",
    "Provenance",
    "build",
]

FORMAT_VERSION = 1
# provenance.json: at most this many bytes (tasks past it are counted, not listed).
DOCUMENT_MAX_BYTES = 128 * 1024
# Words of argv kept in provenance.json (the driver's started marker bounds
# its argv to a few KB; lm_eval's command line is a few dozen words).
DOCUMENT_ARGV_MAX = 512
# status.provenance.argv: at most this many characters (then one word saying how many more).
STATUS_ARGV_CHARS = 4096
_TEXT_MAX = api.PROVENANCE_TEXT_MAX
_HASH_MAX = api.PROVENANCE_HASH_MAX
_SEEDS = (("random", "random_seed"), ("numpy", "numpy_seed"), ("torch", "torch_seed"),
          ("fewshot", "fewshot_seed"))  # fmt: skip
# model_args keys naming the model, in lm_eval's order of preference (its
# GeneralConfigTracker also reads peft/delta/path/engine; the issue asks for these).
_MODEL_NAME_KEYS = ("pretrained", "model")
_INT64 = 2**63


def _text(value: object, limit: int = _TEXT_MAX) -> str | None:
    """`value` if it is a non-empty string of at most `limit` printable characters."""
    if not isinstance(value, str) or not value or len(value) > limit:
        return None
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return None
    return value


def _hex(value: object) -> str | None:
    text = _text(value, _HASH_MAX)
    return text if text is not None and all(c in "0123456789abcdef" for c in text) else None


def _int(value: object) -> int | None:
    if type(value) is int and -_INT64 <= value < _INT64:
        return value
    return None


def _count(value: object) -> int | None:
    number = _int(value)
    return number if number is not None and number >= 0 else None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _cut(word: str) -> str:
    """`word` shortened to api.PROVENANCE_ARG_MAX characters before it is redacted.

    Cut at the last separator of key=value pairs and URLs (",", "&", ";",
    whitespace) that leaves room for the note, so that no secret is cut in
    half (half a password does not look like one to the redaction). Cut
    first because redacting tens of KB of hostile text costs seconds.
    """
    limit = api.PROVENANCE_ARG_MAX
    if len(word) <= limit:
        return word
    more = f"... ({len(word)} characters)"
    head = word[: limit - len(more)]
    cut = max(head.rfind(sep) for sep in ", &;\t")
    return (head[:cut] if cut > 0 else "") + more


def _printable(word: str) -> str:
    """One redacted argv word: printable, and within api.PROVENANCE_ARG_MAX after all."""
    word = "".join(c if ord(c) >= 0x20 and ord(c) != 0x7F else "\ufffd" for c in word)
    # Redaction may lengthen a cut word ("k=v" -> "k=***"): then only its length.
    return word if len(word) <= api.PROVENANCE_ARG_MAX else f"({len(word)} characters)"


def model_name(model_args: object) -> str | None:
    """The pretrained= (or model=) value of lm_eval's model_args (a string or a dict).

    Nothing else of model_args is read: it may hold base_url, keys, headers.
    URL credentials and key=value secrets inside the name are redacted.
    """
    pairs: dict[str, object] = {}
    if isinstance(model_args, dict):
        pairs = {str(k): v for k, v in model_args.items()}
    elif isinstance(model_args, str) and len(model_args) <= 64 * 1024:
        for part in model_args.split(","):
            key, eq, value = part.partition("=")
            if eq and key.strip() not in pairs:
                pairs[key.strip()] = value.strip()
    for key in _MODEL_NAME_KEYS:
        name = _text(pairs.get(key))
        if name is not None:
            return _text(redact_text(name))  # bounded again: "k=v" may grow to "k=***"
    return None


def _task_entry(
    name: str, document: Mapping[str, Any], hashes: Mapping[str, str], items: ItemScores | None
) -> dict[str, Any]:
    """provenance.json's entry of one task: what lm_eval reports of it, well-typed only."""
    entry: dict[str, Any] = {}
    version = _mapping(document.get("versions")).get(name)
    if isinstance(version, int | float) and not isinstance(version, bool):
        finite = _int(version) is not None or (isinstance(version, float) and isfinite(version))
        entry["version"] = version if finite else None  # NaN and Infinity are not JSON
    elif _text(version) is not None:
        entry["version"] = version
    shots = _int(_mapping(document.get("n-shot")).get(name))
    if shots is not None:
        entry["nShot"] = shots
    config = _mapping(_mapping(document.get("configs")).get(name))
    dataset = {
        "datasetPath": _text(config.get("dataset_path")),
        "datasetName": _text(config.get("dataset_name")),
        "datasetRevision": _text(_mapping(config.get("dataset_kwargs")).get("revision")),
    }
    # Redacted: a dataset path may be a URL with credentials.
    entry.update({k: _text(redact_text(v)) for k, v in dataset.items() if v is not None})
    if name in hashes:
        entry["hash"] = hashes[name]
    task = items.tasks.get(name) if items is not None else None
    if task is not None:
        entry.update(docsSha256=task.docs_sha256, items=len(task.doc_ids))
    return {k: v for k, v in entry.items() if v is not None}


@dataclass(frozen=True)
class Provenance:
    """A run's provenance, every value checked (see `build`)."""

    driver_version: str | None = None
    lm_eval_version: str | None = None
    image: str | None = None
    image_id: str | None = None
    model: str | None = None
    model_name: str | None = None
    server_models: str | None = None
    seeds: Mapping[str, int] = field(default_factory=dict)
    task_hashes: Mapping[str, str] = field(default_factory=dict)
    argv: tuple[str, ...] = ()
    # provenance.json only: per-task details, and what the model server said.
    tasks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    server: Mapping[str, str] = field(default_factory=dict)
    # provenance.json only, for a merged job (spec.parallelism): one record per shard.
    shards: tuple[Mapping[str, Any], ...] = ()

    def _common(self) -> dict[str, Any]:
        return {
            "driver_version": self.driver_version,
            "lm_eval_version": self.lm_eval_version,
            "image": self.image,
            "image_id": self.image_id,
            "model": self.model,
            "model_name": self.model_name,
            "server_models": self.server_models,
        }

    def status_fields(self) -> dict[str, Any] | None:
        """status.provenance (snake_case, as `api.Provenance` takes it); None: nothing known.

        Short: task hashes of the first api.PROVENANCE_TASK_HASHES_MAX tasks in
        name order (taskHashesOmitted counts the others), argv up to
        STATUS_ARGV_CHARS characters (then a last word saying how many more).
        """
        fields = {k: v for k, v in self._common().items() if v is not None}
        if self.seeds:
            fields["seeds"] = dict(self.seeds)
        if self.task_hashes:
            names = sorted(self.task_hashes)
            kept = names[: api.PROVENANCE_TASK_HASHES_MAX]
            fields["task_hashes"] = {name: self.task_hashes[name] for name in kept}
            if len(names) > len(kept):
                fields["task_hashes_omitted"] = len(names) - len(kept)
        if self.argv:
            argv: list[str] = []
            size = 0
            for word in self.argv:
                if len(argv) == api.PROVENANCE_ARGV_MAX - 1 or size + len(word) > STATUS_ARGV_CHARS:
                    argv.append(f"... ({len(self.argv) - len(argv)} more words: provenance.json)")
                    break
                argv.append(word)
                size += len(word)
            fields["argv"] = argv
        return fields or None

    def document(self) -> str:
        """provenance.json: the full record, camelCase, at most DOCUMENT_MAX_BYTES.

        Tasks are listed in name order while they fit; ``tasksOmitted`` counts
        the rest (their hashes too are then only in the results' task_hashes).
        """
        head: dict[str, Any] = {"format": FORMAT_VERSION}
        for key, value in self._common().items():
            if value is not None:
                head[_camel(key)] = value
        head["imageID"] = head.pop("imageId", None)
        head = {k: v for k, v in head.items() if v is not None}
        if self.seeds:
            head["seeds"] = dict(self.seeds)
        if self.server:
            head["server"] = dict(self.server)
        head["argv"] = list(self.argv)
        if self.shards:
            head["shards"] = [dict(shard) for shard in self.shards]
        tasks: dict[str, Any] = {}
        hashes: dict[str, str] = {}
        document = {**head, "taskHashes": hashes, "tasks": tasks}
        size = len(_dumps(document).encode()) + len('"tasksOmitted":99999,')
        names = sorted(self.tasks)
        for index, name in enumerate(names):
            entry = self.tasks[name]
            cost = len(_dumps({name: entry}).encode()) + 1
            if name in self.task_hashes:
                cost += len(_dumps({name: self.task_hashes[name]}).encode()) + 1
            if size + cost > DOCUMENT_MAX_BYTES:
                document["tasksOmitted"] = len(names) - index
                break
            tasks[name] = entry
            if name in self.task_hashes:
                hashes[name] = self.task_hashes[name]
            size += cost
        return _dumps(document)


def _camel(snake: str) -> str:
    first, *rest = snake.split("_")
    return first + "".join(word.title() for word in rest)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def build(
    *,
    outcome: Outcome | None,
    started: Mapping[str, Any] | None,
    results: Mapping[str, Any] | None,
    image: str = "",
    image_id: str = "",
    items: ItemScores | None = None,
) -> Provenance:
    """The provenance of a run from what the poller read of it.

    `outcome` is the driver's final marker, `started` its started marker (the
    fallback for the versions and argv when the final marker lacks them),
    `results` lm_eval's results JSON, `image` and `image_id` the main
    container's as the kubelet reports them, `items` the decoded per-item
    scores (their docs digests and the model server's identity). Any of them
    may be missing; whatever is malformed is left out.
    """
    first: Mapping[str, Any] = read_fields(started, StartedFields) if started else {}
    document: Mapping[str, Any] = results or {}
    config = _mapping(document.get("config"))
    driver_version = _text(outcome.driver_version if outcome else None) or _text(
        first.get("driver_version")
    )
    lm_eval_version = (
        _text(outcome.lm_eval_version if outcome else None)
        or _text(first.get("lm_eval_version"))
        or _text(document.get("lm_eval_version"))
    )
    words = list(outcome.argv) if outcome and outcome.argv else list(first.get("argv") or [])
    words = [w for w in words[:DOCUMENT_ARGV_MAX] if isinstance(w, str)]
    argv = tuple(_printable(word) for word in redact_argv([_cut(word) for word in words]))
    seeds = {name: _int(config.get(key)) for name, key in _SEEDS}
    hashes: dict[str, str] = {}
    for name, value in list(_mapping(document.get("task_hashes")).items())[:MAX_TASKS]:
        task, digest = _text(name), _hex(value)
        if task is not None and digest is not None:
            hashes[task] = digest
    names: set[str] = set(hashes)
    for section in ("results", "versions", "n-shot", "configs"):
        names.update(n for n in list(_mapping(document.get(section)))[:MAX_TASKS] if _text(n))
    if items is not None:
        names.update(n for n in items.tasks if _text(n))
    tasks = {name: _task_entry(name, document, hashes, items) for name in sorted(names)[:MAX_TASKS]}
    server = {}
    if items is not None:
        server = {k: v for k, v in items.server.items() if _text(k) and _text(v)}
    return Provenance(
        driver_version=driver_version,
        lm_eval_version=lm_eval_version,
        image=_text(image),
        image_id=_text(image_id),
        model=_text(config.get("model")),
        model_name=model_name(config.get("model_args")),
        server_models=_text(outcome.server_models if outcome else None),
        seeds={name: seed for name, seed in seeds.items() if seed is not None},
        task_hashes=hashes,
        argv=argv,
        tasks=tasks,
        server=server,
        shards=tuple(_shard_entry(shard) for shard in (outcome.shards if outcome else ())),
    )


def _shard_entry(shard: ShardFields) -> dict[str, Any]:
    """A shard's record as the merge pod reported it, each value checked (the
    pod writes it): its index, documents, requests, how many its cache
    answered, the digest of its documents and its own one-line report."""
    entry = {
        "index": _count(shard.get("index")),
        "documents": _count(shard.get("documents")),
        "requests": _count(shard.get("requests")),
        "cached": _count(shard.get("cached")),
        "samplesSha256": _hex(shard.get("samples_sha256")),
        "summary": _text(shard.get("summary")),
    }
    return {key: value for key, value in entry.items() if value is not None}
