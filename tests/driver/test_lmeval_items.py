"""Per-item scores and provenance from a real lm_eval run, through the driver and the decoder.

One ``local-completions`` run against the loopback toy model server, with
``--log_samples``, on two tasks made here: a multiple-choice task scored
with acc and acc_norm, and a generation task with two filters (exact match
on the raw answer and on its first word, like gsm8k's strict and flexible
filters). The ``items`` markers must decode to exactly the values of
lm_eval's samples files, each metric's mean must be lm_eval's aggregate in
the results, the run directory's ``lmeval-items.json`` must be the same
bytes, the final marker must carry the versions, the argv and the ids the
server's ``/v1/models`` lists, and ``lmeval-driver decode`` prints a summary.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lmeval_sandbox.model_server import ModelServer

from driver import __version__
from driver.itemscores import ItemScores, decode_item_scores
from driver.samples import ITEMS_FILE
from tests.driver.conftest import DriverRun, lm_eval_cmd, run_driver

pytestmark = pytest.mark.lmeval

ROWS = 24

MC = """\
task: items_mc
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
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""

GEN = """\
task: items_gen
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
  max_gen_toks: 16
filter_list:
  - name: whole
    filter:
      - function: take_first
  - name: first-word
    filter:
      - function: regex
        regex_pattern: "(\\\\d+)"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("items-tasks")
    data = directory / "data.jsonl"
    rows = [
        {"question": f"What is {i} plus {i}?", "choices": [str(2 * i), str(i), "7"], "answer": 0}
        for i in range(ROWS)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (directory / "items_mc.yaml").write_text(MC.format(data=data), encoding="utf-8")
    (directory / "items_gen.yaml").write_text(GEN.format(data=data), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def server() -> Iterator[ModelServer]:
    # Answers "4 apples": right for "2 plus 2" under the first-word filter only.
    with ModelServer(generation_text="4 apples") as srv:
        yield srv


@pytest.fixture(scope="module")
def items_run(
    server: ModelServer,
    task_dir: Path,
    lmeval_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> DriverRun:
    root = tmp_path_factory.mktemp("items-out")
    return run_driver(
        ["--output-root", str(root), "--progress-interval", "0"],
        lm_eval_cmd(
            "--model",
            "local-completions",
            "--model_args",
            server.model_args(),
            "--tasks",
            "items_mc,items_gen",
            "--include_path",
            str(task_dir),
            "--log_samples",
        ),
        lmeval_env,
    )


def scores_of(run: DriverRun) -> ItemScores:
    assert run.returncode == 0, run.describe()
    decoded = run.decoded()
    assert decoded.items is not None, decoded.items_error
    return decode_item_scores(decoded.items)


def samples_of(run: DriverRun, task: str) -> list[dict[str, Any]]:
    started = run.decoded().started
    assert started is not None
    (path,) = Path(started["output_dir"]).rglob(f"samples_{task}_*.jsonl")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_items_equal_the_samples_files(items_run: DriverRun) -> None:
    scores = scores_of(items_run)
    assert set(scores.tasks) == {"items_mc", "items_gen"}
    for name, task in scores.tasks.items():
        assert task.doc_ids == tuple(range(ROWS))
        expected: dict[str, dict[int, float]] = {}
        for sample in samples_of(items_run, name):
            for metric in sample["metrics"]:
                key = f"{metric},{sample['filter']}"
                expected.setdefault(key, {})[sample["doc_id"]] = float(sample[metric])
        assert set(task.metrics) == set(expected)
        for key, values in task.metrics.items():
            assert values.values == tuple(expected[key][i] for i in task.doc_ids), key
    gen = scores.tasks["items_gen"].metrics
    assert set(gen) == {"exact_match,whole", "exact_match,first-word"}
    # The filters really differ: "4 apples" is right for doc 2 only after the regex.
    assert gen["exact_match,whole"].values[2] == 0.0
    assert gen["exact_match,first-word"].values[2] == 1.0
    assert scores.skipped == {}


def test_each_metrics_mean_is_lm_evals_aggregate(items_run: DriverRun) -> None:
    scores = scores_of(items_run)
    results = items_run.decoded().results
    assert results is not None
    for name, task in scores.tasks.items():
        for key, items in task.metrics.items():
            mean = sum(items.values) / len(items.values)
            assert math.isclose(mean, results["results"][name][key], abs_tol=1e-9), (name, key)


def test_the_items_file_holds_the_same_bytes(items_run: DriverRun) -> None:
    decoded = items_run.decoded()
    assert decoded.outcome is not None and decoded.outcome.items_path is not None
    assert Path(decoded.outcome.items_path).name == ITEMS_FILE
    assert Path(decoded.outcome.items_path).read_bytes() == decoded.items
    completed = items_run.events("completed")[0]
    assert completed["items_chunks"] == 1 and completed["items_size"] == len(decoded.items or b"")
    assert "per-item scores: 2 task(s), 48 document(s)" in items_run.err


def test_the_final_marker_carries_the_provenance(items_run: DriverRun, server: ModelServer) -> None:
    decoded = items_run.decoded()
    outcome, started = decoded.outcome, decoded.started
    assert outcome is not None and started is not None
    assert outcome.driver_version == __version__
    assert outcome.lm_eval_version == importlib.metadata.version("lm_eval")
    assert list(outcome.argv) == started["argv"]
    assert outcome.server_models == server.model
    assert server.count("GET /v1/models") == 1
    assert scores_of(items_run).server == {"models": server.model}


def test_a_model_server_that_is_gone_is_a_note_not_a_failure(
    task_dir: Path, lmeval_env: dict[str, str], tmp_path: Path
) -> None:
    # lm_eval itself fails against a closed port; a fake child that writes
    # results makes the driver ask the listing of one after a completed run.
    from tests.driver.conftest import fake_child

    child = fake_child(
        "import os, sys\n"
        "out = os.path.join(sys.argv[sys.argv.index('--output_path') + 1], 'm')\n"
        "os.makedirs(out)\n"
        "open(os.path.join(out, 'results_D.json'), 'w').write('{\"results\": {}}')\n"
    )
    child += ["--model_args", "model=m,base_url=http://127.0.0.1:9/v1/completions"]
    run = run_driver(["--output-root", str(tmp_path)], child, lmeval_env)
    assert run.returncode == 0, run.describe()
    outcome = run.decoded().outcome
    assert outcome is not None and outcome.event == "completed"
    assert outcome.server_models is None
    assert "server models: GET http://127.0.0.1:9/v1/models failed" in run.err
    # No samples: no items, and the decoder says why.
    assert run.decoded().items_error == (
        "no per-item scores: lm_eval wrote no samples (run it with --log_samples)"
    )


def test_decode_prints_an_items_summary(items_run: DriverRun, lmeval_env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "driver", "decode"],
        input=items_run.stdout,
        capture_output=True,
        env=lmeval_env,
        check=True,
    )
    printed = json.loads(proc.stdout)
    assert printed["items_error"] is None
    assert printed["items"]["tasks"] == {
        "items_gen": {"items": ROWS, "metrics": ["exact_match,first-word", "exact_match,whole"]},
        "items_mc": {"items": ROWS, "metrics": ["acc,none", "acc_norm,none"]},
    }
    assert printed["outcome"]["server_models"] is not None
