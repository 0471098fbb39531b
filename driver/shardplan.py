"""Which documents each shard of a job evaluates, and what a shard's outputs were made for.

Why this module exists: a sharded job (``spec.parallelism`` above 1) runs
the job's lm_eval command in N pods, each on every N-th document of every
task (lm_eval ``--samples``), and one merge pod that computes the job's
results from their per-sample outputs (:mod:`driver.shardmerge`). Both
sides must agree, without talking to each other, on the same documents and
the same tasks: so both read the job's lm_eval arguments with lm_eval's own
parser and configuration code, load the tasks the way ``simple_evaluate``
will (the same ``--num_fewshot``, ``--gen_kwargs`` and few-shot seed
overrides), and count each leaf task's documents after ``--limit`` the way
lm_eval's evaluator does. What cannot be sharded exactly is refused here,
before anything is evaluated, with one line that names the field to change
(:class:`ShardingRefusedError`).

It also describes what a shard's outputs and response cache were made for
(:func:`job_inputs`): a resumed shard reuses its cache only for the same
inputs, and the merge takes only shards made for the inputs it has itself.

Like :mod:`driver.shards`, this module runs only inside lm_eval's process
(the job image): it imports lm_eval by name, at run time, with
:func:`importlib.import_module`, so that the rest of the driver package, which
must run on the standard library alone, never depends on it.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import importlib
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from driver.argv import lm_eval_version
from driver.contract import ENV_TERMINATION_LOG, EXIT_SHARD_REFUSED

# Options of the job's lm_eval command that a shard cannot honour, each with why.
_REFUSED_OPTIONS: dict[str, str] = {
    "cache_requests": "--cache_requests caches the built requests without the shard's "
    "document selection, so a shard would score its documents with another selection's "
    "prompts: remove it (or set spec.parallelism to 1)",
    "samples": "--samples is how the shards select their documents: remove it "
    "(or set spec.parallelism to 1)",
    "use_cache": "--use_cache: the shards keep their own response cache on the claim: remove it "
    "(or set spec.parallelism to 1)",
    "config": "--config: the shards read lm_eval's options from its command line only: pass "
    "them as options (or set spec.parallelism to 1)",
    "wandb_args": "--wandb_args: each shard would log a part of the results: remove it "
    "(or set spec.parallelism to 1)",
    "trackio_args": "--trackio_args: each shard would log a part of the results: remove it "
    "(or set spec.parallelism to 1)",
    "hf_hub_log_args": "--hf_hub_log_args: each shard would push a part of the results: "
    "remove it (or set spec.parallelism to 1)",
}

# A refused job's exit code (argparse's, for a command line that cannot run).
EXIT_REFUSED = EXIT_SHARD_REFUSED
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
MAX_TERMINATION_MESSAGE = 512  # what status.shards[].message keeps

# A shard's directory on the claim, DIR/shard-K/: its --samples file, what its
# response cache was made for, the cache, its done record and its published outputs.
SAMPLES_FILE = "samples.json"
CACHE_RECORD = "cache.json"
CACHE_DIR = "cache"
CACHE_NAME = "responses"  # lm_eval adds _rank0.db
DONE_FILE = "done.json"
OUTPUT_PREFIX = "out-"


def shard_dir(root: str, index: int) -> str:
    return os.path.join(root, f"shard-{index}")


def termination_message(line: str) -> None:
    """Write `line` as the container's termination message (errors ignored).

    Only where Kubernetes made the file (or the environment names one): never
    creates ``/dev/termination-log`` on a machine that has none.
    """
    path = os.environ.get(ENV_TERMINATION_LOG) or DEFAULT_TERMINATION_LOG
    if path == DEFAULT_TERMINATION_LOG and not os.path.exists(path):
        return
    try:
        with open(path, "w", encoding="utf-8") as out:
            out.write(line[:MAX_TERMINATION_MESSAGE])
    except OSError:
        pass


class ShardingRefusedError(Exception):
    """A job the shards cannot evaluate exactly; the message is one line saying what to change."""


def lm_eval_module(name: str) -> Any:
    """An lm_eval module, imported at run time (lm_eval 0.4.13 has no type information)."""
    return importlib.import_module(name)


@dataclass(frozen=True)
class LmEvalArgs:
    """The job's lm_eval command, read by lm_eval's own CLI parser."""

    harness: Any  # lm_eval._cli.harness.HarnessCLI
    namespace: argparse.Namespace  # what its parser made of the arguments

    def config(self) -> Any:
        """lm_eval's EvaluatorConfig for these arguments (validated as its CLI does)."""
        evaluate_config = lm_eval_module("lm_eval.config.evaluate_config")
        # from_cli and _configure change dicts they are given: work on copies.
        fresh = argparse.Namespace(
            **{k: (v if k == "func" else copy.deepcopy(v)) for k, v in vars(self.namespace).items()}
        )
        return evaluate_config.EvaluatorConfig.from_cli(fresh)


def parse_lm_eval_args(args: Sequence[str]) -> LmEvalArgs:
    """Parse `args` (what ``python -m lm_eval`` gets) exactly as lm_eval's CLI does."""
    harness = lm_eval_module("lm_eval._cli.harness").HarnessCLI()
    saved = sys.argv
    sys.argv = ["lm-eval", *args]  # HarnessCLI.parse_args reads sys.argv, as lm_eval's entry does
    try:
        namespace: argparse.Namespace = harness.parse_args()
    finally:
        sys.argv = saved
    if getattr(namespace, "command", None) != "run":
        raise ShardingRefusedError("the shards run lm_eval's evaluation (its run command) only")
    for option, why in _REFUSED_OPTIONS.items():
        given = getattr(namespace, option, None)
        if option == "cache_requests" and isinstance(given, dict):
            given = given.get("cache_requests")  # "delete" only deletes, caches nothing
        if given:
            raise ShardingRefusedError(why)
    output_path = getattr(namespace, "output_path", None)
    if not output_path or str(output_path).endswith(".json"):
        raise ShardingRefusedError(
            "the shards need --output_path to be a directory (the driver gives it)"
        )
    return LmEvalArgs(harness, namespace)


@dataclass(frozen=True)
class TaskPlan:
    """One leaf task: its documents after --limit, and how its few-shot examples are drawn."""

    name: str
    documents: int  # evaluated by an unsharded run (after --limit)
    total: int  # in the task's evaluation split
    num_fewshot: int
    # Few-shot examples drawn at random: a shard replays the draws of the documents
    # it skips (driver.shards), so that its prompts equal an unsharded run's.
    replay_fewshot: bool

    def indices(self, index: int, count: int) -> list[int]:
        """Shard `index`'s documents of this task: those whose index modulo `count` is `index`."""
        return list(range(index, self.documents, count))


@dataclass(frozen=True)
class Job:
    """The job's configuration and its loaded tasks (as simple_evaluate will set them up)."""

    cfg: Any  # lm_eval EvaluatorConfig
    tasks: dict[str, Any]  # leaf task name -> lm_eval Task, in lm_eval's order
    groups: dict[str, Any]  # group name -> lm_eval Group
    plans: dict[str, TaskPlan]


def fewshot_seed(cfg: Any) -> int | None:
    """The few-shot seed lm_eval's CLI gives simple_evaluate (the 4th --seed value)."""
    seeds = cfg.seed
    return seeds[3] if seeds else None


def gen_kwargs(cfg: Any) -> dict[str, Any] | None:
    """--gen_kwargs as simple_evaluate applies it (None when empty)."""
    given = cfg.gen_kwargs
    if isinstance(given, str):
        given = lm_eval_module("lm_eval.utils").simple_parse_args_string(given)
    return dict(given) if given else None


def load_job(args: LmEvalArgs) -> Job:
    """Load the job's tasks as lm_eval's CLI and simple_evaluate would, and plan them."""
    cfg = args.config()
    task_manager = cfg.process_tasks(cfg.metadata)
    loaded = task_manager.load(cfg.tasks)
    tasks: dict[str, Any] = dict(loaded["tasks"])
    overrides = gen_kwargs(cfg)
    seed = fewshot_seed(cfg)
    # The overrides of lm_eval.evaluator.simple_evaluate (0.4.13), in its order.
    for task in tasks.values():
        if task.get_config("output_type") == "generate_until" and overrides is not None:
            task.set_config(key="generation_kwargs", value=overrides, update=True)
        if cfg.predict_only:
            task.override_metric(metric_name="bypass")
        if cfg.num_fewshot is not None:
            if task.get_config("num_fewshot") != 0:
                task.set_config(key="num_fewshot", value=cfg.num_fewshot)
        elif task.get_config("num_fewshot") is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=seed)
    evaluator_utils = lm_eval_module("lm_eval.evaluator_utils")
    plans: dict[str, TaskPlan] = {}
    for name, task in tasks.items():
        limit = evaluator_utils.get_sample_size(task, cfg.limit)
        # Counted with the iterator lm_eval's evaluator uses, so --limit means the same.
        documents = sum(1 for _ in task.doc_iterator(rank=0, limit=limit, world_size=1))
        shots = int(task.get_config("num_fewshot") or 0)
        plans[name] = TaskPlan(
            name=name,
            documents=documents,
            total=len(task.eval_docs),
            num_fewshot=shots,
            replay_fewshot=shots > 0 and not draws_first_n(task),
        )
    return Job(cfg, tasks, dict(loaded["groups"]), plans)


def draws_first_n(task: Any) -> bool:
    """Whether the task's few-shot examples are the first n of its pool (no random draw)."""
    samplers = lm_eval_module("lm_eval.api.samplers")
    return isinstance(getattr(task, "sampler", None), samplers.FirstNSampler)


def check_shardable(job: Job, count: int) -> None:
    """Refuse a job whose `count` shards could not give exactly an unsharded run's results."""
    task_module = lm_eval_module("lm_eval.api.task")
    for plan in job.plans.values():
        if plan.documents < count:
            limited = " (after spec.limit)" if plan.documents < plan.total else ""
            raise ShardingRefusedError(
                f"task {plan.name} has {plan.documents} documents{limited}, fewer than the "
                f"{count} shards of spec.parallelism: lower spec.parallelism to "
                f"{max(plan.documents, 1)} or less"
            )
    for name, task in job.tasks.items():
        if task.get_config("output_type") != "generate_until":
            continue
        sampling = (task.get_config("generation_kwargs") or {}).get("do_sample", False)
        if sampling:  # lm_eval's CachingLM neither caches nor replays these answers
            raise ShardingRefusedError(
                f"task {name} generates with do_sample={sampling!r}: sampled answers cannot be "
                "cached, so a restarted shard could not resume them: remove do_sample from "
                "spec.genArgs (or set spec.parallelism to 1)"
            )
    for plan in job.plans.values():
        if not plan.replay_fewshot:
            continue
        task = job.tasks[plan.name]
        if fewshot_seed(job.cfg) is None:
            raise ShardingRefusedError(
                f"task {plan.name} draws {plan.num_fewshot} few-shot examples at random with no "
                "few-shot seed, so the shards could not draw an unsharded run's examples: set "
                "spec.numFewShot to 0 (or spec.parallelism to 1)"
            )
        if type(task).build_all_requests is not task_module.Task.build_all_requests:
            raise ShardingRefusedError(
                f"task {plan.name} draws {plan.num_fewshot} few-shot examples at random and "
                "builds its own requests, so the shards could not draw an unsharded run's "
                "examples: set spec.numFewShot to 0 (or spec.parallelism to 1)"
            )


def shard_samples(job: Job, index: int, count: int) -> dict[str, list[int]]:
    """Shard `index`'s --samples: sorted, unique indices for every leaf task, none empty."""
    return {name: plan.indices(index, count) for name, plan in job.plans.items()}


def canonical(value: Any) -> Any:
    """`value` as JSON would give it back (tuples as lists, other objects as str)."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def digest(value: Any) -> str:
    return hashlib.sha256(
        json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    ).hexdigest()


# What a shard's outputs and response cache depend on, with the words that name each.
INPUT_LABELS: dict[str, str] = {
    "lm_eval_version": "lm_eval version",
    "model": "model",
    "model_args": "model_args",
    "tasks": "tasks",
    "task_versions": "task versions",
    "task_configs": "task configs",
    "num_fewshot": "num_fewshot",
    "seeds": "seeds",
    "gen_kwargs": "gen_kwargs",
    "apply_chat_template": "chat template",
    "fewshot_as_multiturn": "fewshot_as_multiturn",
    "system_instruction": "system instruction",
    "limit": "limit",
    "predict_only": "predict_only",
}


def task_config_digest(task: Any) -> str:
    """The digest of the task's configuration, without where its YAML was read.

    lm_eval records the file in ``metadata.config_source``; a kubelet's
    ConfigMap volume holds it in a directory named for the moment the pod
    started (``..2026_12_04_21_43_36.1583914170/``), other in every pod, so
    with it no two shards (nor a shard's attempts, nor the merge) would agree.
    """
    config = task.dump_config()
    metadata = config.get("metadata")
    if isinstance(metadata, dict) and "config_source" in metadata:
        kept = {key: value for key, value in metadata.items() if key != "config_source"}
        config = {**config, "metadata": kept}
    return digest(config)


def job_inputs(job: Job) -> dict[str, Any]:
    """What every shard of the job evaluates with: equal for all its shards and its merge."""
    cfg = job.cfg
    inputs: dict[str, Any] = canonical(
        {
            "lm_eval_version": lm_eval_version(),
            "model": cfg.model,
            "model_args": cfg.model_args,
            "tasks": cfg.tasks,
            "task_versions": {name: task.VERSION for name, task in job.tasks.items()},
            "task_configs": {name: task_config_digest(task) for name, task in job.tasks.items()},
            "num_fewshot": {name: plan.num_fewshot for name, plan in job.plans.items()},
            "seeds": cfg.seed,
            "gen_kwargs": cfg.gen_kwargs,
            "apply_chat_template": cfg.apply_chat_template,
            "fewshot_as_multiturn": cfg.fewshot_as_multiturn,
            "system_instruction": cfg.system_instruction,
            "limit": cfg.limit,
            "predict_only": cfg.predict_only,
        }
    )
    return inputs


def changed_inputs(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The names of the inputs that differ between two :func:`job_inputs` records."""
    keys = list(INPUT_LABELS) + sorted((set(old) | set(new)) - set(INPUT_LABELS))
    return [INPUT_LABELS.get(key, key) for key in keys if old.get(key) != new.get(key)]


def write_json_atomically(path: str, value: Any) -> None:
    """Write `value` to `path` as JSON through a temporary file and a rename."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(value, out, indent=1, ensure_ascii=False)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_json(path: str) -> Any:
    """The JSON in `path`, or None when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
