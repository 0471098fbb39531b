"""The CRD's schema closes the smaller holes (issue 15, class 6) on the real apiserver.

Each job below was admitted before, by the committed CRD, and then failed in
the pod, or worse ran: a zero ``limit`` fraction, a NUL in a string that
reaches a process or the container runtime (the pod never started and the
status said only Pending), one argv token of 160 KiB ("Argument list too
long", naming no field), ``LD_PRELOAD`` loaded into the driver, label and
annotation keys the poller stamps itself, and per-container seccomp
annotations; and a fileSecret mounted over code (site-packages, the driver),
which loads into the driver as surely as LD_PRELOAD. Checks: the apiserver
refuses each with 422 and a message that names the field (the patterns and
the CEL rules generated from ``poller/api/lmevaljob.py`` and ``poller/api/rules.py``);
the nearest legitimate value is admitted; and the CRD's CEL rules fit the
apiserver's cost budget (it accepted the CRD at all).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from lmeval_sandbox.controlplane import ControlPlane

from poller import api
from tests.poller_fixtures import job_body

pytestmark = pytest.mark.cluster


def _create(admin_api: client.ApiClient, namespace: str, **spec: Any) -> tuple[int, str]:
    """(HTTP status, message) of creating a job with `spec`, as a dry run."""
    try:
        client.CustomObjectsApi(admin_api).create_namespaced_custom_object(
            api.API_GROUP,
            api.API_VERSION,
            namespace,
            api.PLURAL,
            job_body("j", **spec),
            dry_run="All",
        )
    except ApiException as error:
        return error.status, json.loads(error.body).get("message", "")
    return 201, ""


def _pairs(count: int, size: int, char: str = "v") -> list[dict[str, str]]:
    return [{"name": f"a{i}", "value": char * size} for i in range(count)]


def _sidecar(**fields: Any) -> dict[str, Any]:
    return {"sidecars": [{"name": "proxy", "image": "registry.example/p:1", **fields}]}


def _secret(env: str) -> dict[str, Any]:
    return {"env": env, "secretRef": {"name": "s", "key": "k"}}


S3_REFS = {
    field: {"name": "s3", "key": field}
    for field in ("accessKeyId", "secretAccessKey", "bucket", "endpoint")
}


REFUSED: list[tuple[str, dict[str, Any], list[str]]] = [
    ("limit 0.0", {"limit": "0.0"}, ["spec.limit"]),
    ("limit .0", {"limit": ".0"}, ["spec.limit"]),
    ("limit 0.000", {"limit": "0.000"}, ["spec.limit"]),
    ("limit 1.5", {"limit": "1.5"}, ["spec.limit"]),
    (
        "NUL in modelArgs",
        {"modelArgs": [{"name": "pretrained", "value": "gpt2\x00"}]},
        ["spec.modelArgs[0].value"],
    ),
    (
        "ESC in genArgs",
        {"genArgs": [{"name": "until", "value": "\x1b[2J"}]},
        ["spec.genArgs[0].value"],
    ),
    (
        "NUL in pod env",
        {"pod": {"env": [{"name": "A", "value": "\x00"}]}},
        ["spec.pod.env[0].value"],
    ),
    (
        "NUL in sidecar args",
        {"pod": _sidecar(args=["--x=\x00"])},
        ["spec.pod.sidecars[0].args[0]"],
    ),
    (
        "NUL in sidecar image",
        {"pod": _sidecar(image="busybox\x00")},
        ["spec.pod.sidecars[0].image"],
    ),
    ("NUL in an annotation", {"annotations": {"note": "a\x00b"}}, ["spec.annotations"]),
    (
        "160 KiB model_args",
        {"modelArgs": _pairs(40, 4096)},
        ["spec.modelArgs", "joined into lm_eval's --model_args= option", "at most 32768 bytes"],
    ),
    (
        # 20019 characters but 40019 bytes: the rule counts bytes.
        "gen_kwargs of 40 KB in 20000 characters",
        {"genArgs": _pairs(5, 4000, "é")},
        ["spec.genArgs", "--gen_kwargs= option, these may take at most 32768 bytes"],
    ),
    (
        "40 KB of tasks",
        {"tasks": [f"t{i:03}_" + "x" * 200 for i in range(200)]},
        ["spec.tasks", "--tasks="],
    ),
    (
        "96 KB of pod env",
        {"pod": {"env": [{"name": f"V{i}", "value": "x" * 32000} for i in range(3)]}},
        ["spec.pod.env", "the variables may take at most 65536 bytes"],
    ),
    (
        "36 KiB of sidecar args",
        {"pod": _sidecar(args=["a" * 4096] * 9)},
        ["spec.pod.sidecars[0].args", "the strings may take at most 32768 bytes"],
    ),
    (
        "LD_PRELOAD",
        {"pod": {"env": [{"name": "LD_PRELOAD", "value": "/opt/lmeval/tasks/t/x.so"}]}},
        ["spec.pod.env[0].name", "LD_PRELOAD cannot be set by a job"],
    ),
    (
        "GCONV_PATH from a Secret",
        {"envSecrets": [_secret("GCONV_PATH")]},
        ["spec.envSecrets[0].env", "GCONV_PATH cannot be set by a job"],
    ),
    (
        "PYTHONSTARTUP",
        {"pod": {"env": [{"name": "PYTHONSTARTUP", "value": "/x.py"}]}},
        ["spec.pod.env[0].name", "PYTHONSTARTUP cannot be set"],
    ),
    (
        "LMEVAL_RUN_ID",
        {"envSecrets": [_secret("LMEVAL_RUN_ID")]},
        ["spec.envSecrets[0].env", "LMEVAL_RUN_ID cannot be set"],
    ),
    (
        "a Secret over site-packages",
        {
            "fileSecrets": [
                {
                    "secretRef": {"secretName": "s"},
                    "mountPath": "/usr/local/lib/python3.11/site-packages",
                }
            ]
        },
        ["spec.fileSecrets[0].mountPath", "a Secret mounted there would replace code"],
    ),
    (
        "a Secret over the driver, walked around",
        {"fileSecrets": [{"secretRef": {"secretName": "s"}, "mountPath": "/x/../opt"}]},
        ["spec.fileSecrets[0].mountPath"],
    ),
    (
        "managed-by label",
        {"labels": {"app.kubernetes.io/managed-by": "me"}},
        ["spec.labels", "are set by the poller on the job pod; a job may not set them"],
    ),
    (
        "the poller's annotation",
        {"annotations": {f"{api.API_GROUP}/job-uid": "x"}},
        ["spec.annotations", f"keys under {api.API_GROUP}/", "are set by the poller"],
    ),
    (
        "per-container seccomp annotation",
        {"annotations": {"container.seccomp.security.alpha.kubernetes.io/lmeval": "unconfined"}},
        ["spec.annotations", "annotations that set a seccomp or AppArmor profile are not allowed"],
    ),
    (
        "AppArmor annotation",
        {"annotations": {"container.apparmor.security.beta.kubernetes.io/lmeval": "unconfined"}},
        ["spec.annotations", "seccomp or AppArmor profile"],
    ),
    (
        "offline storage: both a claim and S3",
        {"offline": {"storage": {"pvcName": "hf", "s3": S3_REFS}}},
        ["spec.offline.storage", "exactly one of pvcName and s3"],
    ),
    (
        "offline storage: neither",
        {"offline": {"storage": {}}},
        ["spec.offline.storage", "exactly one of pvcName and s3"],
    ),
    (
        "an S3 path that climbs",
        {"offline": {"storage": {"s3": {**S3_REFS, "path": "team/../other"}}}},
        ["spec.offline.storage.s3.path"],
    ),
    (
        "HF_HUB_CACHE in pod env",
        {"pod": {"env": [{"name": "HF_HUB_CACHE", "value": "/x"}]}},
        ["spec.pod.env[0].name", "HF_HUB_CACHE"],
    ),
    (
        "an affinity operator Kubernetes does not have",
        {
            "pod": {
                "affinity": {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {
                                    "matchExpressions": [{"key": "a", "operator": "Gt"}]
                                },
                            }
                        ]
                    }
                }
            }
        },
        ["spec.pod.affinity.podAffinity"],
    ),
    (
        "outputs to a named and a managed claim",
        {"outputs": {"pvcName": "mine", "pvcManaged": {"size": "1Gi"}}},
        ["spec.outputs", "at most one of pvcName and pvcManaged"],
    ),
    (
        "a ConfigMap mounted over code",
        {"fileConfigMaps": [{"configMapRef": {"name": "c"}, "mountPath": "/usr/lib"}]},
        ["spec.fileConfigMaps[0].mountPath"],
    ),
]


@pytest.mark.parametrize(("spec", "words"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_the_schema_refuses_naming_the_field(
    poller_installed: ControlPlane,
    admin_api: client.ApiClient,
    namespace: str,
    spec: dict[str, Any],
    words: list[str],
) -> None:
    code, message = _create(admin_api, namespace, **spec)
    assert code == 422, (code, message)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


ADMITTED: list[tuple[str, dict[str, Any]]] = [
    ("limit 0.5", {"limit": "0.5"}),
    ("limit 1", {"limit": "1"}),
    ("limit 1.0", {"limit": "1.0"}),
    ("limit .000000001", {"limit": ".000000001"}),
    ("30 KiB model_args", {"modelArgs": _pairs(8, 3836)}),
    ("exactly 32768 bytes of model_args", {"modelArgs": _pairs(9, 3637)}),
    ("200 tasks", {"tasks": [f"task_{i}" for i in range(200)]}),
    (
        "a CA bundle in /etc/ssl/certs",
        {"fileSecrets": [{"secretRef": {"secretName": "ca"}, "mountPath": "/etc/ssl/certs"}]},
    ),
    (
        "PYTHONHASHSEED and a token from a Secret",
        {
            "pod": {"env": [{"name": "PYTHONHASHSEED", "value": "0"}]},
            "envSecrets": [_secret("HF_TOKEN")],
        },
    ),
    (
        "text over several lines",
        {
            "pod": {
                "env": [{"name": "CA_PEM", "value": "-----BEGIN-----\nAAAA\n-----END-----\n"}],
                **_sidecar(command=["sh", "-c"], args=["set -e\n\techo ready\n"]),
            }
        },
    ),
    (
        "ordinary labels and annotations",
        {
            "labels": {"team": "evals", "app.kubernetes.io/name": "eval"},
            "annotations": {"example.com/owner": "évals ✓", "notes": "line one\nline two"},
        },
    ),
    ("offline storage from a claim", {"offline": {"storage": {"pvcName": "hf-cache"}}}),
    ("a managed outputs claim", {"outputs": {"pvcManaged": {"size": "2Gi", "keep": True}}}),
    (
        "offline storage from S3",
        {"offline": {"storage": {"s3": {**S3_REFS, "path": "team/hf_cache-1.0/"}}}},
    ),
    (
        "placement and extra files",
        {
            "pod": {
                "priorityClassName": "eval-low",
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
                            ]
                        }
                    }
                },
            },
            "fileConfigMaps": [{"configMapRef": {"name": "c"}, "mountPath": "/data/c"}],
        },
    ),
]


@pytest.mark.parametrize("spec", [a[1] for a in ADMITTED], ids=[a[0] for a in ADMITTED])
def test_the_nearest_legitimate_value_is_admitted(
    poller_installed: ControlPlane,
    admin_api: client.ApiClient,
    namespace: str,
    spec: dict[str, Any],
) -> None:
    assert _create(admin_api, namespace, **spec) == (201, "")


def test_every_problem_is_reported_at_once(
    poller_installed: ControlPlane, admin_api: client.ApiClient, namespace: str
) -> None:
    code, message = _create(
        admin_api,
        namespace,
        limit="0.0",
        pod={"env": [{"name": "LD_PRELOAD", "value": "x"}, {"name": "A", "value": "\x00"}]},
    )
    assert code == 422
    for field in ("spec.limit", "spec.pod.env[0].name", "spec.pod.env[1].value"):
        assert field in message, (field, message)
