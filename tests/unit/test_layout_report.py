"""`python -m lmeval_sandbox.layout`, the layout as the imports draw it, runs and says what holds.

Checks: the report names every layer folder with its modules, and the
folder-level graph has no cycle and runs from the process through the cycle
and the I/O layer to the pure layers (what poller/ARCHITECTURE.md promises
and the import contracts enforce module by module).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_layout_report_draws_the_layers() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "lmeval_sandbox.layout", "--no-trips"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    report = done.stdout
    for folder in ("api", "cycle", "decisions", "jobpod", "kube", "results"):
        assert f"| `poller/{folder}/` |" in report, folder
    (line,) = [line for line in report.splitlines() if line.startswith("- By folder")]
    assert line.endswith("cycles: **none**.")
    assert "`cycle` → `kube` → `decisions` → `jobpod`" in line
