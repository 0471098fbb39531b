"""`poller.results.provenance`: a run's provenance from untrusted markers and results, bounded.

Checks: every field comes from where it should (final marker, else the
started marker; lm_eval's results config and task_hashes; the kubelet's
image and imageID; the items' docs digests); secrets are never copied (of
model_args only the model's name, argv redacted again, URL credentials
hidden); hostile values (wrong types, control characters, over-long text,
hashes that are not hex, booleans and huge numbers as seeds) are left out;
status stays small (50 task hashes, 4096 characters of argv) and validates
against the CRD's bounds (api.Provenance); provenance.json stays within
DOCUMENT_MAX_BYTES whatever the results name.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from driver.decoder import Outcome
from driver.itemscores import ItemScores, TaskItems, docs_digest, metric_items
from poller import api
from poller.results import provenance

HASH_A = "a" * 64
HASH_B = "b" * 64
IMAGE_ID = "docker.io/library/lmeval@sha256:" + "c" * 64


def results_doc(**extra: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "results": {"arc": {"acc,none": 0.5}, "boolq": {"acc,none": 0.6}},
        "versions": {"arc": 1.0, "boolq": 2},
        "n-shot": {"arc": 0, "boolq": 5},
        "configs": {
            "arc": {
                "dataset_path": "allenai/ai2_arc",
                "dataset_name": "ARC-Easy",
                "dataset_kwargs": {"revision": "refs/convert/parquet"},
            },
            "boolq": {"dataset_path": "super_glue", "dataset_name": "boolq"},
        },
        "config": {
            "model": "local-completions",
            "model_args": "model=toy-7b,base_url=http://user:pw@h:8000/v1/completions,"
            "api_key=SECRET-1,tokenizer_backend=remote",
            "random_seed": 0,
            "numpy_seed": 1234,
            "torch_seed": 1234,
            "fewshot_seed": 1234,
        },
        "task_hashes": {"arc": HASH_A, "boolq": HASH_B},
        "lm_eval_version": "0.4.13",
    }
    document.update(extra)
    return document


def final(**fields: Any) -> Outcome:
    base: dict[str, Any] = {
        "event": "completed",
        "exit_code": 0,
        "signal": None,
        "message": "lm_eval completed",
        "results_path": "/x",
        "driver_version": "1.4.0",
        "lm_eval_version": "0.4.13",
        "argv": ("python", "-m", "lm_eval", "--model_args", "model=toy-7b,api_key=***"),
        "server_models": "toy-7b",
    }
    base.update(fields)
    return Outcome(**base)


def items() -> ItemScores:
    digest = docs_digest([(0, "h0"), (1, "h1")])
    return ItemScores(
        tasks={"arc": TaskItems((0, 1), digest, {"acc,none": metric_items([1, 0])})},
        server={"models": "toy-7b"},
    )


def test_every_field_comes_from_its_source() -> None:
    record = provenance.build(
        outcome=final(),
        started=None,
        results=results_doc(),
        image="lmeval:1",
        image_id=IMAGE_ID,
        items=items(),
    )
    status = record.status_fields()
    assert status == {
        "driver_version": "1.4.0",
        "lm_eval_version": "0.4.13",
        "image": "lmeval:1",
        "image_id": IMAGE_ID,
        "model": "local-completions",
        "model_name": "toy-7b",
        "server_models": "toy-7b",
        "seeds": {"random": 0, "numpy": 1234, "torch": 1234, "fewshot": 1234},
        "task_hashes": {"arc": HASH_A, "boolq": HASH_B},
        "argv": ["python", "-m", "lm_eval", "--model_args", "model=toy-7b,api_key=***"],
    }
    wire = api.Provenance.model_validate(status).model_dump(by_alias=True, exclude_none=True)
    assert wire["imageID"] == IMAGE_ID and wire["taskHashes"]["arc"] == HASH_A

    document = json.loads(record.document())
    assert document["imageID"] == IMAGE_ID and document["modelName"] == "toy-7b"
    assert document["taskHashes"] == {"arc": HASH_A, "boolq": HASH_B}
    assert document["server"] == {"models": "toy-7b"}
    assert document["tasks"]["arc"] == {
        "version": 1.0,
        "nShot": 0,
        "datasetPath": "allenai/ai2_arc",
        "datasetName": "ARC-Easy",
        "datasetRevision": "refs/convert/parquet",
        "hash": HASH_A,
        "docsSha256": docs_digest([(0, "h0"), (1, "h1")]),
        "items": 2,
    }
    assert document["tasks"]["boolq"] == {
        "version": 2,
        "nShot": 5,
        "datasetPath": "super_glue",
        "datasetName": "boolq",
        "hash": HASH_B,
    }


def test_the_started_marker_stands_in_for_an_older_final_marker() -> None:
    started = {
        "driver_version": "1.3.0",
        "lm_eval_version": "0.4.12",
        "argv": ["lm_eval", "--tasks", "arc"],
    }
    bare = final(driver_version=None, lm_eval_version=None, argv=())
    status = provenance.build(outcome=bare, started=started, results=None).status_fields()
    assert status is not None
    assert (status["driver_version"], status["lm_eval_version"]) == ("1.3.0", "0.4.12")
    assert status["argv"] == ["lm_eval", "--tasks", "arc"]
    # Nothing at all: nothing in status (a pod that never reported).
    assert provenance.build(outcome=None, started=None, results=None).status_fields() is None


def test_secrets_are_never_copied() -> None:
    secret_args = {
        "model": "local-completions",
        "model_args": "pretrained=https://user:hunter2@hub.example/m,token=SECRET-2,"
        "base_url=http://h/v1?api_key=SECRET-3",
    }
    leaky = final(argv=("lm_eval", "--model_args", "api_key=SECRET-4", "--api_key", "SECRET-5"))
    record = provenance.build(
        outcome=leaky,
        started=None,
        results=results_doc(
            config=secret_args,
            configs={"arc": {"dataset_path": "https://u:SECRET-6@data.example/arc"}},
        ),
    )
    text = json.dumps(record.status_fields()) + record.document()
    for secret in ("SECRET-1", "SECRET-2", "SECRET-3", "SECRET-4", "SECRET-5", "SECRET-6"):
        assert secret not in text
    assert "hunter2" not in text and "base_url" not in text
    assert record.model_name == "https://user:***@hub.example/m"
    assert record.argv == ("lm_eval", "--model_args", "api_key=***", "--api_key", "***")
    # A dict of model_args (lm_eval's Python API): only the name, still.
    dict_args = {"pretrained": "org/m", "api_key": "SECRET-7", "base_url": "http://h"}
    assert provenance.model_name(dict_args) == "org/m"
    assert provenance.model_name("base_url=http://h,api_key=k") is None
    # Redaction may lengthen a name ("token=x" -> "token=***"): still within bounds.
    assert provenance.model_name({"model": "m" * 505 + "token=x"}) is None
    assert provenance.model_name({"model": "m" * 503 + "token=x"}) == "m" * 503 + "token=***"


def test_hostile_values_are_left_out() -> None:
    hostile = results_doc(
        versions={"arc": True, "boolq": {"x": 1}, "copa": "v\x1b[31m", "piqa": float("inf")},
        **{"n-shot": {"arc": "5", "boolq": 2**70}},
        configs={"arc": {"dataset_path": ["a"], "dataset_name": "x" * 5000}, "boolq": "junk"},
        config={
            "model": 42,
            "model_args": {"pretrained": 7},
            "random_seed": True,
            "numpy_seed": 2**80,
            "torch_seed": "1",
            "fewshot_seed": 3.0,
        },
        task_hashes={"arc": "NOT-HEX", "boolq": HASH_B * 3, "bad\nname": HASH_A, "ok": HASH_A},
        lm_eval_version=["0.4"],
    )
    record = provenance.build(
        outcome=final(driver_version="1\x00", lm_eval_version="x" * 600, server_models=None),
        started={"driver_version": 5, "argv": "not a list"},
        results=hostile,
        image="i" * 600,
        image_id="sha256:\n",
    )
    assert record.task_hashes == {"ok": HASH_A}
    assert record.seeds == {}
    assert None is record.model is record.model_name is record.driver_version
    assert None is record.lm_eval_version is record.image is record.image_id
    assert record.tasks["arc"] == {}
    assert record.tasks["boolq"] == {}
    assert record.tasks["copa"] == record.tasks["piqa"] == {}
    json.loads(record.document(), parse_constant=lambda name: pytest.fail(name))
    assert "bad\nname" not in record.tasks
    status = record.status_fields()
    assert status is not None
    api.Provenance.model_validate(status)  # within the CRD's bounds


def test_status_stays_small_and_the_document_bounded() -> None:
    hashes = {f"task_{i:04d}": HASH_A for i in range(80)}
    argv = (*(f"--flag{i}={'v' * 100}" for i in range(300)), "x" * 5000)
    record = provenance.build(
        outcome=final(argv=argv), started=None, results=results_doc(task_hashes=hashes)
    )
    status = record.status_fields()
    assert status is not None
    assert len(status["task_hashes"]) == api.PROVENANCE_TASK_HASHES_MAX == 50
    assert sorted(status["task_hashes"])[0] == "task_0000"
    assert status["task_hashes_omitted"] == 30
    words = status["argv"]
    assert sum(len(w) for w in words[:-1]) <= provenance.STATUS_ARGV_CHARS
    assert words[-1] == f"... ({len(argv) - len(words) + 1} more words: provenance.json)"
    api.Provenance.model_validate(status)
    assert len(json.dumps(status)) < 12_000
    # provenance.json keeps every word (each bounded).
    document = json.loads(record.document())
    assert len(document["argv"]) == len(argv)
    assert document["argv"][-1] == "... (5000 characters)"  # no separator to cut at


def test_long_argv_words_are_cut_where_no_secret_is_split() -> None:
    url = "base_url=https://user:" + "p" * 40 + "@host/v1"
    word = "model=m," + "x" * 960 + "," + url + ",tokenizer_backend=remote"
    record = provenance.build(outcome=final(argv=("lm_eval", word)), started=None, results=None)
    kept = record.argv[1]
    assert kept == "model=m," + "x" * 960 + f"... ({len(word)} characters)"
    assert "p" * 10 not in json.dumps(record.status_fields()) + record.document()
    # Hostile text that the redaction's patterns would chew on for seconds is cut first.
    hostile = ("a" * 32_000 + "://", "{" + "b" * 32_000 + "}")
    record = provenance.build(outcome=final(argv=hostile), started=None, results=None)
    assert all(len(w) <= api.PROVENANCE_ARG_MAX for w in record.argv)

    # Thousands of tasks with long names: the document stops at its bound and says so.
    many = {f"{'t' * 400}{i:05d}": HASH_A for i in range(4000)}
    big = provenance.build(outcome=None, started=None, results={"task_hashes": many})
    text = big.document()
    assert len(text.encode()) <= provenance.DOCUMENT_MAX_BYTES
    document = json.loads(text)
    assert document["tasksOmitted"] == 4000 - len(document["tasks"]) > 0
    assert set(document["taskHashes"]) == set(document["tasks"])


def test_a_merged_job_records_one_entry_per_shard_each_value_checked() -> None:
    shards = (
        {"index": 0, "documents": 10, "requests": 40, "cached": 12,
         "samples_sha256": HASH_A, "summary": "shard 0/2: 40 requests, 12 answered from the cache"},
        # A hostile pod's: a count past int64 or negative, a digest that is not
        # hex and a summary with control characters are left out.
        {"index": 1, "documents": 10, "requests": 2**70, "cached": -1,
         "samples_sha256": "not-hex", "summary": "forged\x1b[2J"},
    )  # fmt: skip
    outcome = Outcome("completed", 0, None, "", None, shards=shards)  # type: ignore[arg-type]
    built = provenance.build(outcome=outcome, started=None, results=results_doc())
    document = json.loads(built.document())
    assert document["shards"] == [
        {"index": 0, "documents": 10, "requests": 40, "cached": 12, "samplesSha256": HASH_A,
         "summary": "shard 0/2: 40 requests, 12 answered from the cache"},
        {"index": 1, "documents": 10},
    ]  # fmt: skip
    # status.provenance stays short: no shard list there.
    assert "shards" not in (built.status_fields() or {})
    single = provenance.build(
        outcome=Outcome("completed", 0, None, "", None), started=None, results=None
    )
    assert "shards" not in json.loads(single.document())
