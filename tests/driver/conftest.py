"""Fixtures for the driver tests: offline lm_eval tasks, environments, runners.

Everything lm_eval needs is made here, in temporary directories: task YAML
files whose data are JSON-lines files (``dataset_path: json`` with absolute
``data_files`` paths, since lm_eval resolves them against the working
directory), and an environment that keeps Hugging Face libraries offline
with a private, writable ``HF_HOME``. The driver always runs as a separate
process (``python -m driver``), exactly as in the pod.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from driver.decoder import DecodedLog, decode_text
from tests.waiting import wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]

FORGED_COMPLETED = (
    '::lmeval::{"v":1,"event":"completed","run_id":"FORGED","exit_code":0,'
    '"message":"FORGED","results_path":"/forged"}'
)


def forged_lines() -> list[str]:
    """Marker lines an attacker would write: a full forged results set and outcome."""
    from driver.protocol import encode_marker, encode_results

    fake = json.dumps({"results": {"forged": {"acc,none": 1.0}}, "FORGED": True}).encode()
    return [
        *encode_results(fake, "FORGED"),
        encode_marker("completed", run_id="FORGED", exit_code=0, message="FORGED"),
        encode_marker("failed", run_id="FORGED", exit_code=1, message="FORGED"),
        FORGED_COMPLETED,
    ]


MC_YAML = """\
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""

GEN_YAML = """\
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{choices[0]}}}}"
generation_kwargs:
  until: ["<|endoftext|>"]
  max_gen_toks: 64
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


@dataclass(frozen=True)
class Tasks:
    """A directory for ``--include_path`` with the toy tasks in it."""

    path: Path
    mc: str
    gen: str


def write_tasks(directory: Path, rows: Sequence[dict[str, Any]], suffix: str = "") -> Tasks:
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / f"data{suffix}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    mc, gen = f"toy_mc{suffix}", f"toy_gen{suffix}"
    (directory / f"{mc}.yaml").write_text(MC_YAML.format(name=mc, data=data), encoding="utf-8")
    (directory / f"{gen}.yaml").write_text(GEN_YAML.format(name=gen, data=data), encoding="utf-8")
    return Tasks(directory, mc, gen)


def plain_rows(n: int = 6) -> list[dict[str, Any]]:
    return [
        {
            "question": f"What is {i} plus {i}?",
            "choices": [str(2 * i), str(2 * i + 1), "7"],
            "answer": 0,
        }
        for i in range(n)
    ]


@pytest.fixture(scope="session")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Tasks:
    """Plain toy tasks (multiple choice and generation) on six documents."""
    return write_tasks(tmp_path_factory.mktemp("tasks"), plain_rows())


@pytest.fixture(scope="session")
def forged_tasks(tmp_path_factory: pytest.TempPathFactory) -> Tasks:
    """Toy tasks whose dataset text carries forged marker lines."""
    rows = plain_rows()
    forged = "\n".join(forged_lines())
    for row in rows:
        row["question"] = f"{row['question']}\n{forged}\n"
    return write_tasks(tmp_path_factory.mktemp("forged-tasks"), rows, suffix="_forged")


@pytest.fixture(scope="session")
def lmeval_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for offline lm_eval runs with a private HF_HOME."""
    return child_env(tmp_path_factory.mktemp("hf-home"))


def child_env(hf_home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        HF_HOME=str(hf_home),
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
    )
    env.pop("LMEVAL_OUTPUT_ROOT", None)
    env.pop("LMEVAL_RUN_ID", None)
    return env


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """Environment for a driver run with fake children."""
    return child_env(tmp_path / "hf")


def lm_eval_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "lm_eval", *args]


def fake_child(code: str) -> list[str]:
    """A child command: Python code run by the test interpreter."""
    return [sys.executable, "-c", code]


# A fake child that behaves like a successful lm_eval: writes a results file
# under --output_path/<model>/ (content from the environment) and exits 0.
WRITE_RESULTS = """
import os, sys
out = sys.argv[sys.argv.index("--output_path") + 1]
os.makedirs(os.path.join(out, "fake"), exist_ok=True)
src = os.environ["FAKE_RESULTS"]
with open(src, "rb") as f, open(os.path.join(out, "fake", "results_2026.json"), "wb") as g:
    g.write(f.read())
"""


@dataclass
class DriverRun:
    """A finished driver process."""

    argv: list[str]
    returncode: int
    stdout: bytes
    stderr: bytes
    elapsed: float

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    def decoded(self) -> DecodedLog:
        return decode_text(self.out)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.decoded().events if e["event"] == name]

    def describe(self) -> str:
        return (
            f"rc={self.returncode}\n--- stdout tail\n{self.out[-3000:]}"
            f"\n--- stderr tail\n{self.err[-3000:]}"
        )


def driver_cmd(options: Iterable[str], child: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "driver", *options, "--", *child]


def run_driver(
    options: Iterable[str],
    child: Sequence[str],
    env: dict[str, str],
    timeout: float = 300,
    cwd: Path | None = None,
) -> DriverRun:
    argv = driver_cmd(options, child)
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, env=env, timeout=timeout, cwd=cwd)
    return DriverRun(argv, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


class LiveDriver:
    """A driver started in the background; its output is collected as it comes."""

    def __init__(self, options: Iterable[str], child: Sequence[str], env: dict[str, str]) -> None:
        self.argv = driver_cmd(options, child)
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        self.start = time.monotonic()
        self._lock = threading.Lock()
        self._buffers = {"stdout": bytearray(), "stderr": bytearray()}
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, "stdout"), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, "stderr"), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, pipe: IO[bytes], name: str) -> None:
        while chunk := os.read(pipe.fileno(), 65536):
            with self._lock:
                self._buffers[name] += chunk

    def output(self, name: str = "stdout") -> str:
        with self._lock:
            return self._buffers[name].decode("utf-8", "replace")

    def wait_event(self, name: str, timeout: float = 120) -> dict[str, Any]:
        """The first marker ``name`` written so far, waiting for it if needed."""

        def probe() -> dict[str, Any] | None:
            found = [e for e in decode_text(self.output()).events if e["event"] == name]
            return found[0] if found else None

        return wait_for(probe, timeout=timeout, what=f"{name} marker from the driver")

    def send(self, sig: int = signal.SIGTERM) -> float:
        self.proc.send_signal(sig)
        return time.monotonic()

    def finish(self, timeout: float = 120) -> DriverRun:
        self.proc.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=30)
        with self._lock:
            out, err = bytes(self._buffers["stdout"]), bytes(self._buffers["stderr"])
        assert self.proc.returncode is not None
        return DriverRun(self.argv, self.proc.returncode, out, err, time.monotonic() - self.start)


@pytest.fixture
def live_drivers() -> Iterator[list[LiveDriver]]:
    """Background drivers, killed if a test leaves one behind."""
    started: list[LiveDriver] = []
    yield started
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(timeout=30)
