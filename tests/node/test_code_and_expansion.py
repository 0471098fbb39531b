"""On a real kubelet: planted code in a shared cache never runs, and $(VAR) never expands.

Two holes the red team found (issue 28, items 1 and 6), closed where they
were open, on the real node (kubelet, containerd, runc):

- a read-only claim that holds, beside the ``allenai/ai2_arc`` dataset of
  lm_eval's standard ``arc_easy`` task, ``datasets--lm_eval``,
  ``datasets--datasets`` and ``datasets--transformers`` repositories whose
  snapshots are Python packages that print ``HOSTILE CODE RAN`` (what a
  co-tenant who may mount the claim can write). The job succeeds on the rows
  written here, its log has no such line and names the repositories it did
  not expose; runc was told to run ``python -P -m lm_eval`` with
  ``PYTHONSAFEPATH=1`` in the evaluation's environment;
- a job whose ``modelArgs`` value is ``$(SOME_VAR)``, with ``spec.pod.env``
  defining ``SOME_VAR`` (as ``true,verify_certificate=False`` once added
  pairs to ``--model_args``), and a variable whose value is ``$(HOME)``: the
  results' ``config.model_args`` has ``probe: $(SOME_VAR)`` and no added
  pair, and the process runc started got the literal texts in its argv and
  environment.
  The sidecar, the user's own container, keeps the kubelet's expansion.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.driver.test_code_from_cache import HIJACKED, write_code_snapshot
from tests.hubcache import tree_state, write_arc_easy
from tests.node.conftest import NodeCluster, served_job
from tests.node.test_air_gapped import (
    _arc_job,
    _assert_arc_easy,
    _kept_pod,
    _readable_by_anyone,
    _runtime_specs,
    _static_claim,
)

pytestmark = [pytest.mark.node, pytest.mark.lmeval]

HOSTILE = "HOSTILE CODE RAN"


def _logs(cluster: NodeCluster, namespace: str, pod: dict[str, Any], container: str) -> str:
    return cluster.kubectl("logs", pod["metadata"]["name"], "-c", container, "-n", namespace)


def _env(spec: dict[str, Any]) -> dict[str, str]:
    return dict(entry.split("=", 1) for entry in spec["process"]["env"])


def test_packages_planted_in_a_shared_claim_never_run(
    node_cluster: NodeCluster, job_namespace: str
) -> None:
    storage = node_cluster.workdir / "storage" / job_namespace
    write_arc_easy(storage / "hub")
    for name in HIJACKED:
        # The canary file would be in the pod's /tmp; the log line is what we see.
        write_code_snapshot(storage / "hub", name, "/tmp/hostile-canary")
    _readable_by_anyone(storage)
    before = tree_state(storage)
    _static_claim(node_cluster, job_namespace, "shared-cache", storage)

    job = _arc_job(node_cluster, "planted", {"pvcName": "shared-cache"})
    node_cluster.apply(job, namespace=job_namespace)
    _assert_arc_easy(node_cluster.wait_final(job_namespace, "planted"))

    pod = _kept_pod(node_cluster, job_namespace, "planted")
    log = _logs(node_cluster, job_namespace, pod, "lmeval")
    assert HOSTILE not in log
    assert "3 repository(ies) of /cache/storage/hub not exposed" in log, log[-3000:]
    main = _runtime_specs(node_cluster, pod, "containerStatuses")["lmeval"]
    args = main["process"]["args"]
    child = args[args.index("--") + 1 :]
    assert child[:4] == ["python", "-P", "-m", "lm_eval"], args
    assert _env(main)["PYTHONSAFEPATH"] == "1"
    assert tree_state(storage) == before


def test_the_kubelet_passes_spec_strings_literally(
    node_cluster: NodeCluster, job_namespace: str
) -> None:
    configmap, job = served_job(node_cluster, "literal")
    job["spec"]["modelArgs"].append({"name": "probe", "value": "$(SOME_VAR)"})
    job["spec"]["pod"]["env"] = [
        {"name": "SOME_VAR", "value": "true,verify_certificate=False"},
        {"name": "LITERAL_HOME", "value": "$(HOME)"},
    ]
    (sidecar,) = job["spec"]["pod"]["sidecars"]
    sidecar["env"] = [*sidecar.get("env", []), {"name": "EXPANDED", "value": "at $(SIDECAR_X)"}]
    sidecar["env"].insert(0, {"name": "SIDECAR_X", "value": "expanded"})
    node_cluster.apply(configmap, job, namespace=job_namespace)
    status = node_cluster.wait_final(job_namespace, "literal")
    assert status["reason"] == "Succeeded", status.get("message")
    results = json.loads(status["results"])
    # lm_eval echoes the pairs it parsed: the literal text, no pair added.
    model_args = results["config"]["model_args"]
    assert model_args["probe"] == "$(SOME_VAR)", model_args
    assert "verify_certificate" not in model_args

    pod = _kept_pod(node_cluster, job_namespace, "literal")
    specs = _runtime_specs(node_cluster, pod, "containerStatuses")
    main = specs["lmeval"]
    tokens = [a for a in main["process"]["args"] if a.startswith("--model_args=")]
    assert tokens and tokens[0].endswith(",probe=$(SOME_VAR)"), main["process"]["args"]
    env = _env(main)
    assert env["LITERAL_HOME"] == "$(HOME)"
    assert env["SOME_VAR"] == "true,verify_certificate=False"
    # The user's sidecar is theirs: the kubelet expands there as it always did.
    (server,) = (spec for name, spec in specs.items() if name != "lmeval")
    assert _env(server)["EXPANDED"] == "at expanded"
