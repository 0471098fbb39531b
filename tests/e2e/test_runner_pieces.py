"""The pure pieces of the sandbox's local pod runner and of the run command.

No cluster: how container paths become local paths (mount paths, their
parent directories, never URLs or unrelated absolute paths), Kubernetes'
``$(VAR)`` expansion, the container argv as a local command line, the
kubelet's FallbackToLogsOnError message, the samples (no placement, as on a
real cluster) and how the sandbox points their placeholder model server at
its toy server, the results table's rows, and how the
run command follows a job through the CLI's follower (a scripted cluster).
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from lmeval_sandbox import demo
from lmeval_sandbox.bringup import DemoError
from lmeval_sandbox.runner import (
    PathMapper,
    expand_vars,
    local_argv,
    termination_message,
)
from rich.console import Console

from poller import api

ROOT = Path("/w/pods/ns/p-1/root")
MOUNTS = ["/tmp", "/cache/huggingface", "/outputs", "/opt/lmeval/tasks/my-tasks"]


def test_mount_paths_and_their_parents_are_mapped() -> None:
    mapper = PathMapper(ROOT, MOUNTS)
    assert mapper.local("/outputs") == f"{ROOT}/outputs"
    assert mapper.local("/outputs/run-1/x.json") == f"{ROOT}/outputs/run-1/x.json"
    assert mapper.local("/opt/lmeval/tasks") == f"{ROOT}/opt/lmeval/tasks"
    assert mapper.local("/opt/lmeval/tasks/my-tasks/a.jsonl") == (
        f"{ROOT}/opt/lmeval/tasks/my-tasks/a.jsonl"
    )
    # Not provided by a volume: it would come from the image.
    for path in ("/usr/bin/python", "/opt/lmeval/tasks/other/a.yaml", "/outputsx", "/", "/opt/x"):
        assert mapper.local(path) == path


def test_rewrite_finds_paths_inside_text() -> None:
    mapper = PathMapper(ROOT, MOUNTS)
    assert mapper.rewrite("--output-root=/outputs") == f"--output-root={ROOT}/outputs"
    assert mapper.rewrite("--include_path=/opt/lmeval/tasks") == (
        f"--include_path={ROOT}/opt/lmeval/tasks"
    )
    task = "data_files:\n  test: /opt/lmeval/tasks/my-tasks/d.jsonl\n"
    local = f"{ROOT}/opt/lmeval/tasks/my-tasks/d.jsonl"
    assert mapper.rewrite(task) == f"data_files:\n  test: {local}\n"
    url = "base_url=http://127.0.0.1:8765/v1/completions,tokenizer_backend=remote"
    assert mapper.rewrite(url) == url
    assert mapper.rewrite("x/tmp/y and /tmpfoo") == "x/tmp/y and /tmpfoo"


def test_expand_vars_like_kubernetes() -> None:
    env = {"HOME": "/tmp", "N": "3"}
    assert expand_vars("$(HOME)/x-$(N)", env) == "/tmp/x-3"
    assert expand_vars("$(MISSING) $$(HOME) $$", env) == "$(MISSING) $(HOME) $"


def test_local_argv_uses_this_interpreter() -> None:
    mapper = PathMapper(ROOT, MOUNTS)
    argv = local_argv(
        ["lmeval-driver", "--output-root=/outputs", "--", "python", "-m", "lm_eval", "--x=python"],
        mapper,
        sys.executable,
    )
    assert argv == [
        sys.executable,
        "-m",
        "driver",
        f"--output-root={ROOT}/outputs",
        "--",
        sys.executable,
        "-m",
        "lm_eval",
        "--x=python",
    ]
    assert local_argv(["python3", "-m", "driver"], mapper, "/py")[0] == "/py"


def test_termination_message_keeps_the_tail() -> None:
    lines = [f"line {i}" for i in range(200)]
    message = termination_message(lines)
    assert message.endswith("line 199") and "line 119" not in message
    assert len(message.encode()) <= 2048
    assert termination_message(["x" * 5000]) == "x" * 2048


def test_samples_run_anywhere_and_the_sandbox_points_them_at_its_server() -> None:
    for name in demo.SAMPLES:
        written = yaml.safe_load_all(demo.SAMPLES[name].read_text())
        job = next(d for d in written if d and d["kind"] == api.KIND)
        spec = api.LMEvalJobSpec.model_validate(job["spec"])  # the poller accepts it
        # Written for a real cluster: no placement (the sandbox's node is untainted).
        assert spec.pod is None, name
        assert [c.config_map for c in spec.custom_tasks or []] == ["lmeval-sample-tasks"]
    served = demo.sample_documents("served-model", 41234)
    args = next(d for d in served if d["kind"] == api.KIND)["spec"]["modelArgs"]
    assert {"name": "base_url", "value": "http://127.0.0.1:41234/v1/completions"} in args
    assert {"name": "model", "value": demo.TOY_MODEL} in args
    chat = demo.sample_documents("chat-model", 41234)
    args = next(d for d in chat if d["kind"] == api.KIND)["spec"]["modelArgs"]
    assert {"name": "base_url", "value": "http://127.0.0.1:41234/v1/chat/completions"} in args
    # Only the placeholder is rewritten: a user's own server stays as written.
    own = [{"name": "base_url", "value": "http://vllm.team.svc:8000/v1/completions"}]
    demo._to_toy_server({"modelArgs": own}, 41234)
    assert own[0]["value"] == "http://vllm.team.svc:8000/v1/completions"


def test_sample_task_files_use_absolute_in_pod_paths() -> None:
    configmap = yaml.safe_load(demo.TASKS_FILE.read_text())
    name = configmap["metadata"]["name"]
    for key, text in configmap["data"].items():
        if key.endswith(".yaml"):
            task = yaml.safe_load(text)
            path = task["dataset_kwargs"]["data_files"]["test"]
            assert path == f"/opt/lmeval/tasks/{name}/arith.jsonl"
    assert len(configmap["data"]["arith.jsonl"].splitlines()) == 8


def test_results_rows() -> None:
    results = {
        "results": {
            "t_mc": {"alias": "t_mc", "acc,none": 0.25, "acc_stderr,none": 0.1637},
            "t_gen": {"exact_match,strict": 1, "exact_match_stderr,strict": "N/A"},
        }
    }
    assert demo.results_rows(results) == [
        ("t_gen", "exact_match", "strict", "1", "N/A"),
        ("t_mc", "acc", "none", "0.2500", "0.1637"),
    ]


class _ScriptedCluster:
    """The two calls the follower makes, answering from a list of statuses."""

    namespace = "lmeval-demo"

    def __init__(self, statuses: list[dict[str, Any]]) -> None:
        self.statuses = statuses
        self.reads = 0

    def get_job(self, name: str, namespace: str) -> dict[str, Any]:
        status = self.statuses[min(self.reads, len(self.statuses) - 1)]
        self.reads += 1
        return {"metadata": {"name": name, "namespace": namespace}, "status": status}

    def read_log(self, pod: str, namespace: str, container: str, **_: Any) -> str:
        return f"last line of {namespace}/{pod} ({container})\n"


class _Alive:
    def __init__(self, dies_after: int | None = None) -> None:
        self.checks, self.dies_after = 0, dies_after

    def check(self) -> None:
        self.checks += 1
        if self.dies_after is not None and self.checks > self.dies_after:
            raise DemoError("lmeval-poller exited")


def _console() -> tuple[Console, io.StringIO]:
    text = io.StringIO()
    return Console(file=text, width=120, color_system=None), text


def test_follow_prints_each_state_once_through_the_cli_follower() -> None:
    done = {"state": "Complete", "reason": "Succeeded", "message": "2 tasks", "podName": "p"}
    cluster = _ScriptedCluster(
        [
            {},
            {},
            {"state": "Scheduled", "podName": "p"},
            {"state": "Running", "podName": "p"},
            {"state": "Running", "podName": "p", "progress": {"percent": 50}},
            done,
        ]
    )
    console, text = _console()
    status = demo.follow(cluster, "j", console, timeout=30, processes=_Alive())  # type: ignore[arg-type]
    assert status == done
    shown = [line.split(maxsplit=1) for line in text.getvalue().splitlines() if line.strip()]
    assert all(elapsed.endswith("s") for elapsed, _ in shown), shown
    lines = [line.rstrip() for _, line in shown]
    assert lines == [
        "New         submitted; waiting for the poller",
        "Scheduled",
        "Running",
        "Complete    Succeeded: 2 tasks",
    ]
    assert demo.log_tail(cluster, "p") == "last line of lmeval-demo/p (lmeval)\n"  # type: ignore[arg-type]


def test_follow_stops_on_a_dead_process_and_on_its_timeout() -> None:
    console, _ = _console()
    running = _ScriptedCluster([{"state": "Running", "podName": "p"}])
    with pytest.raises(DemoError, match="lmeval-poller exited"):
        demo.follow(running, "j", console, timeout=30, processes=_Alive(dies_after=2))  # type: ignore[arg-type]
    with pytest.raises(DemoError, match="did not finish within 0 s"):
        demo.follow(running, "j", console, timeout=0.3, processes=_Alive())  # type: ignore[arg-type]
