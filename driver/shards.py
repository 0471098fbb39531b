"""The job pod's side of a sharded evaluation: ``python -P -m driver.shards run|merge``.

Why this module exists: a job with ``spec.parallelism`` N above 1 runs as N
shard pods and one merge pod, all mounting one claim (DIR). Each pod's
driver starts this module as its lm_eval child (see
:func:`driver.contract.shard_run_argv`)::

    python -P -m driver.shards run --index=K --count=N --root=DIR -- <lm_eval args> --output_path P
    python -P -m driver.shards merge --count=N --root=DIR -- <lm_eval args> --output_path P

``run`` evaluates shard K: the documents ``i % N == K`` of every leaf task
(:mod:`driver.shardplan`), by running lm_eval's own CLI in this process with
``--samples DIR/shard-K/samples.json --log_samples --use_cache
DIR/shard-K/cache/responses`` (and without ``--limit``, which the plan
applied). In-process, so that these patches apply, to this process only:

* the response cache is **data, not code**: lm_eval's CachingLM keeps
  answers in a sqlitedict, which pickles them, and anyone who can write the
  claim could plant a pickle. Here its values are tagged JSON
  (:func:`encode_value`); a value that does not decode is a miss, asked of
  the model again, and never unpickled;
* few-shot examples drawn at random are drawn as an unsharded run draws
  them: before each of its documents, the shard replays the draws of the
  documents it skips (each task has one random generator, consumed one
  document after another), so its prompts equal an unsharded run's;
* lm_eval's ``--samples`` membership test is a list scan per document,
  O(documents x selected): a set makes it O(documents);
* lm_eval's task index (a scan of ~15,000 YAML files, most of a small
  run's start-up) is built once for the plan and the run.

lm_eval is imported by name at run time (:func:`driver.shardplan.lm_eval_module`):
this module runs only as lm_eval's child in the job image, and the rest of
the driver package must import on the standard library alone.

The cache outlives the pod: a shard that is preempted or killed and started
again sends only the requests not answered yet. ``DIR/shard-K/cache.json``
records what the cache was made for; when that changed, the cache is
deleted first. A finished shard copies its results and per-sample files to
``DIR/shard-K/out-<id>/`` and then, atomically, writes ``done.json``, which
names that directory. ``merge`` (:mod:`driver.shardmerge`) reads them.

Exit codes: 0 done; 2 refused (one line on stderr and in the container's
termination message file: what to change); otherwise lm_eval's own (1 for
an exception, as ``python -m lm_eval`` exits). On success the termination
message is a one-line summary, e.g. ``shard 2/8: 412 requests, 130 answered
from the cache (resumed)``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from driver.contract import MAX_SHARDS
from driver.run import find_results
from driver.shardplan import (
    CACHE_DIR,
    CACHE_NAME,
    CACHE_RECORD,
    DONE_FILE,
    EXIT_REFUSED,
    OUTPUT_PREFIX,
    SAMPLES_FILE,
    ShardingRefusedError,
    changed_inputs,
    check_shardable,
    digest,
    draws_first_n,
    job_inputs,
    lm_eval_module,
    load_job,
    parse_lm_eval_args,
    read_json,
    shard_dir,
    shard_samples,
    termination_message,
    write_json_atomically,
)

# -- the response cache: JSON, not pickle -------------------------------------

CACHE_VALUE_PREFIX = b"lmeval-json-1\n"
_MAX_DEPTH = 32


def _tag(value: Any, depth: int = 0) -> Any:
    """`value` as JSON that tells tuples from lists: {"t": [...]}, {"l": [...]}, {"d": {...}}."""
    if depth > _MAX_DEPTH:
        raise TypeError("nested too deep")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return _tag(value.item(), depth + 1)  # a numpy scalar
    if isinstance(value, tuple):
        return {"t": [_tag(item, depth + 1) for item in value]}
    if isinstance(value, list):
        return {"l": [_tag(item, depth + 1) for item in value]}
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {"d": {key: _tag(item, depth + 1) for key, item in value.items()}}
    raise TypeError(f"a {type(value).__name__} cannot be cached as JSON")


def _untag(value: Any, depth: int = 0) -> Any:
    if depth > _MAX_DEPTH:
        raise ValueError("nested too deep")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        ((kind, inner),) = value.items()
        if kind in ("t", "l") and isinstance(inner, list):
            items = [_untag(item, depth + 1) for item in inner]
            return tuple(items) if kind == "t" else items
        if kind == "d" and isinstance(inner, dict):
            return {key: _untag(item, depth + 1) for key, item in inner.items()}
    raise ValueError("not a cached answer")


def encode_value(value: Any) -> bytes:
    """A cached answer as bytes: a prefix, then tagged JSON (never pickle)."""
    text = json.dumps(_tag(value), separators=(",", ":"), ensure_ascii=False, allow_nan=True)
    return CACHE_VALUE_PREFIX + text.encode("utf-8")


def decode_value(data: object) -> Any:
    """The answer :func:`encode_value` wrote; ValueError for anything else (a pickle, say)."""
    if isinstance(data, memoryview | bytearray):
        data = bytes(data)
    if not isinstance(data, bytes) or not data.startswith(CACHE_VALUE_PREFIX):
        raise ValueError("not a JSON cache value")
    try:
        return _untag(json.loads(data[len(CACHE_VALUE_PREFIX) :].decode("utf-8")))
    except (UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise ValueError(f"not a JSON cache value: {exc}") from None


@dataclass
class CacheStats:
    """What the response cache answered in this process."""

    hits: int = 0  # answered from the cache
    misses: int = 0  # sent to the model
    rejected: int = 0  # present but not a JSON answer (e.g. a planted pickle): asked again
    unstorable: int = 0  # answers that are no JSON value: not cached

    def note(self, message: str) -> None:
        print(f"shards: {message}", file=sys.stderr, flush=True)


class JsonResponseCache:
    """What lm_eval's CachingLM gets as its ``dbdict``: a SqliteDict of JSON values.

    CachingLM asks ``key in cache`` and then ``cache[key]``; here a row whose
    value does not decode is not in the cache, so lm_eval asks the model
    again and overwrites it.
    """

    def __init__(self, inner: Any, stats: CacheStats) -> None:
        self._inner = inner
        self._stats = stats
        self._last: tuple[str, Any] | None = None

    def __contains__(self, key: object) -> bool:
        try:
            value = self._inner[key]
        except KeyError:
            self._stats.misses += 1
            return False
        except ValueError:
            value = None
        if value is None:  # not JSON (a planted pickle, say), or null: lm_eval never caches None
            self._stats.misses += 1
            self._stats.rejected += 1
            if self._stats.rejected == 1:
                self._stats.note("a cached answer is not JSON (not unpickled): asking again")
            return False
        self._stats.hits += 1
        self._last = (str(key), value)
        return True

    def __getitem__(self, key: str) -> Any:
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        try:
            return self._inner[key]
        except ValueError:
            raise KeyError(key) from None

    def __setitem__(self, key: str, value: Any) -> None:
        self._last = None
        try:
            self._inner[key] = value  # encoded (or refused) before anything is written
        except (TypeError, ValueError):
            self._stats.unstorable += 1

    def commit(self, blocking: bool = True) -> None:
        self._inner.commit(blocking=blocking)

    def close(self) -> None:
        self._inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _patch_response_cache(stats: CacheStats) -> None:
    """Make lm_eval's CachingLM keep JSON values in its sqlitedict (this process only)."""
    model = lm_eval_module("lm_eval.api.model")
    sqlitedict = lm_eval_module("sqlitedict")
    original_init: Callable[..., None] = model.CachingLM.__init__

    def init(self: Any, lm: Any, cache_db: str) -> None:
        original_init(self, lm, cache_db)  # opens the file with pickle values; reads none
        self.dbdict.close()
        self.dbdict = JsonResponseCache(
            sqlitedict.SqliteDict(
                cache_db, autocommit=True, encode=encode_value, decode=decode_value
            ),
            stats,
        )
        lm.set_cache_hook(self.get_cache_hook())  # the model's hook writes through it too

    model.CachingLM.__init__ = init


# -- document selection and few-shot draws ------------------------------------


class _Selection(list[int]):
    """A --samples list whose membership test is a set's (lm_eval scans it once per document)."""

    def __init__(self, items: Iterable[int]) -> None:
        super().__init__(items)
        self._members = frozenset(self)

    def __contains__(self, item: object) -> bool:
        return item in self._members


def _patch_selection_and_fewshot() -> None:
    """Fast --samples membership; few-shot draws replayed for skipped documents."""
    task_module = lm_eval_module("lm_eval.api.task")
    task_class = task_module.Task
    original_iterator: Callable[..., Any] = task_class.doc_iterator
    original_build: Callable[..., Any] = task_class.build_all_requests

    def doc_iterator(self: Any, *, samples: list[int] | None = None, **kwargs: Any) -> Any:
        if samples and not isinstance(samples, _Selection):
            samples = _Selection(samples)
        return original_iterator(self, samples=samples, **kwargs)

    def build_all_requests(self: Any, *, samples: list[int] | None = None, **kwargs: Any) -> Any:
        shots = self.config.num_fewshot or 0
        if not samples or shots <= 0 or draws_first_n(self):
            return original_build(self, samples=samples, **kwargs)
        self.fewshot_context = _replaying_fewshot_context(self, list(samples))
        try:
            return original_build(self, samples=samples, **kwargs)
        finally:
            del self.fewshot_context

    task_class.doc_iterator = doc_iterator
    task_class.build_all_requests = build_all_requests


def _replaying_fewshot_context(task: Any, selected: list[int]) -> Callable[..., Any]:
    """The task's fewshot_context for `selected` documents, in order, drawing first
    (and discarding) the few-shot examples of each document skipped before it.

    lm_eval builds requests one document after another, each drawing its
    few-shot examples from the task's one random generator: in an unsharded
    run document i gets the i-th draw. Replaying the skipped documents'
    draws, with their own arguments, consumes the generator exactly as an
    unsharded run does, so every selected document gets the examples (and
    the prompt) it gets there. Costs prompt templating, no model calls.
    """
    own = task.fewshot_context  # the bound method, before it is shadowed
    docs = task.eval_docs
    position = {"selected": 0, "next": 0}

    def fewshot_context(doc: Any, **kwargs: Any) -> Any:
        k = position["selected"]
        if k >= len(selected):
            raise RuntimeError(f"{task.task_name}: more documents than selected for this shard")
        target = selected[k]
        for skipped in range(position["next"], target):
            other = docs[skipped]
            draw_kwargs = dict(kwargs)
            if "gen_prefix" in draw_kwargs:
                draw_kwargs["gen_prefix"] = task.doc_to_prefix(other)
            own(other, **draw_kwargs)
        if docs[target] != doc:
            raise RuntimeError(
                f"{task.task_name}: few-shot replay out of step at document {target}"
            )
        position["selected"], position["next"] = k + 1, target + 1
        return own(doc, **kwargs)

    return fewshot_context


def _patch_task_index() -> None:
    """Build lm_eval's task index once for the plan and the run (it scans ~15,000 YAML files).

    The plan loads the tasks with a TaskManager of its own, then lm_eval's CLI
    makes another: the second gets a copy of the first's index, kept aside
    before lm_eval could change it.
    """
    index_module = lm_eval_module("lm_eval.tasks._index")
    original: Callable[..., Any] = index_module.TaskIndex.build
    spare: dict[tuple[tuple[str, ...], bool], Any] = {}

    def build(paths: Iterable[Any], *, resolve_includes: bool = True) -> Any:
        paths = list(paths)
        key = (tuple(str(path) for path in paths), resolve_includes)
        if key in spare:
            return spare.pop(key)
        built = original(paths, resolve_includes=resolve_includes)
        spare[key] = copy.deepcopy(built)
        return built

    index_module.TaskIndex.build = staticmethod(build)


# -- run ------------------------------------------------------------------------


def _prepare_cache(directory: str, record: dict[str, Any]) -> tuple[str | None, bool]:
    """Keep the cache if it was made for `record`, else delete it.

    Returns (why it was deleted or None, whether a cache is being reused).
    """
    cache = os.path.join(directory, CACHE_DIR)
    record_path = os.path.join(directory, CACHE_RECORD)
    has_cache = os.path.isdir(cache) and any(os.scandir(cache))
    old = read_json(record_path)
    reason: str | None = None
    if not isinstance(old, dict) or not isinstance(old.get("job"), dict):
        if has_cache:
            reason = "no record of what the cache was made for"
    elif old != record:
        changed = changed_inputs(old["job"], record["job"])
        same_share = (old.get("count"), old.get("samples_sha256")) == (
            record["count"],
            record["samples_sha256"],
        )
        if not same_share:
            changed.append("documents (spec.parallelism or the tasks' sizes)")
        reason = f"the cache was made for other {', '.join(changed) or 'inputs'}"
    if reason is not None:
        shutil.rmtree(cache, ignore_errors=True)
    done = read_json(os.path.join(directory, DONE_FILE))
    if done is not None and (not isinstance(done, dict) or done.get("inputs") != record):
        os.unlink(os.path.join(directory, DONE_FILE))
    write_json_atomically(record_path, record)
    return reason, has_cache and reason is None


def samples_files(results_path: str) -> dict[str, str]:
    """The per-sample files lm_eval wrote with `results_path`: task name -> path."""
    directory, name = os.path.split(results_path)
    date_id = name[len("results_") : -len(".json")]
    suffix = f"_{date_id}.jsonl"
    return {
        entry[len("samples_") : -len(suffix)]: os.path.join(directory, entry)
        for entry in sorted(os.listdir(directory))
        if entry.startswith("samples_") and entry.endswith(suffix)
    }


def _publish(directory: str, files: dict[str, str], done: dict[str, Any]) -> None:
    """Copy `files` (name -> source) to a new out-<id> directory, then point done.json at it."""
    staging = tempfile.mkdtemp(prefix=".tmp-out-", dir=directory)
    for name, source in files.items():
        shutil.copyfile(source, os.path.join(staging, name))
    final = os.path.join(directory, OUTPUT_PREFIX + os.path.basename(staging)[len(".tmp-out-") :])
    os.rename(staging, final)
    done = {**done, "output": os.path.basename(final)}  # the claim's mount point may differ
    write_json_atomically(os.path.join(directory, DONE_FILE), done)
    # Earlier attempts' outputs and staging; never what done.json names now (another
    # attempt of this shard may have published after this one).
    current = read_json(os.path.join(directory, DONE_FILE))
    keep = {os.path.basename(final), current.get("output") if isinstance(current, dict) else None}
    for entry in os.listdir(directory):
        if entry not in keep and entry.startswith((OUTPUT_PREFIX, ".tmp-out-")):
            shutil.rmtree(os.path.join(directory, entry), ignore_errors=True)


def run_shard(index: int, count: int, root: str, lm_args: Sequence[str]) -> int:
    """Evaluate shard `index` of `count` with the job's lm_eval arguments."""
    lm_eval_module("lm_eval.utils").setup_logging()
    args = parse_lm_eval_args(lm_args)
    _patch_task_index()
    job = load_job(args)
    check_shardable(job, count)
    directory = shard_dir(root, index)
    os.makedirs(directory, exist_ok=True)
    samples = shard_samples(job, index, count)
    samples_path = os.path.abspath(os.path.join(directory, SAMPLES_FILE))
    write_json_atomically(samples_path, samples)
    record = {
        "job": job_inputs(job),
        "index": index,
        "count": count,
        "samples_sha256": digest(samples),
    }
    cleaned, resumed = _prepare_cache(directory, record)
    documents = sum(len(v) for v in samples.values())
    print(
        f"shards: shard {index}/{count}: {documents} documents of {len(samples)} tasks"
        + (f"; {cleaned}: starting clean" if cleaned else "; resuming" if resumed else ""),
        file=sys.stderr,
        flush=True,
    )

    stats = CacheStats()
    _patch_response_cache(stats)
    _patch_selection_and_fewshot()
    namespace = args.namespace
    namespace.limit = None
    namespace.samples = samples_path
    namespace.log_samples = True
    namespace.use_cache = os.path.abspath(os.path.join(directory, CACHE_DIR, CACHE_NAME))
    started = time.time() - 1
    args.harness.execute(namespace)  # lm_eval's CLI, as `python -m lm_eval` runs it

    # The run's newest results file, written by this run (not an earlier one's).
    results_path = find_results(namespace.output_path)
    if results_path is not None and os.stat(results_path).st_mtime < started:
        results_path = None
    if results_path is None:
        print("shards: lm_eval wrote no results file", file=sys.stderr, flush=True)
        return 1
    per_task = samples_files(results_path)
    if set(per_task) != set(samples):
        missing = ", ".join(sorted(set(samples) - set(per_task))) or "none"
        print(f"shards: lm_eval wrote no samples for: {missing}", file=sys.stderr, flush=True)
        return 1
    requests = stats.hits + stats.misses
    summary = (
        f"shard {index}/{count}: {requests} requests, {stats.hits} answered from the cache"
        + (" (resumed)" if resumed and stats.hits else "")
        + (f"; {cleaned}; started clean" if cleaned else "")
        + (
            f"; {stats.rejected} cached answers were not JSON and were asked again"
            if stats.rejected
            else ""
        )
    )
    files = {os.path.basename(p): p for p in [results_path, *per_task.values()]}
    files[SAMPLES_FILE] = samples_path
    done = {
        "index": index,
        "count": count,
        "samples_sha256": record["samples_sha256"],
        "inputs": record,
        "documents": {name: len(ids) for name, ids in samples.items()},
        "requests": requests,
        "cached": stats.hits,
        "sent": stats.misses,
        "rejected": stats.rejected,
        "not_cached": stats.unstorable,
        "resumed": resumed,
        "started_clean": cleaned,
        "results": os.path.basename(results_path),
        "samples": {name: os.path.basename(path) for name, path in per_task.items()},
        "summary": summary,
        "finished": time.time(),
    }
    _publish(directory, files, done)
    print(f"shards: {summary}", file=sys.stderr, flush=True)
    termination_message(summary)
    return 0


# -- command line -------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ShardingRefusedError(f"driver.shards: {message}")


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = _Parser(prog="python -m driver.shards", add_help=False)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = commands.add_parser("run", add_help=False)
    run.add_argument("--index", type=int, required=True)
    merge = commands.add_parser("merge", add_help=False)
    for sub in (run, merge):
        sub.add_argument("--count", type=int, required=True)
        sub.add_argument("--root", required=True)
    opts = parser.parse_args(argv)
    if not 1 <= opts.count <= MAX_SHARDS:
        parser.error(f"--count must be between 1 and {MAX_SHARDS}, not {opts.count}")
    if opts.command == "run" and not 0 <= opts.index < opts.count:
        parser.error(f"--index must be between 0 and {opts.count - 1}, not {opts.index}")
    return opts


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    split = words.index("--") if "--" in words else len(words)
    own, lm_args = words[:split], words[split + 1 :]
    try:
        opts = _parse(own)
        if not lm_args:
            raise ShardingRefusedError("driver.shards: no lm_eval arguments after '--'")
        if opts.command == "run":
            return run_shard(opts.index, opts.count, opts.root, lm_args)
        from driver.shardmerge import merge_shards

        return merge_shards(opts.count, opts.root, lm_args)
    except ShardingRefusedError as refusal:
        line = " ".join(str(refusal).split())
        # The shape of a traceback's last line, which the driver reports as the failure.
        print(f"{type(refusal).__name__}: {line}", file=sys.stderr, flush=True)
        termination_message(line)
        return EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
