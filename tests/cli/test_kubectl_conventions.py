"""``lmeval`` behaves like kubectl, checked as a process on the real control plane.

Checks: bare ``lmeval`` prints its help on stdout and exits 0; ``completion
bash`` loads in a real bash, registers ``lmeval``, and its function offers
the commands, the ``-o`` formats and the namespace's job names (asked of the
cluster); the zsh script loads in zsh (registered with compdef) and the fish
script in fish, whose own completion engine then offers the commands;
``delete`` prints ``lmevaljob.<group>/NAME deleted``, exits 4 on a missing
name (still deleting the others) unless ``--ignore-not-found``, selects with
``-l`` and ``--all``, waits for a finalizer by default (exit 2 on its
timeout) and not with ``--wait=false``; ``get``, ``cancel``, ``suspend`` and
``resume`` take several names or ``-l`` (never both), ``get`` of several
names prints each description or one ``kind: List``; one ``-o`` vocabulary
(``name``, ``jsonpath=``, ``custom-columns=``, ``wide``) on list, get,
submit, cancel and delete, and ``--no-headers`` on tables; ``list -w`` and
``get -w`` print the table and then a line when a job is created or
changes, until interrupted (exit 130); ``wait`` takes
``--for=condition=...`` as kubectl spells it, several jobs and ``-l``,
``--timeout=0`` checks once, and without ``--timeout`` gives up after 30 s.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from poller import api
from tests.cli.conftest import REPO, Cli, cli_env
from tests.poller_fixtures import Jobs
from tests.waiting import wait_for

RESOURCE = f"lmevaljob.{api.API_GROUP}"


def _label(jobs: Jobs, name: str, **labels: str) -> None:
    jobs.custom.patch_namespaced_custom_object(
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.PLURAL,
        name,
        {"metadata": {"labels": labels}},
    )


def _set_status(jobs: Jobs, name: str, **status: Any) -> None:
    """Write status as the poller would (as an admin, no poller running)."""
    jobs.custom.patch_namespaced_custom_object_status(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL, name, {"status": status}
    )


def _finished(jobs: Jobs, name: str, reason: str = "Succeeded", **labels: str) -> None:
    jobs.create(name)
    if labels:
        _label(jobs, name, **labels)
    results = json.dumps({"results": {"toy_mc": {"acc,none": 0.5}}})
    _set_status(
        jobs,
        name,
        state="Complete",
        reason=reason,
        message="evaluation finished" if reason == "Succeeded" else "lm_eval exited 1",
        results=results if reason == "Succeeded" else None,
    )


def _names(jobs: Jobs) -> list[str]:
    found: dict[str, Any] = jobs.custom.list_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL
    )
    listed = found["items"]
    return sorted(j["metadata"]["name"] for j in listed)


# -- no cluster needed ---------------------------------------------------------------


def test_bare_lmeval_prints_help_and_exits_0() -> None:
    bare = subprocess.run(
        [sys.executable, "-m", "lmeval_cli"],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert bare.returncode == 0, bare.stderr
    assert bare.stdout.startswith("usage: lmeval") and "exit codes:" in bare.stdout
    assert "completion" in bare.stdout and "delete" in bare.stdout
    assert bare.stderr == ""


@pytest.fixture
def on_path(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has an `lmeval` running this checkout (as installed)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "lmeval"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -m lmeval_cli "$@"\n')
    script.chmod(0o755)
    return {**cli_env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def _shell(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False
    )


# Drive bash's completion function as bash does on Tab (COMP_WORDS, COMP_CWORD...).
BASH_COMPLETE = """
source <(lmeval completion bash) || exit 9
complete -p lmeval || exit 8
line="$1"
COMP_LINE="$line"; COMP_POINT=${#line}
read -r -a COMP_WORDS <<< "$line"
[[ "$line" == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
_python_argcomplete lmeval "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\\n' "${COMPREPLY[@]}"
"""


def _bash_completions(env: dict[str, str], line: str) -> tuple[str, list[str]]:
    done = _shell(["bash", "-c", BASH_COMPLETE, "bash", line], env)
    assert done.returncode == 0, (done.stdout, done.stderr)
    registered, *offered = done.stdout.splitlines()
    return registered, [o.strip() for o in offered]


def test_bash_completion_loads_and_offers_commands(on_path: dict[str, str]) -> None:
    loaded = _shell(
        ["bash", "-c", "source <(lmeval completion bash) && complete -p lmeval"], on_path
    )
    assert loaded.returncode == 0, loaded.stderr
    assert "-F _python_argcomplete lmeval" in loaded.stdout

    registered, offered = _bash_completions(on_path, "lmeval ")
    assert registered.endswith(" lmeval")
    assert {"submit", "list", "get", "wait", "delete", "completion", "version"} <= set(offered)
    _, formats = _bash_completions(on_path, "lmeval list -o j")
    assert set(formats) == {"json", "jsonpath="}
    _, flags = _bash_completions(on_path, "lmeval wait --ti")
    assert flags == ["--timeout"]
    _, shells = _bash_completions(on_path, "lmeval completion ")
    assert {s for s in shells if not s.startswith("-")} == {"bash", "zsh", "fish"}


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh not installed (apt-get install zsh)")
def test_zsh_completion_loads(on_path: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "lmeval.zsh"
    script.write_text(_shell(["lmeval", "completion", "zsh"], on_path).stdout)
    assert _shell(["zsh", "-n", str(script)], on_path).returncode == 0
    loaded = _shell(
        [
            "zsh",
            "-f",
            "-c",
            f"autoload -U compinit && compinit -u -D && source {script} && print $_comps[lmeval]",
        ],
        on_path,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "_python_argcomplete"


@pytest.mark.skipif(
    shutil.which("fish") is None, reason="fish not installed (apt-get install fish)"
)
def test_fish_completion_loads_and_offers_commands(on_path: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "lmeval.fish"
    script.write_text(_shell(["lmeval", "completion", "fish"], on_path).stdout)
    assert _shell(["fish", "--no-execute", str(script)], on_path).returncode == 0
    env = {**on_path, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    completed = _shell(["fish", "-c", f"source {script}; complete -C 'lmeval '"], env)
    assert completed.returncode == 0, completed.stderr
    offered = {line.split("\t")[0] for line in completed.stdout.splitlines()}
    assert {"submit", "list", "get", "delete", "completion"} <= offered


# -- on the cluster ------------------------------------------------------------------


@pytest.mark.cluster
def test_completion_offers_the_namespaces_job_names(
    cli: Cli, jobs: Jobs, on_path: dict[str, str]
) -> None:
    for name in ("alpha-1", "alpha-2", "beta"):
        jobs.create(name)
    line = f"lmeval --kubeconfig={cli.kubeconfig} -n {cli.namespace} get al"
    _, offered = _bash_completions(on_path, line)
    assert offered == ["alpha-1", "alpha-2"]
    _, every = _bash_completions(
        on_path, f"lmeval logs --kubeconfig={cli.kubeconfig} -n {cli.namespace} "
    )
    assert {"alpha-1", "alpha-2", "beta"} <= set(every)


@pytest.mark.cluster
def test_delete(cli: Cli, jobs: Jobs) -> None:
    for name in ("one", "two", "three"):
        jobs.create(name)
    deleted = cli("delete", "one", "nope", "two")
    assert deleted.returncode == 4, deleted.stderr
    assert deleted.stdout == f"{RESOURCE}/one deleted\n{RESOURCE}/two deleted\n"
    assert 'LMEvalJob "nope" not found' in deleted.stderr
    assert _names(jobs) == ["three"]  # deleted and gone (--wait is the default)

    ignored = cli("delete", "nope", "--ignore-not-found")
    assert (ignored.returncode, ignored.stdout, ignored.stderr) == (0, "", "")
    typo = cli("delete", "thre")
    assert typo.returncode == 4 and 'did you mean "three"?' in typo.stderr

    for name in ("l1", "l2"):
        jobs.create(name)
        _label(jobs, name, team="nlp")
    by_label = cli("delete", "-l", "team=nlp", "-o", "name")
    assert by_label.returncode == 0, by_label.stderr
    assert by_label.stdout == f"{RESOURCE}/l1\n{RESOURCE}/l2\n"
    assert _names(jobs) == ["three"]
    nothing = cli("delete", "-l", "team=nlp")
    assert nothing.returncode == 0 and "No LMEvalJobs found" in nothing.stderr

    both = cli("delete", "three", "-l", "team=nlp")
    assert both.returncode == 3 and "not both" in both.stderr
    neither = cli("delete")
    assert neither.returncode == 3 and "--all" in neither.stderr

    # A finalizer holds the job: delete waits for it (here: gives up), or not.
    jobs.create("held")
    jobs.custom.patch_namespaced_custom_object(
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.PLURAL,
        "held",
        {"metadata": {"finalizers": ["example.com/hold"]}},
    )
    waited = cli("delete", "held", "--timeout=1s", "--interval=0.2")
    assert waited.returncode == 2, waited.stderr
    assert waited.stdout == f"{RESOURCE}/held deleted\n"
    assert "timed out waiting for lmevaljob/held to be deleted" in waited.stderr
    assert "example.com/hold" in waited.stderr
    again = cli("delete", "held", "--wait=false")
    assert again.returncode == 0, again.stderr
    assert jobs.get("held")["metadata"].get("deletionTimestamp")
    jobs.custom.patch_namespaced_custom_object(
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.PLURAL,
        "held",
        {"metadata": {"finalizers": None}},
    )
    wait_for(lambda: "held" not in _names(jobs), timeout=30, what="held gone")

    every = cli("delete", "--all")
    assert every.returncode == 0 and every.stdout == f"{RESOURCE}/three deleted\n"
    assert _names(jobs) == []


@pytest.mark.cluster
def test_several_names_and_selectors(cli: Cli, jobs: Jobs) -> None:
    for name in ("a", "b", "c"):
        jobs.create(name)
    _label(jobs, "a", team="nlp")
    _label(jobs, "c", team="nlp")

    described = cli("get", "a", "b")
    assert described.returncode == 0, described.stderr
    names = [" ".join(line.split()) for line in described.stdout.splitlines()]
    assert names.count("Name: a") == 1 and names.count("Name: b") == 1
    listed = yaml.safe_load(cli("get", "a", "b", "-o", "yaml").stdout)
    assert listed["kind"] == "List"
    assert [i["metadata"]["name"] for i in listed["items"]] == ["a", "b"]
    one = json.loads(cli("get", "a", "-o", "json").stdout)
    assert one["kind"] == "LMEvalJob" and one["metadata"]["name"] == "a"
    selected = cli("get", "-l", "team=nlp", "-o", "name")
    assert selected.stdout == f"{RESOURCE}/a\n{RESOURCE}/c\n"
    partly = cli("get", "a", "nope", "-o", "name")
    assert partly.returncode == 4
    assert partly.stdout == f"{RESOURCE}/a\n" and 'LMEvalJob "nope" not found' in partly.stderr
    both = cli("get", "a", "-l", "team=nlp")
    assert both.returncode == 3 and "not both" in both.stderr
    across = cli("get", "a", "-A")
    assert across.returncode == 3 and "-A selects with -l" in across.stderr

    suspended = cli("suspend", "-l", "team=nlp")
    assert suspended.returncode == 0, suspended.stderr
    assert suspended.stdout.splitlines() == [
        "lmevaljob/a suspend requested: the poller deletes its pod",
        "lmevaljob/c suspend requested: the poller deletes its pod",
    ]
    assert [jobs.get(n)["spec"].get("suspend") for n in "abc"] == [True, None, True]
    resumed = cli("resume", "a", "c", "-o", "name")
    assert resumed.stdout == f"{RESOURCE}/a\n{RESOURCE}/c\n"
    assert [jobs.get(n)["spec"].get("suspend") for n in "ac"] == [False, False]
    cancelled = cli("cancel", "b", "nope")
    assert cancelled.returncode == 4
    assert cancelled.stdout == "lmevaljob/b cancel requested: the poller stops it\n"
    assert jobs.get("b")["spec"]["cancel"] is True
    none = cli("cancel", "-l", "team=none")
    assert none.returncode == 0 and "No LMEvalJobs found" in none.stderr


@pytest.mark.cluster
def test_one_output_vocabulary(cli: Cli, jobs: Jobs) -> None:
    _finished(jobs, "done", team="nlp")
    jobs.create("fresh")

    names = cli("list", "-o", "jsonpath={.items[*].metadata.name}")
    assert (names.returncode, names.stdout) == (0, "done fresh")
    ranged = cli(
        "list", "-o", 'jsonpath={range .items[*]}{.metadata.name}={.status.state}{"\\n"}{end}'
    )
    assert ranged.stdout == "done=Complete\nfresh=\n"
    columns = cli("list", "-o", "custom-columns=NAME:.metadata.name,STATE:.status.state")
    assert [line.split() for line in columns.stdout.splitlines()] == [
        ["NAME", "STATE"],
        ["done", "Complete"],
        ["fresh", "<none>"],
    ]
    headless = cli("list", "--no-headers")
    assert [line.split()[:2] for line in headless.stdout.splitlines()] == [
        ["done", "Complete"],
        ["fresh", "New"],
    ]
    as_names = cli("list", "-o", "name", "-l", "team=nlp")
    assert as_names.stdout == f"{RESOURCE}/done\n"

    one = cli("get", "done", "-o", "jsonpath={.status.reason}")
    assert one.stdout == "Succeeded"
    wide = cli("get", "done", "fresh", "-o", "wide", "--no-headers")
    rows = [line.split() for line in wide.stdout.splitlines()]
    assert [r[:2] for r in rows] == [["done", "Complete"], ["fresh", "New"]]
    custom = cli("get", "done", "-o", "custom-columns=N:.metadata.name,R:.status.reason")
    assert [line.split() for line in custom.stdout.splitlines()] == [
        ["N", "R"],
        ["done", "Succeeded"],
    ]

    created = cli("submit", "--model=dummy", "--task=toy_mc", "-o", "jsonpath={.metadata.name}")
    assert created.returncode == 0, created.stderr
    assert created.stdout.startswith("dummy-") and "\n" not in created.stdout
    assert created.stdout in _names(jobs)
    cancelled = cli("cancel", created.stdout, "-o", "name")
    assert cancelled.stdout == f"{RESOURCE}/{created.stdout}\n"

    results = cli("results", "done", "--no-headers")
    assert [line.split() for line in results.stdout.splitlines()] == [
        ["toy_mc", "acc", "none", "0.5000", "-"]
    ]
    csv = cli("results", "done", "-o", "csv", "--no-headers")
    assert csv.stdout == "toy_mc,acc,none,0.5000,-\n"

    refused = cli("results", "done", "-o", "yaml")
    assert refused.returncode == 3 and "table, csv, markdown, json" in refused.stderr
    template = cli("list", "-o", "jsonpath={.items[*].metadata.name")
    assert template.returncode == 3 and "unclosed action" in template.stderr


class _Lines:
    """A process's stdout read line by line in a thread, to wait on with a timeout."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        assert process.stdout is not None
        stream = process.stdout

        def read() -> None:
            for line in stream:
                self.lines.put(line.rstrip("\n"))

        threading.Thread(target=read, daemon=True).start()

    def until(self, want: Any, timeout: float = 30) -> list[str]:
        """Lines until one for which `want(cells)` holds; AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no such line within {timeout}s; saw {self.seen}") from None
            self.seen.append(line)
            if want(line.split()):
                return self.seen

    def interrupt(self) -> int:
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=30)


@pytest.mark.cluster
def test_list_and_get_watch(cli: Cli, jobs: Jobs) -> None:
    jobs.create("first")
    watching = _Lines(cli.popen("list", "-w", "--interval=0.2"))
    watching.until(lambda cells: cells[:2] == ["NAME", "STATE"])
    watching.until(lambda cells: cells[:2] == ["first", "New"])
    jobs.create("second")
    watching.until(lambda cells: cells[:2] == ["second", "New"])
    _set_status(jobs, "first", state="Running", progress={"percent": 40})
    seen = watching.until(lambda cells: cells[:4] == ["first", "Running", "-", "40%"])
    assert watching.interrupt() == 130
    # One line per change: no job printed twice in the same state.
    rows = [tuple(line.split()[:4]) for line in seen[1:]]
    assert len(rows) == len(set(rows)), seen

    one = _Lines(cli.popen("get", "second", "-w", "--no-headers", "--interval=0.2"))
    one.until(lambda cells: cells[:2] == ["second", "New"])
    _set_status(jobs, "second", state="Scheduled")
    _set_status(jobs, "first", state="Complete", reason="Succeeded")  # not watched
    seen = one.until(lambda cells: cells[:2] == ["second", "Scheduled"])
    assert one.interrupt() == 130
    assert not [line for line in seen if line.startswith(("NAME", "first"))], seen

    # --watch-only: the jobs already there are not printed, a change is. The
    # watcher's first listing cannot be observed, so "first" is changed until
    # a line comes (each change is a new resourceVersion: printed by -o name).
    named = _Lines(cli.popen("list", "--watch-only", "-o", "name", "--interval=0.2"))
    changes = iter(range(1000))

    def changed() -> list[str] | None:
        _label(jobs, "first", change=str(next(changes)))
        try:
            return named.until(lambda cells: True, timeout=0.5)
        except AssertionError:
            return None

    seen = wait_for(changed, timeout=30, what="a line from --watch-only")
    assert named.interrupt() == 130
    assert seen == [f"{RESOURCE}/first"]  # not second, which did not change


@pytest.mark.cluster
def test_wait_as_kubectl(cli: Cli, jobs: Jobs) -> None:
    jobs.create("stuck")  # no poller: it stays New
    started = time.monotonic()
    default = cli.popen("wait", "stuck", "--interval=1")

    _finished(jobs, "good", team="nlp")
    _finished(jobs, "bad", reason="Failed", team="nlp")
    kubectl_spelling = cli("wait", "good", "--for=condition=Succeeded")
    assert kubectl_spelling.returncode == 0, kubectl_spelling.stderr
    assert kubectl_spelling.stdout.splitlines()[-1] == "lmevaljob/good succeeded: acc=0.5000"
    complete = cli("wait", "-l", "team=nlp", "--for=condition=Complete")
    assert complete.returncode == 0, complete.stderr
    assert complete.stdout.splitlines()[-2:] == [
        "lmevaljob/bad failed: lm_eval exited 1",
        "lmevaljob/good succeeded: acc=0.5000",
    ]
    failing = cli("wait", "good", "bad")
    assert failing.returncode == 1
    assert "lmevaljob/bad failed: lm_eval exited 1" in failing.stderr
    _set_status(
        jobs,
        "stuck",
        conditions=[
            {
                "type": "Scheduled",
                "status": "True",
                "reason": "PodCreated",
                "message": "m",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
    )
    condition = cli("wait", "stuck", "--for=condition=scheduled")
    assert condition.returncode == 0, condition.stderr
    assert condition.stdout.splitlines()[-1] == "lmevaljob/stuck condition met: Scheduled=True"
    once = cli("wait", "stuck", "--timeout=0")
    assert once.returncode == 2
    assert "timed out after 0s waiting for lmevaljob/stuck to be succeeded" in once.stderr
    unknown = cli("wait", "stuck", "--for=condition=Ready")
    assert unknown.returncode == 3 and "has no condition 'Ready'" in unknown.stderr
    nothing = cli("wait", "-l", "team=none")
    assert nothing.returncode == 4

    jobs.custom.delete_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL, "good"
    )
    gone = cli("wait", "good", "--for=delete")
    assert gone.returncode == 0, gone.stderr
    assert gone.stdout.splitlines()[-1] == "lmevaljob/good deleted"

    out, err = default.communicate(timeout=90)
    waited = time.monotonic() - started
    assert default.returncode == 2, (out, err)
    assert "timed out after 30s waiting for lmevaljob/stuck to be succeeded" in err
    assert 29 <= waited < 60, waited
