"""The regression gate end to end: real lm_eval, the real driver, the poller, kubectl wait.

Two sample model servers on loopback: a good one, and the same model made
worse on purpose (``wrong_share``: 30% of the prompts, chosen by their hash,
are answered wrongly). A generate_until task of 150 questions whose targets
are what the good server answers runs through the poller and the local
runner (the job pod as local processes):

- the baseline (logSamples) on the good server, created suspended so that
  the gated jobs finish first: they show ``Regressed=Unknown``
  WaitingForBaseline, re-checked every cycle;
- a gated job on the worse server ends Succeeded with ``Regressed=True``,
  its numbers those of the paired test over the 150 documents: exactly the
  items the server answered wrongly flipped, and none the other way;
- a second run of the good model gated on the baseline: ``Regressed=False``
  (no item differs), and the real ``kubectl wait
  --for=condition=Regressed=false`` returns 0 on it (and ``=true`` on the
  worse one), ``kubectl get -o wide`` shows both in its Regressed column;
  the Prometheus series carry both verdicts;
- a gated job whose baseline does not exist shows BaselineMissing; once a
  job of that name ends Cancelled, BaselineFailed;
- the apiserver refuses a gate without a baseline and a job that names
  itself as its baseline.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.model_server import ModelServer
from lmeval_sandbox.runner import LocalRunner
from prometheus_client import CollectorRegistry

from poller import api
from poller.cycle.reconciler import Reconciler
from poller.jobmetrics import JobCollector
from tests.poller_fixtures import Jobs, cycle_until

pytestmark = [pytest.mark.cluster, pytest.mark.lmeval]

LMEVAL_TIMEOUT = 300.0
ITEMS = 150
WRONG_SHARE = 0.3
TASK = "gate_arith"
METRIC = "exact_match,none"
TASKS_CONFIGMAP = "gate-tasks"
GATE = {"task": TASK, "metric": METRIC, "maxDrop": 0.0, "alpha": 0.05}
# The session runner's local-process node (tainted: jobs must ask for it).
LOCAL_POD = {
    "nodeSelector": {"sandbox.lmeval.io/local": "true"},
    "tolerations": [
        {
            "key": "sandbox.lmeval.io/local",
            "operator": "Equal",
            "value": "true",
            "effect": "NoSchedule",
        }
    ],
}


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[ModelServer, ModelServer]]:
    """(the good model, the same model answering 30% of the prompts wrongly)."""
    with (
        ModelServer(generation_text="42") as good,
        ModelServer(generation_text="42", wrong_share=WRONG_SHARE) as worse,
    ):
        yield good, worse


def _tasks_configmap() -> client.V1ConfigMap:
    """A generate_until task whose targets are what the good server answers ("42")."""
    rows = [{"question": f"What is {i} plus {42 - i}?", "answer": "42"} for i in range(ITEMS)]
    task = {
        "task": TASK,
        "dataset_path": "json",
        "dataset_kwargs": {
            "data_files": {"test": f"/opt/lmeval/tasks/{TASKS_CONFIGMAP}/questions.jsonl"}
        },
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "Question: {{question}}\nAnswer:",
        "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 16},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
    }
    return client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=TASKS_CONFIGMAP),
        data={
            f"{TASK}.yaml": json.dumps(task),  # JSON is YAML
            "questions.jsonl": "".join(json.dumps(row) + "\n" for row in rows),
        },
    )


def _spec(server: ModelServer, **extra: Any) -> dict[str, Any]:
    return {
        "model": "local-completions",
        "modelArgs": [
            {"name": "model", "value": "toy"},
            {"name": "base_url", "value": server.completions_url},
            {"name": "tokenizer_backend", "value": "remote"},
        ],
        "tasks": [TASK],
        "customTasks": [{"configMap": TASKS_CONFIGMAP}],
        "pod": LOCAL_POD,
        **extra,
    }


def _create(jobs: Jobs, name: str, spec: dict[str, Any]) -> None:
    body = {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": spec,
    }
    jobs.custom.create_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL, body
    )


def _regressed(status: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == "Regressed"), None)


def _reasons(poller: Reconciler, jobs: Jobs, wanted: dict[str, str], what: str) -> dict[str, Any]:
    """Cycle until each job's condition Regressed has the wanted reason; their statuses."""

    seen: dict[str, Any] = {}

    def probe() -> dict[str, Any] | None:
        statuses = {name: jobs.status(name) for name in wanted}
        seen.update(
            {name: _regressed(status) or status.get("state") for name, status in statuses.items()}
        )
        for name, reason in wanted.items():
            condition = _regressed(statuses[name])
            if condition is None or condition["reason"] != reason:
                return None
        return statuses

    try:
        found: dict[str, Any] = cycle_until(poller, probe, timeout=LMEVAL_TIMEOUT, what=what)
    except AssertionError as error:
        raise AssertionError(f"{error}; last seen: {seen}") from None
    return found


def test_the_gate_tells_a_regression_from_the_same_model(
    poller: Reconciler,
    jobs: Jobs,
    runner: LocalRunner,
    control_plane: ControlPlane,
    servers: tuple[ModelServer, ModelServer],
) -> None:
    good, worse = servers
    jobs.core.create_namespaced_config_map(jobs.namespace, _tasks_configmap())
    gated = {"baseline": "gate-base", "gate": GATE}
    _create(jobs, "gate-base", _spec(good, logSamples=True, suspend=True))
    _create(jobs, "gate-worse", _spec(worse, **gated))
    _create(jobs, "gate-same", _spec(good, **gated))
    _create(jobs, "gate-orphan", _spec(good, limit="5", baseline="gate-nobody", gate=GATE))

    # The gated jobs finish first; the baseline waits (suspended).
    waiting = _reasons(
        poller,
        jobs,
        {
            "gate-worse": "WaitingForBaseline",
            "gate-same": "WaitingForBaseline",
            "gate-orphan": "BaselineMissing",
        },
        "the gated jobs finished, waiting for their baselines",
    )
    for name, status in waiting.items():
        assert status["reason"] == "Succeeded", (name, status.get("message"))
        condition = _regressed(status)
        assert condition is not None and condition["status"] == "Unknown"
        assert status["gate"]["verdict"] == "Unknown"
    assert "(it is Suspended)" in _regressed(waiting["gate-worse"])["message"]  # type: ignore[index]
    missing = _regressed(waiting["gate-orphan"])["message"]  # type: ignore[index]
    assert (
        f"LMEvalJob gate-nobody (spec.baseline) does not exist in namespace {jobs.namespace}"
        in (missing)
    )
    pod_spec = jobs.pod(waiting["gate-worse"]["podName"]).spec
    assert pod_spec is not None and "--log_samples" in (pod_spec.containers[0].command or [])

    # Level-triggered: a baseline that appears and ends Cancelled is seen.
    _create(jobs, "gate-nobody", _spec(good, cancel=True))
    failed = _reasons(poller, jobs, {"gate-orphan": "BaselineFailed"}, "orphan BaselineFailed")
    assert "baseline gate-nobody ended Cancelled" in _regressed(failed["gate-orphan"])["message"]  # type: ignore[index]

    # The baseline runs; both verdicts follow.
    jobs.custom.patch_namespaced_custom_object(
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.PLURAL,
        "gate-base",
        {"spec": {"suspend": False}},
    )
    done = _reasons(
        poller,
        jobs,
        {"gate-worse": "Regressed", "gate-same": "NotRegressed"},
        "the verdicts",
    )
    assert jobs.status("gate-base")["reason"] == "Succeeded"
    wrong = worse.count("wrong-answers")
    assert 0.15 * ITEMS < wrong < 0.45 * ITEMS, wrong

    regressed, same = done["gate-worse"], done["gate-same"]
    assert regressed["reason"] == same["reason"] == "Succeeded"  # the gate is not the outcome
    condition = _regressed(regressed)
    assert condition is not None and condition["status"] == "True"
    numbers = regressed["gate"]
    assert numbers["paired"] == ITEMS and numbers["final"] is True
    assert numbers["baselineScore"] == 1.0
    assert numbers["score"] == pytest.approx(1 - wrong / ITEMS)
    assert numbers["difference"] == pytest.approx(-wrong / ITEMS)
    assert (numbers["baselineOnly"], numbers["candidateOnly"]) == (wrong, 0)
    assert numbers["pValue"] < 1e-6 and numbers["ciHigh"] < 0
    assert numbers["baseline"] == "gate-base" and numbers["test"]
    assert condition["message"] and condition["reason"] == "Regressed"
    # The job's own results agree with the gate's mean.
    score = json.loads(jobs.get("gate-worse")["status"]["results"])["results"][TASK][METRIC]
    assert score == pytest.approx(numbers["score"])

    unchanged = _regressed(same)
    assert unchanged is not None and unchanged["status"] == "False"
    assert same["gate"]["difference"] == 0 and same["gate"]["pValue"] == 1.0
    assert (same["gate"]["baselineOnly"], same["gate"]["candidateOnly"]) == (0, 0)

    # What a pipeline runs.
    ref = f"{api.PLURAL}.{api.API_GROUP}"
    for name, wanted in (("gate-same", "false"), ("gate-worse", "true")):
        waited = control_plane.kubectl(
            "wait",
            "-n",
            jobs.namespace,
            f"--for=condition=Regressed={wanted}",
            f"{ref}/{name}",
            "--timeout=20s",
            check=False,
        )
        assert waited.returncode == 0, waited.stderr
    refused = control_plane.kubectl(
        "wait",
        "-n",
        jobs.namespace,
        "--for=condition=Regressed=false",
        f"{ref}/gate-worse",
        "--timeout=2s",
        check=False,
    )
    assert refused.returncode != 0
    wide = control_plane.kubectl("get", "-n", jobs.namespace, ref, "-o", "wide").stdout
    header, *rows = wide.splitlines()
    column = header.index("REGRESSED")
    shown = {row.split()[0]: (row[column:].split() or [""])[0] for row in rows}
    assert (shown["gate-worse"], shown["gate-same"], shown["gate-base"]) == ("True", "False", ""), (
        wide
    )

    # A final verdict is kept: further cycles write nothing for these jobs.
    before = {name: jobs.get(name)["metadata"]["resourceVersion"] for name in done}
    report = poller.run_cycle()
    assert report.errors == 0, report.error_messages
    assert {name: jobs.get(name)["metadata"]["resourceVersion"] for name in done} == before

    # The Prometheus series of the outcome.
    registry = CollectorRegistry()
    collector = JobCollector()
    registry.register(collector)
    collector.update(report.snapshot, report.retained)  # finished jobs: kept between sweeps
    labels = {"namespace": jobs.namespace, "baseline": "gate-base", "task": TASK, "metric": METRIC}
    assert (
        registry.get_sample_value("lmeval_job_regressed", {**labels, "lmevaljob": "gate-worse"})
        == 1
    )
    assert (
        registry.get_sample_value("lmeval_job_regressed", {**labels, "lmevaljob": "gate-same"}) == 0
    )
    orphan = {**labels, "baseline": "gate-nobody", "lmevaljob": "gate-orphan"}
    assert registry.get_sample_value("lmeval_job_regressed", orphan) is None


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"gate": GATE}, "spec.gate needs spec.baseline"),
        ({"baseline": "refused", "gate": GATE}, "spec.baseline names this job itself"),
        ({"baseline": "Not_A_Name"}, "spec.baseline"),
        ({"baseline": "b", "gate": {**GATE, "alpha": 1}}, "spec.gate.alpha"),
        ({"baseline": "b", "gate": {**GATE, "maxDrop": -0.1}}, "spec.gate.maxDrop"),
        ({"baseline": "b", "gate": {**GATE, "metric": "acc"}}, "spec.gate.metric"),
    ],
)
def test_the_apiserver_refuses_an_inconsistent_gate(
    poller_installed: ControlPlane, jobs: Jobs, spec: dict[str, Any], words: str
) -> None:
    with pytest.raises(client.exceptions.ApiException) as caught:
        jobs.create("refused", **spec)
    assert caught.value.status == 422
    assert words in json.loads(str(caught.value.body))["message"]
