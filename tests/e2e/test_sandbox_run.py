"""The README's command, as a newcomer runs it: ``python -m lmeval_sandbox run``.

Runs the whole command as a subprocess on its own fresh control plane (CI
runs it here, once per suite): it must exit 0 after a real evaluation, print
the results table, finish in under two minutes once the binaries are built,
and leave no process behind. With ``--keep`` everything stays up, answers
kubectl, and ``python -m lmeval_sandbox down`` stops every process it left.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lmeval_sandbox.controlplane import ControlPlane

pytestmark = [pytest.mark.cluster, pytest.mark.lmeval]

REPO = Path(__file__).resolve().parents[2]


def _sandbox(workdir: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="120")
    return subprocess.run(
        [sys.executable, "-m", "lmeval_sandbox", "--workdir", str(workdir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
        check=False,
    )


def _processes_using(workdir: Path) -> list[str]:
    """Processes whose command line or working directory is in `workdir`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if str(workdir) in cmdline or cwd.startswith(str(workdir)):
            found.append(f"{entry}: {cmdline[:200]}")
    return found


def test_run_command_evaluates_and_cleans_up(control_plane: ControlPlane, tmp_path: Path) -> None:
    # control_plane: the binaries are built (or found) before the clock starts.
    workdir = tmp_path / "sandbox"
    started = time.monotonic()
    done = _sandbox(workdir, "run")
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    print(output)
    assert done.returncode == 0, output
    assert "lm_eval results" in output
    for row in (
        r"sample_arith_gen\s+│ exact_match\s+│ none\s+│\s+0\.\d{4}",
        r"sample_arith_mc\s+│ acc\s+│ none\s+│\s+0\.\d{4}",
    ):
        assert re.search(row, output), row
    for state in ("Scheduled", "Running", "Complete"):
        assert state in output
    assert "Succeeded" in output
    assert elapsed < 120, f"the sandbox run took {elapsed:.0f} s"
    assert not (workdir / "state.json").exists()
    assert _processes_using(workdir) == []


def test_keep_leaves_it_running_until_down(control_plane: ControlPlane, tmp_path: Path) -> None:
    workdir = tmp_path / "kept"
    done = _sandbox(workdir, "run", "--keep", "--sample", "dummy-model")
    output = done.stdout + done.stderr
    try:
        assert done.returncode == 0, output
        assert "sample_arith_mc" in output and "kubectl get lmevaljobs" in output
        assert f"python -m lmeval_sandbox --workdir {workdir} down" in output
        state = json.loads((workdir / "state.json").read_text())
        names = set(state["pids"])
        assert {"kube-apiserver", "lmeval-poller", "lmeval-sandbox-runner", "model-server"} <= names
        kubectl = Path(state["binaries"]) / "kubectl"
        listed = subprocess.run(
            [str(kubectl), f"--kubeconfig={state['kubeconfig']}", "get", "lmevaljobs", "-A"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        assert re.search(r"dummy-model\s+Complete\s+Succeeded", listed), listed
    finally:
        down = _sandbox(workdir, "down", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert _processes_using(workdir) == []
