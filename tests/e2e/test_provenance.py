"""A finished run's provenance and per-item scores, end to end with real lm_eval.

The served-model sample (lm_eval's local-completions against the sandbox's
model server) runs with logSamples through the poller, the real driver and
the local pod runner. Checks: status.provenance holds the driver's and
lm_eval's versions, the redacted argv, the model type and name (never the
rest of model_args), lm_eval's seeds, taskHashes equal to the task_hashes
in the results file lm_eval wrote, and the image and imageID exactly as the
runner reported them in the pod's status; the results ConfigMap holds
provenance.json with the same values and every task's dataset; and the
per-item scores are stored gzip'd beside them (status.itemScores counts
them; they decode, one value per document of each task).
"""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox.model_server import ModelServer
from lmeval_sandbox.runner import LocalRunner

import driver
from driver.itemscores import decode_item_scores
from poller.cycle.reconciler import Reconciler
from poller.results import lmeval
from tests.e2e.conftest import results_file, sample, submit
from tests.poller_fixtures import Jobs, cycle_until

pytestmark = [pytest.mark.cluster, pytest.mark.lmeval]

LMEVAL_TIMEOUT = 240.0
NAME = "provenance"


def _complete(jobs: Jobs) -> dict[str, Any] | None:
    status = jobs.status(NAME)
    return status if status.get("state") == "Complete" else None


def test_a_finished_run_keeps_its_provenance_and_item_scores(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    runner: LocalRunner,
    model_server: ModelServer,
) -> None:
    _, job = sample("served-model", model_server.port)
    job["metadata"]["name"] = NAME
    job["spec"]["logSamples"] = True
    submit(admin_api, jobs.namespace, job)
    final = cycle_until(poller, lambda: _complete(jobs), timeout=LMEVAL_TIMEOUT, what="Complete")
    assert final["reason"] == "Succeeded", final.get("message")

    root = runner.pod_root(jobs.namespace, final["podName"])
    assert root is not None
    written = results_file(root)
    config = written["config"]
    provenance = final["provenance"]
    assert provenance["driverVersion"] == driver.__version__
    assert provenance["lmEvalVersion"] == written["lm_eval_version"]
    argv = provenance["argv"]
    assert "lm_eval" in argv and "--log_samples" in argv
    assert "--tasks=sample_arith_mc,sample_arith_gen" in argv
    assert (provenance["model"], provenance["modelName"]) == ("local-completions", "toy")
    assert provenance["serverModels"] == model_server.model  # what its /v1/models lists
    assert provenance["seeds"] == {
        "random": config["random_seed"],
        "numpy": config["numpy_seed"],
        "torch": config["torch_seed"],
        "fewshot": config["fewshot_seed"],
    }
    assert provenance["taskHashes"] == written["task_hashes"]
    assert len(json.dumps(provenance, separators=(",", ":"))) < 2048  # 1,029 bytes measured
    assert set(written["task_hashes"]) == {"sample_arith_mc", "sample_arith_gen"}

    pod = jobs.pod(final["podName"])
    (main,) = [c for c in pod.status.container_statuses if c.name == "lmeval"]
    assert provenance["image"] == main.image == pod.spec.containers[0].image
    # The local runner reports no imageID (no image was pulled): none in status
    # either. The real node's digest is checked in tests/node.
    assert provenance.get("imageID") == (main.image_id or None)

    stored = jobs.core.read_namespaced_config_map(f"{NAME}-results", jobs.namespace)
    document = json.loads(stored.data[lmeval.PROVENANCE_KEY])
    assert document["taskHashes"] == written["task_hashes"]
    assert document["argv"] == argv and document["modelName"] == "toy"
    for task, entry in document["tasks"].items():
        assert entry["datasetPath"] == written["configs"][task]["dataset_path"] == "json"
        assert entry["version"] == written["versions"][task]
        assert entry["nShot"] == written["n-shot"][task]
    # Of model_args only the name: the server's URL is in the argv alone.
    assert "base_url" not in json.dumps({k: v for k, v in document.items() if k != "argv"})

    items = final["itemScores"]
    assert items["stored"] == "ConfigMap", items
    packed = base64.b64decode(stored.binary_data[lmeval.ITEMS_KEY])
    scores = decode_item_scores(gzip.decompress(packed))
    assert set(scores.tasks) == {"sample_arith_mc", "sample_arith_gen"}
    samples = {t: written["n-samples"][t]["effective"] for t in scores.tasks}
    for task, entry in scores.tasks.items():
        assert len(entry.doc_ids) == samples[task]
        assert document["tasks"][task]["docsSha256"] == entry.docs_sha256
    assert (items["tasks"], items["items"]) == (2, sum(samples.values()))
