"""Sharded evaluations (``python -m driver.shards``) with real lm_eval, through the driver.

The tasks are tests/driver/shardtasks (20 and 13 documents): multiple
choice (acc, acc_norm), a group of two of them (acc weighted by size,
acc_norm not), generation with two filters (exact_match, and the
corpus-level bleu and chrf), loglikelihood perplexity, rolling
loglikelihood (word and byte perplexity, bits per byte) and two-shot
multiple choice with randomly drawn examples. The model is the loopback toy
server (local-completions), which answers deterministically and counts the
requests it gets.

Shown here:

* one unsharded run and the same job as 2 and as 3 shards plus a merge give
  equal results files (results with their stderrs, groups, group_subtasks,
  configs, versions, n-shot, higher_is_better, n-samples, task_hashes, the
  config), key for key, and equal samples files line for line (so each
  document's prompt, few-shot examples included, is the unsharded run's);
  so does the job with ``--limit=0.55`` as 2 shards;
* a shard killed (SIGKILL) in the middle of its requests and started again
  sends only the requests that had not been answered, and ends with the same
  results as a shard that was never interrupted;
* a changed model_args deletes the cache (the message says model_args); a
  planted pickle in the cache is never unpickled, and its requests are sent
  again;
* each refusal exits 2 with its one line, in the driver's final marker and
  in the termination message file, before any request; the merge refuses a
  missing shard, shards of another job and a shard whose samples lost a
  document;
* (in-process, fast) the cache's JSON values keep tuples and floats exactly
  and refuse anything else, a pickle first of all.

Each lm_eval process builds lm_eval's task index first (about 6 s of CPU),
so independent evaluations run at once: the module takes about two minutes.
"""

from __future__ import annotations

import contextlib
import json
import math
import pickle
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lmeval_sandbox.model_server import ModelServer

from driver.protocol import ENV_TERMINATION_LOG, shard_merge_argv, shard_run_argv
from driver.shards import CACHE_VALUE_PREFIX, decode_value, encode_value
from tests.driver.conftest import DriverRun, driver_cmd, lm_eval_cmd
from tests.waiting import wait_for

SHARDTASKS = Path(__file__).parent / "shardtasks"
TASKS = "shard_grp,shard_gen,shard_ll,shard_roll,shard_fs"
LEAF_TASKS = ["shard_mc", "shard_mcb", "shard_gen", "shard_ll", "shard_roll", "shard_fs"]
# The results file's keys a merge computes: all must equal the unsharded run's.
COMPUTED = (
    "results",
    "groups",
    "group_subtasks",
    "configs",
    "versions",
    "n-shot",
    "higher_is_better",
    "n-samples",
    "task_hashes",
    "config",
)
COMPLETIONS = "POST /v1/completions"


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shard tasks, their data files' paths made absolute (lm_eval needs them so)."""
    directory = tmp_path_factory.mktemp("shardtasks")
    for source in SHARDTASKS.iterdir():
        text = source.read_text(encoding="utf-8").replace("__SHARDTASKS__", str(directory))
        (directory / source.name).write_text(text, encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def server() -> Iterator[ModelServer]:
    with ModelServer(generation_text="4") as srv:
        yield srv


def job_args(
    server: ModelServer, task_dir: Path, *extra: str, tasks: str = TASKS, model: str = "toy"
) -> list[str]:
    """A job's lm_eval arguments, as the poller writes them (one token per option)."""
    return [
        "--model=local-completions",
        f"--model_args={server.model_args(model=model)}",
        f"--tasks={tasks}",
        f"--include_path={task_dir}",
        "--batch_size=1",
        "--log_samples",
        *extra,
    ]


def this_python(argv: Sequence[str]) -> list[str]:
    """The contract's child argv, started with this interpreter."""
    assert argv[0] == "python"
    return [sys.executable, *argv[1:]]


def run_drivers(
    base: Path, children: Sequence[Sequence[str]], env: dict[str, str]
) -> list[DriverRun]:
    """Drivers running `children` at once, each with its own output root and termination log."""
    started = []
    with contextlib.ExitStack() as files:
        for i, child in enumerate(children):
            (base / f"driver-{i}").mkdir(parents=True, exist_ok=True)
            argv = driver_cmd(["--output-root", str(base / f"driver-{i}")], child)
            out = files.enter_context(open(base / f"driver-{i}.out", "w+b"))
            err = files.enter_context(open(base / f"driver-{i}.err", "w+b"))
            child_env = {**env, ENV_TERMINATION_LOG: str(base / f"termination-{i}")}
            proc = subprocess.Popen(argv, stdout=out, stderr=err, env=child_env)
            started.append((argv, time.monotonic(), proc, out, err))
        runs = []
        for argv, start, proc, out, err in started:
            proc.wait(timeout=300)
            elapsed = time.monotonic() - start
            out.seek(0)
            err.seek(0)
            runs.append(DriverRun(argv, proc.returncode, out.read(), err.read(), elapsed))
    return runs


def termination(base: Path, i: int = 0) -> str:
    return (base / f"termination-{i}").read_text(encoding="utf-8")


@dataclass
class Outputs:
    """The results file and samples files of a completed driver run."""

    results: dict[str, Any]
    path: Path
    samples: dict[str, list[str]]  # task -> lines of its samples file

    @classmethod
    def of(cls, run: DriverRun) -> Outputs:
        assert run.returncode == 0, run.describe()
        decoded = run.decoded()
        assert decoded.outcome is not None and decoded.outcome.event == "completed"
        assert decoded.started is not None
        (path,) = Path(decoded.started["output_dir"]).rglob("results_*.json")
        results = json.loads(path.read_text(encoding="utf-8"))
        assert decoded.results == results  # what the poller gets is the file
        date_id = path.name[len("results_") : -len(".json")]
        samples = {
            task: (path.parent / f"samples_{task}_{date_id}.jsonl")
            .read_text(encoding="utf-8")
            .splitlines()
            for task in LEAF_TASKS
        }
        return cls(results, path, samples)


@dataclass
class Sharded:
    count: int
    base: Path
    claim: Path
    shards: list[DriverRun]
    merge: DriverRun
    merged: Outputs
    messages: list[str]  # the shards' termination messages
    merge_message: str


# The jobs evaluated unsharded and sharded: name -> (extra lm_eval arguments, shard counts).
# "limited" is the same job with --limit=0.55: ceil(0.55 * 20) = 11 and ceil(0.55 * 13)
# = 8 documents per task, lm_eval's rounding of a fraction.
JOBS: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {
    "full": ((), (2, 3)),
    "limited": (("--limit=0.55",), (2,)),
}


@dataclass
class Evaluations:
    unsharded: dict[str, Outputs]  # by job
    sharded: dict[tuple[str, int], Sharded]  # by job and count


@pytest.fixture(scope="module")
def evaluations(
    server: ModelServer, task_dir: Path, lmeval_env: dict[str, str], tmp_path_factory: Any
) -> Evaluations:
    """Each job unsharded and sharded: every evaluation at once, then every merge at once."""
    base = tmp_path_factory.mktemp("evaluations")
    args = {job: job_args(server, task_dir, *extra) for job, (extra, _) in JOBS.items()}
    sharded = [(job, count) for job, (_, counts) in JOBS.items() for count in counts]
    claims = {key: base / f"claim-{key[0]}-{key[1]}" for key in sharded}
    children = [lm_eval_cmd(*args[job]) for job in JOBS]
    first: dict[tuple[str, int], int] = {}  # the index of a sharding's shard 0 in `children`
    for job, count in sharded:
        first[(job, count)] = len(children)
        children += [
            this_python(shard_run_argv(k, count, str(claims[(job, count)]), args[job]))
            for k in range(count)
        ]
    runs = run_drivers(base / "evaluate", children, lmeval_env)
    for run in runs:
        assert run.returncode == 0, run.describe()
    merges = run_drivers(
        base / "merge",
        [
            this_python(shard_merge_argv(count, str(claims[(job, count)]), args[job]))
            for job, count in sharded
        ],
        lmeval_env,
    )
    found = Evaluations({job: Outputs.of(runs[i]) for i, job in enumerate(JOBS)}, {})
    for i, ((job, count), merge) in enumerate(zip(sharded, merges, strict=True)):
        start = first[(job, count)]
        found.sharded[(job, count)] = Sharded(
            count=count,
            base=base,
            claim=claims[(job, count)],
            shards=runs[start : start + count],
            merge=merge,
            merged=Outputs.of(merge),
            messages=[termination(base / "evaluate", start + k) for k in range(count)],
            merge_message=termination(base / "merge", i),
        )
    return found


@pytest.fixture(scope="module")
def unsharded(evaluations: Evaluations) -> Outputs:
    return evaluations.unsharded["full"]


@pytest.fixture(scope="module")
def two_shards(evaluations: Evaluations) -> Sharded:
    return evaluations.sharded[("full", 2)]


@pytest.fixture(scope="module")
def three_shards(evaluations: Evaluations) -> Sharded:
    return evaluations.sharded[("full", 3)]


@pytest.mark.lmeval
@pytest.mark.parametrize("sharded_job", ["two_shards", "three_shards"])
def test_merged_results_equal_an_unsharded_runs(
    sharded_job: str, unsharded: Outputs, request: pytest.FixtureRequest
) -> None:
    sharded: Sharded = request.getfixturevalue(sharded_job)
    merged = sharded.merged.results
    expected = unsharded.results
    for key in COMPUTED:
        assert merged[key] == expected[key], key  # scores and stderrs exactly, bootstrap too
    assert list(merged) == list(expected)  # the same keys in the same order
    assert json.dumps(merged["results"]) == json.dumps(expected["results"])  # key order inside
    # Every document's row, few-shot prompt and hashes included, equals the unsharded run's.
    assert sharded.merged.samples == unsharded.samples
    # Each shard evaluated its own share (i % N == K), through --samples.
    for k, run in enumerate(sharded.shards):
        started = run.decoded().started
        assert started is not None
        shard_results = next(Path(started["output_dir"]).rglob("results_*.json"))
        n_samples = json.loads(shard_results.read_text(encoding="utf-8"))["n-samples"]
        assert n_samples["shard_mcb"] == {
            "original": 13,
            "effective": len(range(k, 13, sharded.count)),
        }


@pytest.mark.lmeval
@pytest.mark.parametrize("sharded_job", ["two_shards", "three_shards"])
def test_shards_say_what_they_did(sharded_job: str, request: pytest.FixtureRequest) -> None:
    sharded: Sharded = request.getfixturevalue(sharded_job)
    count = sharded.count
    total = 0
    for k in range(count):
        done = json.loads((sharded.claim / f"shard-{k}" / "done.json").read_text())
        assert (done["index"], done["count"], done["cached"]) == (k, count, 0)
        assert done["sent"] == done["requests"] > 0
        total += done["requests"]
        assert sharded.messages[k] == (
            f"shard {k}/{count}: {done['requests']} requests, 0 answered from the cache"
        )
        assert (sharded.claim / f"shard-{k}" / done["output"] / done["results"]).is_file()
    record = json.loads((sharded.merged.path.parent / "shards.json").read_text())
    assert [s["index"] for s in record["shards"]] == list(range(count))
    assert sharded.merge_message == (
        f"merged {count} shards: 6 tasks, 113 documents; 0 of {total} requests were answered "
        "from the shards' caches"
    )


@pytest.mark.lmeval
def test_a_limited_job_is_sharded_as_lm_eval_limits_it(evaluations: Evaluations) -> None:
    expected = evaluations.unsharded["limited"]
    merged = evaluations.sharded[("limited", 2)].merged
    for key in COMPUTED:
        assert merged.results[key] == expected.results[key], key
    assert merged.samples == expected.samples
    assert merged.results["config"]["limit"] == 0.55
    assert merged.results["n-samples"]["shard_mc"] == {"original": 20, "effective": 11}
    assert merged.results["n-samples"]["shard_mcb"] == {"original": 13, "effective": 8}


# -- a shard killed and started again ------------------------------------------------------


def cache_rows(db: Path) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM unnamed").fetchone()[0])
    except sqlite3.Error:
        return 0


@pytest.fixture(scope="module")
def slow_server() -> Iterator[ModelServer]:
    with ModelServer(generation_text="4", delay=0.05) as srv:
        yield srv


@dataclass
class Resumed:
    base: Path
    claim: Path
    rows_at_kill: int
    sent: int
    done: dict[str, Any]
    run: DriverRun
    results: dict[str, Any]  # its results file
    samples: dict[str, str]  # task -> its samples file


@pytest.fixture(scope="module")
def resumed(
    slow_server: ModelServer, task_dir: Path, lmeval_env: dict[str, str], tmp_path_factory: Any
) -> Resumed:
    base = tmp_path_factory.mktemp("resume")
    claim = base / "claim"
    child = this_python(shard_run_argv(1, 2, str(claim), job_args(slow_server, task_dir)))
    db = claim / "shard-1" / "cache" / "responses_rank0.db"
    with open(base / "killed.err", "wb") as err:
        proc = subprocess.Popen(
            [*child, "--output_path", str(base / "killed")],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**lmeval_env, ENV_TERMINATION_LOG: str(base / "killed-termination")},
        )
        try:
            wait_for(lambda: cache_rows(db) >= 25, timeout=180, what="answers in the cache")
        finally:
            proc.kill()  # SIGKILL, in the middle of the requests
            proc.wait(timeout=30)
    rows_at_kill = cache_rows(db)
    assert not (claim / "shard-1" / "done.json").exists()
    before = slow_server.count(COMPLETIONS)
    slow_server.delay = 0.0
    (run,) = run_drivers(base / "again", [child], lmeval_env)
    sent = slow_server.count(COMPLETIONS) - before
    done = json.loads((claim / "shard-1" / "done.json").read_text())
    out = claim / "shard-1" / done["output"]
    samples = {task: (out / name).read_text() for task, name in done["samples"].items()}
    return Resumed(
        base, claim, rows_at_kill, sent, done, run, shard_results(claim / "shard-1", done), samples
    )


def shard_results(shard: Path, done: dict[str, Any]) -> dict[str, Any]:
    """The results file a finished shard published (done.json names its directory)."""
    results: dict[str, Any] = json.loads((shard / done["output"] / done["results"]).read_text())
    return results


@pytest.mark.lmeval
def test_a_killed_shard_resumes_with_only_the_unanswered_requests(
    resumed: Resumed, two_shards: Sharded
) -> None:
    assert resumed.run.returncode == 0, resumed.run.describe()
    done = resumed.done
    uninterrupted = json.loads((two_shards.claim / "shard-1" / "done.json").read_text())
    assert done["requests"] == uninterrupted["requests"]
    assert 25 <= resumed.rows_at_kill < done["requests"]  # killed in the middle
    assert done["cached"] == resumed.rows_at_kill  # every answer it had got was kept
    assert done["sent"] == resumed.sent == done["requests"] - resumed.rows_at_kill
    assert done["resumed"] is True and done["started_clean"] is None
    assert termination(resumed.base / "again") == (
        f"shard 1/2: {done['requests']} requests, {resumed.rows_at_kill} answered from the "
        "cache (resumed)"
    )
    # The same results and per-document rows as the shard that was never interrupted
    # (the servers differ only in their port, which the config and task configs name).
    theirs = two_shards.claim / "shard-1" / uninterrupted["output"]
    reference = shard_results(two_shards.claim / "shard-1", uninterrupted)
    for key in ("results", "groups", "n-samples", "task_hashes", "higher_is_better"):
        assert resumed.results[key] == reference[key], key
    for task in LEAF_TASKS:
        assert resumed.samples[task] == (theirs / uninterrupted["samples"][task]).read_text()


# -- what the cache was made for, and what it holds ------------------------------------------


class Planted:
    """A pickle whose unpickling creates a file: what a tenant could plant in a cache."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


@dataclass
class Rerun:
    run: DriverRun
    done: dict[str, Any]
    sent: int  # requests the model server got
    message: str  # the termination message
    results: dict[str, Any]  # the shard's results file


@pytest.fixture(scope="module")
def reruns(
    resumed: Resumed,
    server: ModelServer,
    slow_server: ModelServer,
    task_dir: Path,
    lmeval_env: dict[str, str],
) -> dict[str, Any]:
    """The resumed shard run again, at once: against another server (so another
    model_args), and, on a copy of its claim, with every cached answer replaced by
    a pickle that would create a file."""
    base = resumed.base / "reruns"
    planted_claim = base / "planted-claim"
    shutil.copytree(resumed.claim, planted_claim)
    marker = base / "unpickled"
    payload = pickle.dumps(Planted(marker))
    pickle.loads(payload)  # proves the trap works: the file appears
    assert marker.exists()
    marker.unlink()
    db = planted_claim / "shard-1" / "cache" / "responses_rank0.db"
    with sqlite3.connect(db) as conn:
        planted = conn.execute("UPDATE unnamed SET value = ?", (payload,)).rowcount
    counts = (server.count(COMPLETIONS), slow_server.count(COMPLETIONS))
    runs = run_drivers(
        base,
        [
            this_python(shard_run_argv(1, 2, str(resumed.claim), job_args(server, task_dir))),
            this_python(shard_run_argv(1, 2, str(planted_claim), job_args(slow_server, task_dir))),
        ],
        lmeval_env,
    )
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        values = [bytes(v) for (v,) in conn.execute("SELECT value FROM unnamed")]
    reruns: dict[str, Any] = {"planted": planted, "unpickled": marker.exists(), "values": values}
    for i, (name, claim, srv) in enumerate(
        [("changed", resumed.claim, server), ("replanted", planted_claim, slow_server)]
    ):
        done = json.loads((claim / "shard-1" / "done.json").read_text())
        reruns[name] = Rerun(
            run=runs[i],
            done=done,
            sent=srv.count(COMPLETIONS) - counts[i],
            message=termination(base, i),
            results=shard_results(claim / "shard-1", done),
        )
    return reruns


@pytest.mark.lmeval
def test_a_changed_model_args_starts_clean(reruns: dict[str, Any]) -> None:
    rerun: Rerun = reruns["changed"]
    done = rerun.done
    assert rerun.run.returncode == 0, rerun.run.describe()
    assert done["cached"] == 0 and done["sent"] == rerun.sent == done["requests"]
    assert done["started_clean"] == "the cache was made for other model_args, task configs"
    assert rerun.message == (
        f"shard 1/2: {done['requests']} requests, 0 answered from the cache; "
        "the cache was made for other model_args, task configs; started clean"
    )


@pytest.mark.lmeval
def test_a_planted_pickle_is_never_unpickled_and_is_asked_again(
    reruns: dict[str, Any], resumed: Resumed
) -> None:
    rerun: Rerun = reruns["replanted"]
    done = rerun.done
    assert rerun.run.returncode == 0, rerun.run.describe()
    assert reruns["planted"] == done["requests"]  # every answer (no request repeats another)
    assert not reruns["unpickled"]
    assert done["cached"] == 0 and done["rejected"] == done["requests"]
    assert done["sent"] == rerun.sent == done["requests"]
    assert rerun.message == (
        f"shard 1/2: {done['requests']} requests, 0 answered from the cache; "
        f"{done['requests']} cached answers were not JSON and were asked again"
    )
    values = reruns["values"]
    assert len(values) == done["requests"]
    assert all(v.startswith(CACHE_VALUE_PREFIX) for v in values)  # JSON answers again
    # Asked again, the model gave the answers the resumed shard had: the same results.
    assert rerun.results["results"] == resumed.results["results"]


# -- refusals ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def refusals(
    server: ModelServer, task_dir: Path, lmeval_env: dict[str, str], tmp_path_factory: Any
) -> tuple[Path, list[tuple[str, DriverRun]], int]:
    base = tmp_path_factory.mktemp("refusals")
    cases = [
        (
            4,
            ["shard_mc", "--limit=3"],
            "task shard_mc has 3 documents (after spec.limit), fewer than the 4 shards of "
            "spec.parallelism: lower spec.parallelism to 3 or less",
        ),
        (
            2,
            ["shard_gen", "--gen_kwargs=do_sample=True"],
            "task shard_gen generates with do_sample=True: sampled answers cannot be cached, so "
            "a restarted shard could not resume them: remove do_sample from spec.genArgs (or "
            "set spec.parallelism to 1)",
        ),
        (
            2,
            ["shard_fs", "--seed=0,1234,1234,None"],
            "task shard_fs draws 2 few-shot examples at random with no few-shot seed, so the "
            "shards could not draw an unsharded run's examples: set spec.numFewShot to 0 (or "
            "spec.parallelism to 1)",
        ),
        (
            2,
            ["shard_mc", "--cache_requests=true"],
            "--cache_requests caches the built requests without the shard's document "
            "selection, so a shard would score its documents with another selection's prompts: "
            "remove it (or set spec.parallelism to 1)",
        ),
    ]
    before = server.count(COMPLETIONS)
    runs = run_drivers(
        base,
        [
            this_python(
                shard_run_argv(
                    0, count, str(base / "claim"), job_args(server, task_dir, *extra, tasks=tasks)
                )
            )
            for count, (tasks, *extra), _ in cases
        ],
        lmeval_env,
    )
    return base, [(case[2], run) for case, run in zip(cases, runs, strict=True)], before


@pytest.mark.lmeval
def test_each_refusal_is_exit_2_with_one_line(
    refusals: tuple[Path, list[tuple[str, DriverRun]], int], server: ModelServer
) -> None:
    base, runs, before = refusals
    for i, (line, run) in enumerate(runs):
        assert run.returncode == 2, run.describe()
        outcome = run.decoded().outcome
        assert outcome is not None and outcome.event == "failed" and outcome.exit_code == 2
        assert outcome.message == f"ShardingRefusedError: {line}"  # the driver's final marker
        assert termination(base, i) == line
        assert f"ShardingRefusedError: {line}" in run.err.splitlines()  # the child's stderr
    assert server.count(COMPLETIONS) == before  # nothing was evaluated
    assert not (base / "claim" / "shard-0" / "samples.json").exists()


@pytest.mark.lmeval
def test_the_merge_refuses_incomplete_foreign_or_tampered_shards(
    two_shards: Sharded,
    server: ModelServer,
    task_dir: Path,
    lmeval_env: dict[str, str],
    tmp_path: Path,
) -> None:
    missing, tampered = tmp_path / "missing", tmp_path / "tampered"
    for copy in (missing, tampered):
        shutil.copytree(two_shards.claim, copy)
    (missing / "shard-1" / "done.json").unlink()
    done = json.loads((tampered / "shard-0" / "done.json").read_text())
    rows = tampered / "shard-0" / done["output"] / done["samples"]["shard_mc"]
    rows.write_text("".join(rows.read_text().splitlines(keepends=True)[1:]))
    args = job_args(server, task_dir)
    cases = [
        (
            shard_merge_argv(2, str(missing), args),
            f"shard 1 has not finished: no done.json in {missing / 'shard-1'} (run the shard "
            "again)",
        ),
        (
            shard_merge_argv(3, str(two_shards.claim), args),
            "shard 0's outputs are those of shard 0 of 2, not of 3: run the shard again",
        ),
        (
            shard_merge_argv(2, str(two_shards.claim), job_args(server, task_dir, model="other")),
            "shard 0 was evaluated with other model_args, task configs than this merge's: run "
            "the shard again",
        ),
        (
            shard_merge_argv(2, str(tampered), args),
            "shard 0's samples of task shard_mc are not the documents it was given: run it again",
        ),
    ]
    runs = run_drivers(tmp_path / "runs", [this_python(argv) for argv, _ in cases], lmeval_env)
    for i, ((_, line), run) in enumerate(zip(cases, runs, strict=True)):
        assert run.returncode == 2, run.describe()
        outcome = run.decoded().outcome
        assert outcome is not None and outcome.message == f"ShardingRefusedError: {line}"
        assert termination(tmp_path / "runs", i) == line


# -- the cache's values, in-process ---------------------------------------------------


def test_cached_answers_are_json_that_keeps_their_types() -> None:
    answers = [
        (-7.423, False),  # loglikelihood
        -275.142,  # loglikelihood_rolling
        "4\n::lmeval::{}",  # generate_until
        float("inf"),
        [(1.5, True), {"k": ("a", None)}],
        0.1 + 0.2,  # kept to the last bit
    ]
    for answer in answers:
        encoded = encode_value(answer)
        assert encoded.startswith(CACHE_VALUE_PREFIX)
        decoded = decode_value(encoded)
        assert decoded == answer and type(decoded) is type(answer)
    assert math.isnan(decode_value(encode_value(float("nan"))))
    with pytest.raises(TypeError):
        encode_value(object())
    with pytest.raises(TypeError):
        encode_value({1: "not a string key"})


def test_anything_else_in_the_cache_is_no_answer(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    for stored in (
        pickle.dumps(Planted(marker)),  # sqlitedict's own format
        CACHE_VALUE_PREFIX + b'{"x": [1]}',  # JSON, but no tagged answer
        CACHE_VALUE_PREFIX + b"[" * 100_000,  # too deep
        CACHE_VALUE_PREFIX + b"\xff",
        "lmeval-json-1\n1",  # TEXT, not BLOB
        None,
    ):
        with pytest.raises(ValueError):
            decode_value(stored)
    assert not marker.exists()
