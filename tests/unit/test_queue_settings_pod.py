"""Pure pieces around the cycle: the fair queue, the settings, the pod, the CRD.

Checks: FIFO within a namespace and round-robin across namespaces under
max-running-jobs; settings parsing (durations, booleans, the seed's key, a
bad value keeping the last good one, removed keys returning to defaults);
the job pod built by construction (restricted security context, no token,
argv as single --flag=value tokens, offline unless both sides allow online,
reserved variables protected, deterministic names within 63 characters);
the committed CRD equal to the one generated from the models; results
reduced to fit the status budget without losing scores.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from lmeval_sandbox import crd

from poller import api
from poller.api.settings import Settings, SettingsTracker, parse_duration
from poller.decisions.concurrency import fair_order, plan_queue
from poller.decisions.views import ContainerView, JobView, PodView
from poller.jobpod import podspec
from poller.results import lmeval


def _job(name: str, namespace: str, created: str, **status: Any) -> JobView:
    return JobView(
        namespace=namespace,
        name=name,
        uid=f"{namespace}/{name}",
        generation=1,
        resource_version="1",
        creation_timestamp=created,
        deleting=False,
        spec={"model": "dummy", "tasks": ["t"]},
        status=api.LMEvalJobStatus.model_validate(status),
    )


def _running_pod(uid: str) -> PodView:
    return PodView(
        name=uid,
        namespace="x",
        uid=uid,
        phase="Running",
        deleting=False,
        main=ContainerView("running"),
        owner_uid=uid,
    )


def test_fair_order_round_robins_namespaces_by_age() -> None:
    jobs = [
        _job("a1", "a", "2026-01-01T00:00:01Z"),
        _job("a2", "a", "2026-01-01T00:00:02Z"),
        _job("a3", "a", "2026-01-01T00:00:03Z"),
        _job("b1", "b", "2026-01-01T00:00:04Z"),
        _job("c1", "c", "2026-01-01T00:00:00Z"),
    ]
    assert [j.name for j in fair_order(jobs)] == ["c1", "a1", "b1", "a2", "a3"]


def test_plan_queue_holds_all_but_the_free_slots() -> None:
    running = _job("r", "a", "2026-01-01T00:00:00Z", state="Running")
    waiting = [_job(f"w{i}", "a", f"2026-01-01T00:00:0{i}Z") for i in range(1, 5)]
    plan = plan_queue([running, *waiting], {running.uid: _running_pod(running.uid)}, limit=2)
    assert set(plan) == {"a/w2", "a/w3", "a/w4"}
    assert [plan[f"a/w{i}"].position for i in (2, 3, 4)] == [1, 2, 3]
    assert plan["a/w2"].limit == 2 and len(plan) == 3
    assert plan_queue(waiting, {}, limit=0) == {}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10s", 10), ("1m30s", 90), ("500ms", 0.5), ("2h", 7200), ("7", 7), (3, 3)],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["ten", "10x", "", "1m 30s"])
def test_bad_durations(bad: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(bad)


def test_settings_keep_the_last_good_value_per_key() -> None:
    tracker = SettingsTracker()
    first = tracker.update(
        {
            "poll-interval": "5s",
            "allow-online": "yes",
            "size-presets": "small: {requests: {cpu: '1'}}",
        }
    )
    assert first.poll_interval == 5 and first.allow_online is True
    assert first.size_presets["small"].requests == {"cpu": "1"}
    second = tracker.update(
        {"poll-interval": "soon", "allow-online": "no", "max-running-jobs": "-1", "surprise": "1"}
    )
    assert second.poll_interval == 5  # kept
    assert second.allow_online is False  # the good key still applies
    assert second.max_running_jobs == 0
    assert set(tracker.problems) == {"poll-interval", "max-running-jobs", "surprise"}
    assert tracker.update({"pod-checking-interval": "20s"}).poll_interval == 20
    assert tracker.update(None) == Settings()


def _spec(**fields: Any) -> api.LMEvalJobSpec:
    return api.LMEvalJobSpec.model_validate({"model": "hf", "tasks": ["arc_easy"], **fields})


def test_pod_is_restricted_by_construction() -> None:
    pod = podspec.build_pod(
        name="eval", namespace="ns", uid="u-1", spec=_spec(), settings=Settings()
    )
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == "lmeval-job"
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    main = spec["containers"][0]
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    mounts = {m["mountPath"] for m in main["volumeMounts"]}
    assert {"/tmp", "/cache/huggingface", "/outputs"} <= mounts
    owner = pod["metadata"]["ownerReferences"][0]
    assert owner["controller"] and owner["blockOwnerDeletion"] and owner["uid"] == "u-1"


def test_argv_is_single_tokens_and_offline_by_default() -> None:
    spec = _spec(
        modelArgs=[{"name": "pretrained", "value": "gpt2"}, {"name": "dtype", "value": "float16"}],
        limit="0.5",
        numFewShot=0,
    )
    pod = podspec.build_pod(name="eval", namespace="ns", uid="u", spec=spec, settings=Settings())
    command = pod["spec"]["containers"][0]["command"]
    assert command[:1] == ["lmeval-driver"]
    assert command[command.index("--") + 1 :] == [
        "python",
        "-P",
        "-m",
        "lm_eval",
        "--model=hf",
        "--tasks=arc_easy",
        "--model_args=pretrained=gpt2,dtype=float16",
        "--num_fewshot=0",
        "--limit=0.5",
        "--device=cpu",
    ]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"
    online = podspec.build_pod(
        name="e",
        namespace="n",
        uid="u",
        spec=_spec(allowOnline=True),
        settings=Settings(**{"allow-online": True}),
    )
    assert "HF_HUB_OFFLINE" not in {e["name"] for e in online["spec"]["containers"][0]["env"]}


def test_driver_image_adds_the_copying_init_container() -> None:
    pod = podspec.build_pod(
        name="e",
        namespace="n",
        uid="u",
        spec=_spec(),
        settings=Settings(**{"driver-image": "reg/driver:1"}),
    )
    init = pod["spec"]["initContainers"][0]
    assert init["image"] == "reg/driver:1"
    assert init["command"] == ["cp", "-R", "/opt/lmeval/driver", "/opt/lmeval-driver/"]
    assert pod["spec"]["containers"][0]["command"][:3] == ["python", "-m", "driver"]


@pytest.mark.parametrize("name", ["PYTHONPATH", "HF_HUB_OFFLINE", "HOME", "LD_PRELOAD"])
def test_reserved_environment_is_protected(name: str) -> None:
    # The models refuse these names (tests/unit/test_spec_rules.py); the pod
    # builder checks again, here for a spec that never went through them.
    variable = api.EvaluationEnvVar.model_construct(name=name, value="x")
    unchecked = _spec().model_copy(update={"pod": api.PodOverride.model_construct(env=[variable])})
    with pytest.raises(podspec.JobPodError, match=f"spec.pod.env: {name} cannot be set"):
        podspec.build_pod(name="e", namespace="n", uid="u", spec=unchecked, settings=Settings())


def test_pod_names_are_deterministic_and_short() -> None:
    long_name = "a" * 253
    first = podspec.pod_name(long_name, "uid-1")
    assert first == podspec.pod_name(long_name, "uid-1") and len(first) <= 63
    assert first != podspec.pod_name(long_name, "uid-2")


@pytest.mark.parametrize(
    "spec",
    [
        {"tasks": ["--output_path=/x"]},
        {"limit": "1e9"},
        {"batchSize": "-4"},
        {"model": "-x"},
        {"modelArgs": [{"name": "a", "value": "b,c=d"}]},
        {"envSecrets": [{"env": "1BAD", "secretRef": {"name": "s", "key": "k"}}]},
    ],
)
def test_models_refuse_argv_injection(spec: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        api.LMEvalJobSpec.model_validate({"model": "hf", "tasks": ["t"], **spec})


def test_committed_crd_matches_the_models() -> None:
    assert crd.CRD_PATH.read_text() == crd.render(), "run `python -m lmeval_sandbox.crd`"


def test_crd_is_structural() -> None:
    text = json.dumps(crd.crd_manifest())
    for forbidden in ('"$ref"', '"anyOf"', '"patternProperties"', '"title"'):
        assert forbidden not in text


def test_results_reduced_to_budget_keep_scores() -> None:
    big = {
        "results": {f"task{i}": {"acc,none": i / 100} for i in range(50)},
        "configs": {f"task{i}": {"doc": "x" * 5000} for i in range(50)},
    }
    text, reduced = lmeval.reduce_results(big, budget=16 * 1024)
    assert reduced and len(text) <= 16 * 1024
    assert json.loads(text)["results"] == big["results"]
    small, reduced_small = lmeval.reduce_results({"results": {"t": {"acc,none": 1}}})
    assert not reduced_small and json.loads(small) == {"results": {"t": {"acc,none": 1}}}


def test_outputs_claim_gets_the_log_copy_and_status_says_where() -> None:
    spec = _spec(outputs={"pvcName": "evals"})
    pod = podspec.build_pod(name="e", namespace="n", uid="u", spec=spec, settings=Settings())
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["outputs"] == {
        "name": "outputs",
        "persistentVolumeClaim": {"claimName": "evals"},
    }
    name = podspec.pod_name("e", "u")
    assert f"--log-copy=/outputs/{name}.log" in pod["spec"]["containers"][0]["command"]
    assert "evals" in (podspec.outputs_location(spec, "e", "u") or "")
    assert podspec.outputs_location(_spec(), "e", "u") is None


def test_openshift_uid_range_sets_the_pod_user() -> None:
    assert podspec.uid_range_start("1000680000/10000") == 1000680000
    assert podspec.uid_range_start(None) is None
    assert podspec.uid_range_start("garbage") is None
    plain = podspec.build_pod(name="e", namespace="n", uid="u", spec=_spec(), settings=Settings())
    assert "runAsUser" not in plain["spec"]["securityContext"]
    shifted = podspec.build_pod(
        name="e", namespace="n", uid="u", spec=_spec(), settings=Settings(), run_as_user=1000680000
    )
    context = shifted["spec"]["securityContext"]
    assert context["runAsUser"] == 1000680000 and context["runAsGroup"] == 0
    assert context["runAsNonRoot"] is True
