"""Where a finished run's per-item scores and provenance are kept (`results.itemstore`, `outcome`).

Checks: valid per-item scores are decoded once, counted into
status.itemScores and stored gzip'd under ITEMS_KEY beside the results and
provenance.json; invalid ones are not stored and the message says why,
while the job still succeeds; the driver's note on items not sent is the
message; a log that says nothing of items leaves status.itemScores out.
Sizes: everything within CONFIGMAP_DATA_MAX as it is; results gzip'd to
make room; items left out (with their size and where the pod wrote them)
when they do not fit beside the results; reduced results when even those do
not fit. And through `outcome.complete` (the log decoded with items), in log
and exec mode, the status carries provenance and itemScores and validates.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import os
from typing import Any

from driver.decoder import DecodedLog, decode_lines
from driver.itemscores import (
    ItemScores,
    TaskItems,
    decode_item_scores,
    docs_digest,
    encode_item_scores,
    metric_items,
)
from driver.protocol import encode_marker, encode_results
from poller.api.settings import Settings
from poller.decisions import outcome
from poller.decisions.actions import StoreResults
from poller.decisions.views import ContainerView, ExecView, LogView
from poller.results import itemstore, lmeval
from tests.unit.test_decide import NOW, job, pod, running_status, status_of

RESULTS = {"results": {"arc": {"acc,none": 0.5}}, "config": {"model": "dummy"}}
IMAGE_ID = "registry.example/lmeval@sha256:" + "d" * 64


def scores(n: int = 100, tasks: int = 1) -> bytes:
    digest = docs_digest((i, f"h{i}") for i in range(n))
    return encode_item_scores(
        ItemScores(
            tasks={
                f"task{t}": TaskItems(
                    tuple(range(n)),
                    digest,
                    {
                        "acc,none": metric_items([i % 2 for i in range(n)]),
                        "f1,none": metric_items([i / n for i in range(n)]),
                    },
                )
                for t in range(tasks)
            }
        )
    )


def decoded(
    raw: bytes | None = None, *, note: str | None = None, error: str | None = None
) -> DecodedLog:
    fields: dict[str, Any] = {"run_id": "r", "exit_code": 0, "results_path": "/out/r.json"}
    if note is not None:
        fields["items_note"] = note
    fields["items_path"] = "/outputs/run-r/lmeval-items.json"
    lines = [encode_marker("started", run_id="r", argv=["lm_eval", "--tasks", "arc"])]
    lines += encode_results(json.dumps(RESULTS).encode(), "r")
    lines.append(encode_marker("completed", **fields))
    return dataclasses.replace(decode_lines(lines), items=raw, items_error=error)


def unpack(manifest: dict[str, Any], key: str) -> bytes:
    return gzip.decompress(base64.b64decode(manifest["binaryData"][key]))


def manifest_for(
    found: dict[str, Any], checked: itemstore.CheckedItems, outputs: str | None = None
) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
    text, _ = lmeval.reduce_results(found)
    return itemstore.results_manifest(
        namespace="ns",
        job_name="eval",
        job_uid="uid-1",
        labels={},
        found=found,
        reduced_text=text,
        provenance='{"format":1}',
        items=checked,
        items_path="/outputs/run-r/lmeval-items.json",
        outputs=outputs,
    )


def test_valid_items_are_counted_and_stored_gzipped() -> None:
    raw = scores(100, tasks=3)
    checked = itemstore.check(decoded(raw))
    assert checked.summary == {"stored": "ConfigMap", "tasks": 3, "items": 300, "bytes": len(raw)}
    manifest, summary, note = manifest_for(RESULTS, checked)
    assert (summary, note) == (checked.summary, None)
    assert unpack(manifest, lmeval.ITEMS_KEY) == raw
    assert decode_item_scores(unpack(manifest, lmeval.ITEMS_KEY)).tasks.keys() == {
        "task0",
        "task1",
        "task2",
    }
    assert json.loads(manifest["data"][lmeval.RESULTS_KEY]) == RESULTS
    assert manifest["data"][lmeval.PROVENANCE_KEY] == '{"format":1}'


def test_invalid_missing_and_noted_items() -> None:
    bad = itemstore.check(decoded(b'{"format": 1, "tasks": {"t": {"n": -1}}}'))
    assert (bad.raw, bad.scores) == (None, None)
    assert bad.summary is not None and bad.summary["stored"] == "None"
    assert bad.summary["message"].startswith("per-item scores not stored, invalid: ")
    assert "n must be an integer" in bad.summary["message"]
    manifest, _, _ = manifest_for(RESULTS, bad)
    assert lmeval.ITEMS_KEY not in manifest.get("binaryData", {})

    noted = itemstore.check(decoded(note="lm_eval wrote no samples (spec.logSamples is off)"))
    assert noted.summary == {
        "stored": "None",
        "message": "lm_eval wrote no samples (spec.logSamples is off)",
    }
    cut = itemstore.check(decoded(error="log ends before the last items chunk (1 of 2)"))
    assert cut.summary == {
        "stored": "None",
        "message": "log ends before the last items chunk (1 of 2)",
    }
    assert itemstore.check(decoded()).summary is None  # a driver that predates items

    huge = itemstore.check(decoded(b"{" + b" " * itemstore.ITEMS_DECODE_MAX + b"}"))
    assert huge.scores is None and huge.summary is not None
    assert "over the 2097152 the poller reads" in huge.summary["message"]


def test_results_are_gzipped_to_make_room_for_the_items() -> None:
    # 800 KB of compressible results text and 300 KB of incompressible items.
    found = {"results": {"arc": {"acc,none": 0.5}}, "configs": {"x": "y" * 800_000}}
    raw = scores(100)
    checked = dataclasses.replace(itemstore.check(decoded(raw)), raw=os.urandom(300_000))
    manifest, summary, note = manifest_for(found, checked)
    assert lmeval.RESULTS_KEY not in manifest["data"]
    assert json.loads(unpack(manifest, lmeval.RESULTS_KEY + ".gz")) == found
    assert unpack(manifest, lmeval.ITEMS_KEY) == checked.raw
    assert summary is not None and summary["stored"] == "ConfigMap" and note is None
    assert lmeval.configmap_data_bytes(manifest) <= lmeval.CONFIGMAP_DATA_MAX


def test_items_that_do_not_fit_are_left_out_and_the_message_says_where_they_are() -> None:
    # Results of 800 KB (600 KB gzip'd) and incompressible items of 500 KB: not both in 1 MiB.
    blob = base64.b64encode(os.urandom(600_000)).decode()
    found = {"results": {"arc": {"acc,none": 0.5}}, "blob": blob}
    checked = dataclasses.replace(itemstore.check(decoded(scores(10))), raw=os.urandom(500_000))
    manifest, summary, note = manifest_for(found, checked, outputs="PersistentVolumeClaim out")
    assert note is None
    assert json.loads(manifest["data"][lmeval.RESULTS_KEY]) == found  # the results are kept
    assert lmeval.ITEMS_KEY not in manifest.get("binaryData", {})
    assert lmeval.configmap_data_bytes(manifest) <= lmeval.CONFIGMAP_DATA_MAX
    assert summary is not None and summary["stored"] == "None"
    assert summary["message"].startswith("per-item scores not stored: 500000 bytes (")
    assert f"in a ConfigMap ({lmeval.CONFIGMAP_DATA_MAX} bytes)" in summary["message"]
    assert summary["message"].endswith(
        "the pod wrote them to /outputs/run-r/lmeval-items.json in its outputs claim "
        "(PersistentVolumeClaim out)"
    )
    _, without_claim, _ = manifest_for(found, checked)
    assert without_claim is not None
    assert without_claim["message"].endswith("the job has no outputs claim that keeps them")

    # Results too large for the ConfigMap even alone: reduced, and no items.
    noise = base64.b64encode(os.urandom(1_200_000)).decode()  # 1.2 MB gzip'd
    huge = {"results": {"arc": {"acc,none": 0.5}}, "configs": {"x": noise}}
    manifest, summary, note = manifest_for(huge, itemstore.check(decoded(scores(10))))
    assert note is not None and "holds the reduced results" in note
    assert json.loads(manifest["data"][lmeval.RESULTS_KEY]) == {
        "results": {"arc": {"acc,none": 0.5}}
    }
    assert summary is not None and summary["stored"] == "None"
    assert lmeval.ITEMS_KEY not in manifest.get("binaryData", {})


def test_a_finished_job_stores_items_and_provenance() -> None:
    raw = scores(50)
    terminated = pod(
        "terminated",
        phase="Succeeded",
        exit_code=0,
        reason="Completed",
        image="lmeval:1",
        image_id=IMAGE_ID,
    )
    log = LogView(decoded(raw), outcome.FIRST_TAIL_LINES, lines_read=10)
    decision = outcome.complete(job(running_status()), terminated, Settings(), NOW, log)
    store = decision.actions[0]
    assert isinstance(store, StoreResults)
    assert unpack(store.manifest, lmeval.ITEMS_KEY) == raw
    stored = json.loads(store.manifest["data"][lmeval.PROVENANCE_KEY])
    assert stored["imageID"] == IMAGE_ID and stored["tasks"]["task0"]["items"] == 50
    status = status_of(decision)
    assert status.reason is not None and status.reason.value == "Succeeded"
    assert status.item_scores is not None
    assert (status.item_scores.stored, status.item_scores.items) == ("ConfigMap", 50)
    assert status.provenance is not None
    assert (status.provenance.image, status.provenance.image_id) == ("lmeval:1", IMAGE_ID)
    assert status.provenance.argv == ["lm_eval", "--tasks", "arc"]  # from the started marker
    assert status.provenance.model == "dummy"

    # Invalid items: the job still succeeds, with its results and the reason.
    bad = LogView(decoded(b"[]"), outcome.FIRST_TAIL_LINES, lines_read=10)
    decision = outcome.complete(job(running_status()), terminated, Settings(), NOW, bad)
    status = status_of(decision)
    assert status.reason is not None and status.reason.value == "Succeeded"
    assert status.results is not None
    assert status.item_scores is not None and status.item_scores.stored == "None"

    # A failed run has provenance too (the image the kubelet ran).
    failed = dataclasses.replace(terminated, main=ContainerView(
        "terminated", exit_code=1, reason="Error", image="lmeval:1", image_id=IMAGE_ID
    ))  # fmt: skip
    lines = [encode_marker("failed", run_id="r", exit_code=1, message="boom")]
    decision = outcome.complete(
        job(running_status()), failed, Settings(), NOW, LogView(decode_lines(lines), 400)
    )
    status = status_of(decision)
    assert status.provenance is not None and status.provenance.image_id == IMAGE_ID
    assert status.item_scores is None


def test_exec_mode_takes_the_items_from_the_log() -> None:
    raw = scores(20)
    held = pod("running", image="lmeval:1", image_id=IMAGE_ID)
    log = LogView(decoded(raw), outcome.FIRST_TAIL_LINES, lines_read=10)
    settings = Settings(results_source="exec")
    draft_job = job(running_status())
    from poller.decisions.draft import StatusDraft

    draft = StatusDraft(draft_job, NOW)
    actions = outcome.holding(draft_job, held, settings, log, ExecView(json.dumps(RESULTS)), draft)
    assert actions is not None
    store = actions[0]
    assert isinstance(store, StoreResults)
    assert unpack(store.manifest, lmeval.ITEMS_KEY) == raw
    assert draft.fields["results_source"] == "exec"
    assert draft.fields["item_scores"]["items"] == 20
    assert draft.fields["provenance"]["image_id"] == IMAGE_ID
