"""The results ConfigMap's packed form, read back by every reader within the results' limit.

Checks: results the poller packed into binaryData (RESULTS_GZ_KEY) read back
as the same JSON through `packed_results_text`, the one reader the gate and
`lmeval results` share; a packed value that inflates past the results' own
limit (protocol.MAX_RESULTS_BYTES) is refused before it is inflated further,
as is one that is not gzip or not text; and the controller of an object is
told by `ownership.controller_uid`, which the results, items and task
snapshot readers use alike. And `without_secrets`: lm_eval's echo of
model_args (a string or a dict) and of task configs' dataset URLs keeps
nothing secret, the scores and everything without a secret stay exactly as
written, and past the scan's budget (bytes, or task configs) a config is
left out and counted, never kept unscanned.
"""

from __future__ import annotations

import json

import pytest

from driver.protocol import MAX_RESULTS_BYTES
from poller.decisions import ownership
from poller.results import lmeval


def test_packed_results_read_back_as_written() -> None:
    written = {"results": {"arc_easy": {"acc,none": 0.5}}, "configs": {"arc_easy": {}}}
    manifest = lmeval.results_configmap(
        namespace="ns",
        job_name="job",
        job_uid="uid-1",
        results=written,
        labels={},
        compress=True,
    )
    assert lmeval.RESULTS_KEY not in (manifest.get("data") or {})
    packed = manifest["binaryData"][lmeval.RESULTS_GZ_KEY]
    assert json.loads(lmeval.packed_results_text(packed)) == written
    assert ownership.controller_uid(manifest) == "uid-1"


def test_a_packed_bomb_is_refused_at_the_results_limit() -> None:
    bomb = lmeval.gzip_base64(b" " * (MAX_RESULTS_BYTES + 1))
    with pytest.raises(ValueError, match=f"more than {MAX_RESULTS_BYTES} bytes"):
        lmeval.packed_results_text(bomb)


@pytest.mark.parametrize(
    ("encoded", "what"),
    [
        ("not base64!", "is not base64"),
        (lmeval.gzip_base64(b"\xff\xfe results"), "is not UTF-8"),
        ("aGVsbG8=", "is not gzip"),
    ],
)
def test_packed_results_that_are_not_gzip_text_are_refused(encoded: str, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        lmeval.packed_results_text(encoded)


def test_controller_uid_is_the_controlling_reference_only() -> None:
    refs = [
        {"uid": "a", "controller": False},
        {"uid": "b"},
        "junk",
        {"uid": "c", "controller": True},
    ]
    assert ownership.controller_uid({"metadata": {"ownerReferences": refs}}) == "c"
    assert ownership.controller_uid({"metadata": {"ownerReferences": refs[:2]}}) is None
    assert ownership.controller_uid({"metadata": {}}) is None
    assert ownership.controller_uid({}) is None


LEAKY = {
    "results": {"toy": {"acc,none": 0.5, "alias": "toy"}},
    "config": {
        "model": "local-completions",
        "model_args": "model=m,base_url=https://u:SECRET-1@h/v1,api_key=SECRET-2,max_tokens=8",
        "gen_kwargs": {"temperature": 0},
    },
    "configs": {
        "toy": {
            "dataset_path": "https://x:SECRET-3@d.example/toy",
            "dataset_kwargs": {"token": "SECRET-4", "revision": "r1"},
            "doc_to_text": '{"q": "{{question}}"}',
            "num_fewshot": 2,
        }
    },
    "task_hashes": {"toy": "ab" * 32},
    "n-shot": {"toy": 2},
}


def test_without_secrets_hides_what_lm_eval_echoes_and_keeps_the_rest() -> None:
    shown = lmeval.without_secrets(LEAKY)
    text = json.dumps(shown)
    for secret in ("SECRET-1", "SECRET-2", "SECRET-3", "SECRET-4"):
        assert secret not in text
    assert shown["config"]["model_args"] == (
        "model=m,base_url=https://u:***@h/v1,api_key=***,max_tokens=8"
    )
    assert shown["configs"]["toy"]["dataset_kwargs"] == {"token": "***", "revision": "r1"}
    # A JSON-looking template with nothing secret stays byte for byte.
    assert shown["configs"]["toy"]["doc_to_text"] == '{"q": "{{question}}"}'
    for key in ("results", "task_hashes", "n-shot"):
        assert shown[key] == LEAKY[key]
    assert LEAKY["config"]["model_args"].endswith("max_tokens=8")  # the input is not changed


def test_without_secrets_reads_model_args_as_lm_eval_writes_them_as_a_dict() -> None:
    found = {"config": {"model_args": {"pretrained": "/cache/m", "api_key": "SECRET-5"}}}
    assert lmeval.without_secrets(found)["config"]["model_args"] == {
        "pretrained": "/cache/m",
        "api_key": "***",
    }


def test_results_without_secrets_are_unchanged() -> None:
    clean = {k: v for k, v in LEAKY.items() if k not in ("config", "configs")}
    clean["config"] = {"model": "dummy", "model_args": "", "random_seed": 0}
    assert lmeval.without_secrets(clean) == clean


def test_configs_past_the_scan_budget_are_left_out_and_counted() -> None:
    big = "x" * (lmeval.ECHO_SCAN_BUDGET // 2)
    found = {
        "config": {"model_args": "api_key=SECRET-6"},
        "configs": {
            "a": {"doc_to_text": big},
            "b": {"doc_to_text": big, "dataset_path": "https://u:SECRET-7@h/d"},
            "c": {"dataset_path": "https://u:SECRET-8@h/d"},
        },
    }
    shown = lmeval.without_secrets(found)
    assert shown["configs"]["a"] == {"doc_to_text": big}
    assert set(shown["configs"]) == {"a", lmeval.OMITTED_KEY}
    assert shown["configs"][lmeval.OMITTED_KEY].startswith("2 task configs, past")
    assert "SECRET" not in json.dumps(shown)
    # A config that alone is over the budget is left out as a whole.
    huge = {"config": {"model_args": "api_key=SECRET-9," + big + big}}
    assert "SECRET" not in json.dumps(lmeval.without_secrets(huge))


def test_task_configs_past_the_count_are_left_out_and_counted() -> None:
    configs = {f"t{i}": {"dataset_path": "https://u:SECRET@h/d"} for i in range(2500)}
    shown = lmeval.without_secrets({"configs": configs})["configs"]
    assert len(shown) == lmeval.ECHO_SCAN_TASKS + 1
    assert shown[lmeval.OMITTED_KEY] == "500 task configs, past the secret scan's budget"
    assert shown["t0"] == {"dataset_path": "https://u:***@h/d"}
    assert "SECRET" not in json.dumps(shown)
