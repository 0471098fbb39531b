"""A hostile run's provenance and per-item scores on the real control plane.

A job's pod exits 0 after printing what its author chose (served by kwok as
the container log): results whose config holds secrets in model_args, 80
task hashes with long names, booleans and strings for seeds; a final marker
whose argv holds a secret, control characters and words of 3,000
characters; items markers that arrive intact but do not decode. Checks: the
job Succeeds with its results, in a few cycles and without a cycle error;
the apiserver accepts the status (every bound of status.provenance in the
CRD holds); 50 task hashes are in status and the other 30 counted; no
secret is in status.provenance, provenance.json, status.results or
results.json (lm_eval's echo of model_args and dataset URLs is kept with
its secrets hidden, scores and hashes as written); itemScores says the items
were invalid and none are stored; provenance.json is beside the results.
And in exec mode (results read by exec'ing cat in the held container), the
per-item scores still come from the log and are stored beside the exec'd
results.
"""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

import pytest
from kubernetes import client
from lmeval_sandbox import kwok

from driver.itemscores import (
    ItemScores,
    TaskItems,
    decode_item_scores,
    docs_digest,
    encode_item_scores,
    metric_items,
)
from driver.protocol import encode_items, encode_marker, encode_results
from poller import api
from poller.cycle.reconciler import Reconciler
from poller.results import lmeval
from tests.cluster.test_hostile_logs import _terminated, finish_within, running_pod, serve
from tests.poller_fixtures import BASE_SETTINGS, Jobs, cycle_until, set_settings, terminate
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

HASHES = {f"{'task' * 60}_{i:03d}": f"{i:064x}" for i in range(80)}
RESULTS = {
    "results": {"toy": {"acc,none": 0.75}},
    "config": {
        "model": "local-completions",
        "model_args": "model=org/m,base_url=http://u:SECRET-URL@h/v1,api_key=SECRET-ARG",
        "random_seed": True,
        "numpy_seed": "1234",
        "torch_seed": 1234,
        "fewshot_seed": None,
    },
    "configs": {"toy": {"dataset_path": "https://x:SECRET-DATA@d.example/toy"}},
    "task_hashes": HASHES,
}
ARGV = [
    "lm_eval",
    "--api_key",
    "SECRET-FLAG",
    "--gen_kwargs=\x1b[31mred\x00",
    *["w" * 3000 for _ in range(4)],
]


def hostile_log() -> str:
    lines = [
        encode_marker("started", run_id="r", argv=["x"] * 5),
        *encode_results(json.dumps(RESULTS).encode(), "r"),
        *encode_items(b'{"format": 1, "tasks": {"toy": {"n": 3, "doc_ids": "all"}}}', "r"),
        encode_marker(
            "completed",
            run_id="r",
            exit_code=0,
            message="lm_eval completed",
            argv=ARGV,
            driver_version="9.9\n9",
            server_models="m" * 5000,
        ),
    ]
    return "\n".join(lines) + "\n"


def test_a_hostile_runs_provenance_is_bounded_and_keeps_no_secret(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, tmp_path: Path
) -> None:
    pod = running_pod(poller, jobs, "hostile-provenance")
    serve(admin_api, jobs.namespace, pod, hostile_log(), tmp_path)
    terminate(admin_api, jobs.namespace, pod, 0)
    wait_for(lambda: _terminated(jobs, pod), what=f"{pod} terminated")
    final = finish_within(poller, jobs, "hostile-provenance", cycles=3)
    assert final["reason"] == "Succeeded", final["message"]

    provenance = final["provenance"]
    assert len(provenance["taskHashes"]) == api.PROVENANCE_TASK_HASHES_MAX
    assert provenance["taskHashesOmitted"] == 30
    assert provenance["seeds"] == {"torch": 1234}
    assert provenance["modelName"] == "org/m"
    assert "driverVersion" not in provenance and "serverModels" not in provenance
    assert provenance["argv"][:4] == [
        "lm_eval",
        "--api_key",
        "***",
        "--gen_kwargs=\ufffd[31mred\ufffd",
    ]
    assert all(len(word) <= api.PROVENANCE_ARG_MAX for word in provenance["argv"])
    assert final["itemScores"]["stored"] == "None"
    assert final["itemScores"]["message"].startswith("per-item scores not stored, invalid: ")

    stored = jobs.core.read_namespaced_config_map("hostile-provenance-results", jobs.namespace)
    assert lmeval.ITEMS_KEY not in (stored.binary_data or {})
    document = json.loads(stored.data[lmeval.PROVENANCE_KEY])
    assert document["taskHashes"] == HASHES
    assert document["tasks"]["toy"]["datasetPath"] == "https://x:***@d.example/toy"
    # lm_eval's config echoes model_args and its task configs dataset URLs:
    # status.results and results.json keep them with the secrets hidden, the
    # scores and hashes as written; the provenance copies nothing but the name.
    shown = json.loads(final["results"])
    assert shown["results"] == RESULTS["results"] and shown["task_hashes"] == HASHES
    assert shown["config"]["model_args"] == "model=org/m,base_url=http://u:***@h/v1,api_key=***"
    assert shown["configs"]["toy"]["dataset_path"] == "https://x:***@d.example/toy"
    assert json.loads(stored.data[lmeval.RESULTS_KEY]) == shown
    kept = json.dumps(provenance) + json.dumps(final["itemScores"]) + json.dumps(document)
    kept += final["results"] + stored.data[lmeval.RESULTS_KEY]
    for secret in ("SECRET-URL", "SECRET-ARG", "SECRET-DATA", "SECRET-FLAG"):
        assert secret not in kept


def test_exec_mode_stores_the_items_from_the_log_beside_the_execd_results(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, tmp_path: Path
) -> None:
    set_settings(admin_api, {**BASE_SETTINGS, "results-source": "exec"})
    execd = {"results": {"toy": {"acc,none": 0.5}}, "config": {"model": "dummy"}}
    (tmp_path / "results.json").write_text(json.dumps(execd))
    pod = running_pod(poller, jobs, "held-items")
    client.CustomObjectsApi(admin_api).create_namespaced_custom_object(
        "kwok.x-k8s.io",
        "v1alpha1",
        jobs.namespace,
        "execs",
        kwok.exec_body(jobs.namespace, pod, tmp_path, env={"PATH": "/usr/bin:/bin"}),
    )
    values = [1, 0, 1, 1]
    raw = encode_item_scores(
        ItemScores(
            tasks={
                "toy": TaskItems(
                    (0, 1, 2, 3),
                    docs_digest((i, f"h{i}") for i in range(4)),
                    {"acc,none": metric_items(values)},
                )
            }
        )
    )
    log = [
        encode_marker("started", run_id="r", argv=["lm_eval", "--log_samples"]),
        *encode_results(json.dumps(RESULTS).encode(), "r"),
        *encode_items(raw, "r"),
        encode_marker(
            "completed", run_id="r", exit_code=0, results_path=str(tmp_path / "results.json")
        ),
    ]
    serve(admin_api, jobs.namespace, pod, "\n".join(log) + "\n", tmp_path)
    stored = cycle_until(
        poller,
        lambda: jobs.status("held-items").get("results") and jobs.status("held-items"),
        what="results read while held",
    )
    assert stored["resultsSource"] == "exec"
    assert json.loads(stored["results"]) == execd
    assert stored["itemScores"] == {
        "stored": "ConfigMap",
        "tasks": 1,
        "items": 4,
        "bytes": len(raw),
    }
    assert stored["provenance"]["argv"] == ["lm_eval", "--log_samples"]
    configmap = jobs.core.read_namespaced_config_map("held-items-results", jobs.namespace)
    packed = base64.b64decode(configmap.binary_data[lmeval.ITEMS_KEY])
    assert decode_item_scores(gzip.decompress(packed)).tasks["toy"].metrics["acc,none"].values == (
        1.0,
        0.0,
        1.0,
        1.0,
    )
    assert json.loads(configmap.data[lmeval.PROVENANCE_KEY])["model"] == "dummy"
