"""driver.samples turns lm_eval's samples lines into per-item scores, bounded.

Checked on hand-written lines of lm_eval 0.4's shape: values land under
``<metric>,<filter>`` in doc-id order whatever the file's order, several
filters give one metric each, values that are no number per document
(bleu's tuples, infinity) are skipped with the reason, a document repeated
within a filter or an over-long line makes the task unusable (with the
reason, the other tasks kept), and the files of a run are found by the
results file's date id.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest

from driver import samples
from driver.itemscores import BINARY, FIXED, decode_item_scores, docs_digest, encode_item_scores

DATE = "2026-12-01T15-00-00.123456"


def doc_hash(doc_id: int) -> str:
    return hashlib.sha256(f"doc {doc_id}".encode()).hexdigest()


def line(doc_id: int, filt: str = "none", **metrics: Any) -> str:
    """A samples line as lm_eval writes it (doc, prompts and answers included)."""
    sample: dict[str, Any] = {
        "doc_id": doc_id,
        "doc": {"question": f"q{doc_id}", "filter": "a dataset column named filter"},
        "target": "0",
        "arguments": {"gen_args_0": {"arg_0": "Question: ...", "arg_1": " A"}},
        "resps": [[["-1.5", "False"]]],
        "filtered_resps": [["-1.5", "False"]],
        "filter": filt,
        "metrics": list(metrics),
        "doc_hash": doc_hash(doc_id),
        "prompt_hash": "p" * 64,
        "target_hash": "t" * 64,
    }
    sample.update(metrics)
    return json.dumps(sample, ensure_ascii=False)


def write(directory: Path, task: str, lines: list[str]) -> Path:
    path = directory / f"samples_{task}_{DATE}.jsonl"
    path.write_text("".join(text + "\n" for text in lines), encoding="utf-8")
    return path


def extract(directory: Path) -> Any:
    results = directory / f"results_{DATE}.json"
    results.write_text("{}", encoding="utf-8")
    return samples.extract_items(samples.samples_files(str(results)), {})


def test_values_are_in_doc_id_order_under_metric_and_filter(tmp_path: Path) -> None:
    write(
        tmp_path,
        "arc",
        [
            line(2, acc=1.0, acc_norm=0.0),
            line(0, acc=0.0, acc_norm=1.0),
            line(1, acc=True, acc_norm=1),
        ],
    )
    scores = extract(tmp_path)
    task = scores.tasks["arc"]
    assert task.doc_ids == (0, 1, 2)
    assert task.metrics["acc,none"].values == (0.0, 1.0, 1.0)
    assert task.metrics["acc_norm,none"].values == (1.0, 1.0, 0.0)
    assert task.metrics["acc,none"].kind == BINARY
    assert task.docs_sha256 == docs_digest((i, doc_hash(i)) for i in range(3))
    assert scores.skipped == {}
    assert decode_item_scores(encode_item_scores(scores)) == scores


def test_each_filter_gives_its_own_metric_key(tmp_path: Path) -> None:
    lines = [line(i, "strict-match", exact_match=float(i % 2)) for i in (1, 0)]
    lines += [line(i, "flexible-extract", exact_match=1.0) for i in (0, 1)]
    write(tmp_path, "gsm8k", lines)
    task = extract(tmp_path).tasks["gsm8k"]
    assert set(task.metrics) == {"exact_match,strict-match", "exact_match,flexible-extract"}
    assert task.metrics["exact_match,strict-match"].values == (0.0, 1.0)
    assert task.metrics["exact_match,flexible-extract"].values == (1.0, 1.0)


def test_tuples_and_infinities_are_skipped_with_the_reason_nan_is_kept(tmp_path: Path) -> None:
    write(
        tmp_path,
        "wmt",
        [
            line(0, bleu=["ref", "pred"], chrf=0.25, f1=float("nan")),
            line(1, bleu=["ref", "pred"], chrf=float("inf"), f1=0.5),
        ],
    )
    scores = extract(tmp_path)
    task = scores.tasks["wmt"]
    assert set(task.metrics) == {"f1,none"}
    assert task.metrics["f1,none"].kind == FIXED
    assert math.isnan(task.metrics["f1,none"].values[0])
    reasons = dict(r.split(": ", 1) for r in scores.skipped["wmt"])
    assert "not numbers" in reasons["bleu,none"] and "list" in reasons["bleu,none"]
    assert "not finite" in reasons["chrf,none"]


def test_a_metric_missing_for_some_documents_is_skipped(tmp_path: Path) -> None:
    write(tmp_path, "t", [line(0, acc=1.0, extra=1.0), line(1, acc=0.0)])
    scores = extract(tmp_path)
    assert set(scores.tasks["t"].metrics) == {"acc,none"}
    assert scores.skipped["t"] == ("extra,none: not every document has a value",)


def test_a_repeated_document_makes_the_task_unusable_not_the_run(tmp_path: Path) -> None:
    write(tmp_path, "bad", [line(0, acc=1.0), line(1, acc=0.0), line(0, acc=1.0)])
    write(tmp_path, "good", [line(0, acc=1.0)])
    scores = extract(tmp_path)
    assert scores.tasks["bad"].doc_ids == () and scores.tasks["bad"].metrics == {}
    assert scores.skipped["bad"] == ("*: document 0 appears twice under filter 'none'",)
    assert scores.tasks["good"].metrics["acc,none"].values == (1.0,)
    # The reason survives the encoding (a task with no documents is kept).
    assert decode_item_scores(encode_item_scores(scores)).skipped["bad"] == scores.skipped["bad"]


def test_over_long_lines_and_garbage_are_refused_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(samples, "MAX_SAMPLE_LINE_BYTES", 4096)
    long = line(0, acc=1.0).replace("q0", "q" * 5000)
    write(tmp_path, "long", [long])
    write(tmp_path, "garbage", ["not json"])
    write(tmp_path, "nohash", [json.dumps({"doc_id": 0, "filter": "none", "metrics": []})])
    skipped = extract(tmp_path).skipped
    assert skipped["long"] == ("*: a sample line exceeds 4096 bytes",)
    assert skipped["garbage"][0].startswith("*: sample line 1 is not JSON")
    assert skipped["nohash"] == ("*: the sample of document 0 has no sha256 doc_hash",)


def test_filters_over_different_documents_are_refused(tmp_path: Path) -> None:
    write(tmp_path, "t", [line(0, "a", acc=1.0), line(1, "b", acc=1.0)])
    assert extract(tmp_path).skipped["t"] == ("*: filters 'a' and 'b' cover different documents",)


def test_only_this_runs_files_are_found_and_task_names_keep_underscores(tmp_path: Path) -> None:
    write(tmp_path, "mmlu_high_school_physics", [line(0, acc=1.0)])
    (tmp_path / "samples_other_2020-01-01T00-00-00.000001.jsonl").write_text("", "utf-8")
    found = samples.samples_files(str(tmp_path / f"results_{DATE}.json"))
    assert list(found) == ["mmlu_high_school_physics"]


def test_a_run_without_samples_sends_nothing(tmp_path: Path) -> None:
    results = tmp_path / f"results_{DATE}.json"
    results.write_text("{}", encoding="utf-8")
    assert samples.items_markers(str(results), str(tmp_path), "r", {}) is None


def test_items_too_large_for_the_log_stay_in_the_file_and_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from driver import protocol

    small = protocol.ITEMS_LIMITS._replace(max_compressed=100)
    monkeypatch.setattr(protocol, "ITEMS_LIMITS", small)
    write(tmp_path, "t", [line(i, f1=i / 7) for i in range(200)])
    results = tmp_path / f"results_{DATE}.json"
    results.write_text("{}", encoding="utf-8")
    sent = samples.items_markers(str(results), str(tmp_path), "r", {"models": "m"})
    assert sent is not None and sent.markers == []
    assert sent.details["items_chunks"] == 0
    path = tmp_path / samples.ITEMS_FILE
    assert sent.details.get("items_path") == str(path)
    assert "exceed the 100 byte limit" in sent.details["items_note"]
    assert str(path) in sent.details["items_note"]
    stored = path.read_bytes()
    assert hashlib.sha256(stored).hexdigest() == sent.details["items_sha256"]
    assert decode_item_scores(stored).server == {"models": "m"}
