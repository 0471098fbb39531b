"""spec.offline.storage in the job pod (poller/jobpod/offline.py through podspec.build_pod)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from driver import protocol
from poller import api
from poller.api.settings import Settings
from poller.jobpod import offline as podstorage
from poller.jobpod import podspec


def _spec(**fields: Any) -> api.LMEvalJobSpec:
    return api.LMEvalJobSpec.model_validate({"model": "hf", "tasks": ["arc_easy"], **fields})


def _pod(spec: api.LMEvalJobSpec, settings: Settings | None = None) -> dict[str, Any]:
    return podspec.build_pod(
        name="eval", namespace="ns", uid="u-1", spec=spec, settings=settings or Settings()
    )


def _main(pod: dict[str, Any]) -> dict[str, Any]:
    [main] = [c for c in pod["spec"]["containers"] if c["name"] == podspec.MAIN_CONTAINER]
    return main


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in _main(pod)["env"] if "value" in e}


OFFLINE = {"storage": {"pvcName": "hf-cache"}}


def test_the_claim_is_mounted_read_only_as_the_hub_cache() -> None:
    pod = _pod(_spec(offline=OFFLINE))
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == podstorage.STORAGE_VOLUME]
    assert volume["persistentVolumeClaim"] == {"claimName": "hf-cache", "readOnly": True}
    [mount] = [m for m in _main(pod)["volumeMounts"] if m["name"] == podstorage.STORAGE_VOLUME]
    assert mount == {"name": "offline-storage", "mountPath": "/cache/storage", "readOnly": True}
    env = _env(pod)
    assert env["HF_HUB_CACHE"] == "/cache/storage/hub"
    # HF_HOME (and so the datasets Arrow cache) stays the writable emptyDir.
    assert env["HF_HOME"] == podspec.HF_HOME
    assert {"name": "hf-home", "emptyDir": {}} in pod["spec"]["volumes"]
    command = _main(pod)["command"]
    assert f"{protocol.option_flag('hub_datasets')}=/cache/storage/hub" in command
    assert command.index(
        f"{protocol.option_flag('hub_datasets')}=/cache/storage/hub"
    ) < command.index("--")


def test_offline_storage_runs_offline_even_when_online_is_allowed() -> None:
    settings = Settings(allow_online=True)
    online = _env(_pod(_spec(allowOnline=True), settings))
    assert "HF_HUB_OFFLINE" not in online
    stored = _env(_pod(_spec(allowOnline=True, offline=OFFLINE), settings))
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        assert stored[name] == "1"
    names = [e["name"] for e in _main(_pod(_spec(offline=OFFLINE)))["env"]]
    assert len(names) == len(set(names))


def test_without_offline_storage_nothing_changes() -> None:
    pod = _pod(_spec())
    assert podstorage.STORAGE_VOLUME not in {v["name"] for v in pod["spec"]["volumes"]}
    assert "HF_HUB_CACHE" not in _env(pod)
    assert not [
        w for w in _main(pod)["command"] if w.startswith(protocol.option_flag("hub_datasets"))
    ]


@pytest.mark.parametrize(
    "offline",
    [
        {"storage": {"pvcName": "Bad_Name"}},
        {"storage": {"pvcName": "-x"}},
        {"storage": {}},
        {},
        {"storage": {"pvcName": "ok", "path": "/x"}},
    ],
)
def test_bad_offline_specs_are_refused(offline: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        _spec(offline=offline)


def test_the_hub_cache_variable_is_the_pollers() -> None:
    with pytest.raises(ValidationError, match="HF_HUB_CACHE"):
        _spec(pod={"env": [{"name": "HF_HUB_CACHE", "value": "/elsewhere"}]})


S3 = {
    "storage": {
        "s3": {
            "accessKeyId": {"name": "s3-creds", "key": "id"},
            "secretAccessKey": {"name": "s3-creds", "key": "secret"},
            "bucket": {"name": "s3-where", "key": "bucket"},
            "endpoint": {"name": "s3-where", "key": "endpoint"},
            "path": "team/hf",
            "verifySSL": False,
        }
    }
}


def test_s3_is_copied_by_a_restricted_init_container_into_an_empty_dir() -> None:
    # verifySSL: false, which the setting allows here (tests/unit/test_trust_pods.py: refused).
    pod = _pod(_spec(offline=S3), Settings(allow_insecure_storage_endpoints=True))
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == podstorage.STORAGE_VOLUME]
    assert volume == {"name": "offline-storage", "emptyDir": {}}
    [fetch] = pod["spec"]["initContainers"]
    assert fetch["name"] == podstorage.FETCH_CONTAINER
    assert fetch["image"] == Settings().pod_image
    assert fetch["securityContext"] == _main(pod)["securityContext"]
    assert fetch["command"] == [
        *podspec.driver_command(Settings()),
        protocol.CMD_FETCH_S3,
        "--dest=/cache/storage",
        "--path=team/hf",
        "--no-verify-ssl",
    ]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in fetch["env"]}
    assert refs == {
        "AWS_ACCESS_KEY_ID": {"name": "s3-creds", "key": "id"},
        "AWS_SECRET_ACCESS_KEY": {"name": "s3-creds", "key": "secret"},
        "S3_BUCKET": {"name": "s3-where", "key": "bucket"},
        "S3_ENDPOINT": {"name": "s3-where", "key": "endpoint"},
    }
    assert fetch["volumeMounts"] == [{"name": "offline-storage", "mountPath": "/cache/storage"}]
    # The evaluation sees the copy read-only, and never the credentials.
    [mount] = [m for m in _main(pod)["volumeMounts"] if m["name"] == podstorage.STORAGE_VOLUME]
    assert mount["readOnly"] is True
    assert not [e for e in _main(pod)["env"] if "AWS" in e["name"] or "S3_" in e["name"]]
    assert _env(pod)["HF_HUB_CACHE"] == "/cache/storage/hub"
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_s3_with_a_copied_driver_runs_after_it_and_imports_it() -> None:
    settings = Settings(
        driver_image="registry.example/driver:1", allow_insecure_storage_endpoints=True
    )
    pod = _pod(_spec(offline=S3), settings)
    names = [c["name"] for c in pod["spec"]["initContainers"]]
    assert names == ["install-driver", podstorage.FETCH_CONTAINER]
    fetch = pod["spec"]["initContainers"][1]
    assert {"name": "PYTHONPATH", "value": podspec.DRIVER_MOUNT} in fetch["env"]
    assert {"name": "driver", "mountPath": podspec.DRIVER_MOUNT, "readOnly": True} in fetch[
        "volumeMounts"
    ]


@pytest.mark.parametrize("path", ["../x", "/abs", "a//b", "a/../b", "a b", ".hidden"])
def test_s3_paths_are_plain_folders(path: str) -> None:
    bad = {"storage": {"s3": {**S3["storage"]["s3"], "path": path}}}
    with pytest.raises(ValidationError):
        _spec(offline=bad)


def test_exactly_one_storage() -> None:
    both = {"storage": {"pvcName": "x", **S3["storage"]}}
    with pytest.raises(ValidationError, match="exactly one of pvcName and s3"):
        _spec(offline=both)


def test_a_failed_init_container_explains_the_pod() -> None:
    from poller.decisions.views import PodView

    obj = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "status": {
            "phase": "Failed",
            "initContainerStatuses": [
                {"name": "install-driver", "state": {"terminated": {"exitCode": 0}}},
                {
                    "name": podstorage.FETCH_CONTAINER,
                    "state": {
                        "terminated": {
                            "exitCode": 1,
                            "message": "fetch-s3: s3://b/: HTTP 403\nAccessDenied\n",
                        }
                    },
                },
            ],
        },
    }
    view = PodView.from_object(obj, podspec.MAIN_CONTAINER)
    assert (
        view.message
        == "init container fetch-storage exited 1: fetch-s3: s3://b/: HTTP 403 AccessDenied"
    )
    obj["status"]["message"] = "the kubelet's own words"
    assert PodView.from_object(obj, podspec.MAIN_CONTAINER).message == "the kubelet's own words"


AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["eval"]}]}
            ]
        },
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 10,
                "preference": {
                    "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]
                },
            }
        ],
    },
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {"matchLabels": {"app.kubernetes.io/managed-by": "lmeval-poller"}},
                "topologyKey": "kubernetes.io/hostname",
            }
        ]
    },
}


def test_affinity_and_priority_class_reach_the_pod_as_written() -> None:
    pod = _pod(_spec(pod={"affinity": AFFINITY, "priorityClassName": "eval-low"}))
    assert pod["spec"]["affinity"] == AFFINITY
    assert pod["spec"]["priorityClassName"] == "eval-low"
    plain = _pod(_spec())
    assert "affinity" not in plain["spec"] and "priorityClassName" not in plain["spec"]


@pytest.mark.parametrize(
    "pod",
    [
        {"priorityClassName": "Not_A_Name"},
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}
                }
            }
        },
        {
            "affinity": {
                "podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "topologyKey": "x",
                            "labelSelector": {
                                "matchExpressions": [{"key": "a", "operator": "Near"}]
                            },
                        }
                    ]
                }
            }
        },
        {
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 0, "preference": {}}
                    ]
                }
            }
        },
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "spec.nodeName", "operator": "In"}]}
                        ]
                    }
                }
            }
        },
        {"affinity": {"hostNetwork": True}},
    ],
)
def test_bad_placement_is_refused(pod: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        _spec(pod=pod)


def test_file_config_maps_are_mounted_read_only() -> None:
    pod = _pod(
        _spec(
            fileConfigMaps=[
                {"configMapRef": {"name": "prompts"}, "mountPath": "/data/prompts"},
                {
                    "configMapRef": {"name": "ca", "items": [{"key": "ca.crt", "path": "ca.pem"}]},
                    "mountPath": "/etc/extra-ca",
                },
            ]
        )
    )
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["configmap-0"]["configMap"] == {"name": "prompts"}
    assert volumes["configmap-1"]["configMap"] == {
        "name": "ca",
        "items": [{"key": "ca.crt", "path": "ca.pem"}],
    }
    mounts = {m["name"]: m for m in _main(pod)["volumeMounts"]}
    assert mounts["configmap-0"] == {
        "name": "configmap-0",
        "mountPath": "/data/prompts",
        "readOnly": True,
    }
    assert mounts["configmap-1"]["mountPath"] == "/etc/extra-ca"


@pytest.mark.parametrize("path", ["/usr/lib/x", "/tmp", "/cache/storage", "/opt/x", "/a/../usr"])
def test_file_config_maps_keep_off_code_and_the_pollers_mounts(path: str) -> None:
    with pytest.raises(ValidationError):
        _spec(fileConfigMaps=[{"configMapRef": {"name": "x"}, "mountPath": path}])


def test_a_managed_outputs_claim_is_made_for_the_job_and_mounted() -> None:
    spec = _spec(outputs={"pvcManaged": {"size": "2Gi", "storageClassName": "fast"}})
    pod = _pod(spec)
    claim_name = podstorage.managed_claim_name("eval", "u-1")
    assert claim_name.startswith("eval-outputs-")
    assert {"name": "outputs", "persistentVolumeClaim": {"claimName": claim_name}} in pod["spec"][
        "volumes"
    ]
    claim = podspec.managed_claim("eval", "ns", "u-1", spec)
    assert claim is not None
    assert claim["metadata"]["name"] == claim_name
    assert claim["metadata"]["labels"][podspec.LABEL_JOB_UID] == "u-1"
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "2Gi"}},
        "storageClassName": "fast",
    }
    [owner] = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("LMEvalJob", "u-1", True)
    assert podspec.outputs_location(spec, "eval", "u-1") is not None
    assert claim_name in (podspec.outputs_location(spec, "eval", "u-1") or "")
    # The log copy goes to the claim, as with a named claim.
    assert any(w.startswith("--log-copy=") for w in _main(pod)["command"])


def test_a_kept_managed_claim_is_controlled_by_its_job_too_and_a_named_claim_is_not_made() -> None:
    # keep: true is carried out when the job ends (the poller releases it), not
    # by leaving the owner out: the controller is how the poller knows its claim.
    kept = podspec.managed_claim(
        "eval", "ns", "u-1", _spec(outputs={"pvcManaged": {"size": "1Gi", "keep": True}})
    )
    assert kept is not None
    assert kept["metadata"]["ownerReferences"] == [podstorage.owner_reference("eval", "u-1")]
    assert "storageClassName" not in kept["spec"]
    assert podspec.managed_claim("eval", "ns", "u-1", _spec(outputs={"pvcName": "mine"})) is None
    with pytest.raises(ValidationError, match="at most one of pvcName and pvcManaged"):
        _spec(outputs={"pvcName": "mine", "pvcManaged": {"size": "1Gi"}})
    with pytest.raises(ValidationError):
        _spec(outputs={"pvcManaged": {"size": "lots"}})
