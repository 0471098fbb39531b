"""The real apiserver refuses variables that load code and trust_remote_code (issue 28, items 5, 7).

The CRD generated from ``poller/api/rules.py`` carries the rules as CEL; here
the apiserver runs them. Checks:

- a job naming one variable of each family (``OPENSSL_CONF``,
  ``CUDA_INJECTION64_PATH``, ``NCCL_NET_PLUGIN``, ``OMP_TOOL_LIBRARIES``,
  ``NVIDIA_VISIBLE_DEVICES``, ``HF_DATASETS_TRUST_REMOTE_CODE``,
  ``TRITON_LIBCUDA_PATH``, ``GIO_MODULE_DIR``, ``PATH``...) in
  ``spec.pod.env`` or ``spec.envSecrets`` is refused with 422, the message
  naming the field, the variable and its family;
- the apiserver and Python agree on every reserved name, a name under every
  reserved prefix and the neighbours that stay allowed: one job carries them
  all and the fields the apiserver refuses are exactly those Python refuses;
- a sidecar may not set ``NVIDIA_*`` (the node acts on it), and may set
  loader variables for itself;
- ``trust_remote_code`` in ``spec.modelArgs`` with a value lm_eval could read
  as true is refused without ``spec.allowCodeExecution: true``, naming
  ``spec.modelArgs`` and what to set; ``false``/``0`` and a job that allows
  code are admitted.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from lmeval_sandbox.controlplane import ControlPlane

from poller import api
from poller.api import rules
from tests.poller_fixtures import job_body
from tests.unit.test_code_loading_rules import ADMITTED

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


def _secret(env: str) -> dict[str, Any]:
    return {"env": env, "secretRef": {"name": "s", "key": "k"}}


def _family(name: str) -> str:
    (reason,) = (f.reason for f in rules.ENV_FAMILIES if f.holds(name))
    return reason


FAMILY_EXAMPLES = [
    "OPENSSL_CONF",
    "OPENSSL_MODULES",
    "CUDA_INJECTION64_PATH",
    "NCCL_NET_PLUGIN",
    "OMP_TOOL_LIBRARIES",
    "NVIDIA_VISIBLE_DEVICES",
    "HF_DATASETS_TRUST_REMOTE_CODE",
    "TRITON_LIBCUDA_PATH",
    "GIO_MODULE_DIR",
    "BASH_ENV",
    "PATH",
    "GIT_CONFIG_PARAMETERS",
    "LD_PRELOAD",
    "PYTHONPATH",
    "HF_ALLOW_CODE_EVAL",
]


@pytest.mark.parametrize("name", FAMILY_EXAMPLES)
def test_each_family_is_refused_naming_it(
    poller_installed: ControlPlane, admin_api: client.ApiClient, namespace: str, name: str
) -> None:
    for spec, field in (
        ({"pod": {"env": [{"name": name, "value": "x"}]}}, "spec.pod.env[0].name"),
        ({"envSecrets": [_secret(name)]}, "spec.envSecrets[0].env"),
    ):
        code, message = _create(admin_api, namespace, **spec)
        assert code == 422, (code, message)
        assert field in message, message
        assert f"{name} cannot be set by a job: {_family(name)}" in message, message


def _names() -> list[str]:
    names = {n for family in rules.ENV_FAMILIES for n in family.names}
    for family in rules.ENV_FAMILIES:
        names |= {p + "X" for p in family.prefixes} | {p.rstrip("_") for p in family.prefixes}
    return sorted(names | set(rules.ALLOWED_PYTHON_ENV) | set(ADMITTED))


def test_the_apiserver_and_python_agree_on_every_name(
    poller_installed: ControlPlane, admin_api: client.ApiClient, namespace: str
) -> None:
    names = _names()
    for start in range(0, len(names), rules.CONTAINER_ENV_ITEMS_MAX):
        chunk = names[start : start + rules.CONTAINER_ENV_ITEMS_MAX]
        env = [{"name": name, "value": "1"} for name in chunk]
        expected = {i for i, name in enumerate(chunk) if rules.env_name_problem(name)}
        assert expected and len(expected) < len(chunk)
        code, message = _create(admin_api, namespace, pod={"env": env})
        assert code == 422, (code, message)
        refused = {int(i) for i in re.findall(r"spec\.pod\.env\[(\d+)\]\.name", message)}
        assert refused == expected, (
            sorted(chunk[i] for i in refused - expected),
            sorted(chunk[i] for i in expected - refused),
        )


def test_a_sidecar_may_not_set_what_the_node_acts_on(
    poller_installed: ControlPlane, admin_api: client.ApiClient, namespace: str
) -> None:
    def sidecar(*names: str) -> dict[str, Any]:
        env = [{"name": name, "value": "x"} for name in names]
        return {"sidecars": [{"name": "s", "image": "registry.example/s:1", "env": env}]}

    code, message = _create(
        admin_api, namespace, pod=sidecar("LD_PRELOAD", "NVIDIA_VISIBLE_DEVICES")
    )
    assert code == 422, (code, message)
    assert "spec.pod.sidecars[0].env[1].name" in message, message
    assert "NVIDIA_VISIBLE_DEVICES=all exposes every GPU of the node" in message
    assert "env[0]" not in message, message
    assert _create(admin_api, namespace, pod=sidecar("LD_PRELOAD", "NCCL_DEBUG")) == (201, "")


def _remote(value: str, **spec: Any) -> dict[str, Any]:
    pairs = [
        {"name": "pretrained", "value": "org/m"},
        {"name": "trust_remote_code", "value": value},
    ]
    return {"modelArgs": pairs, **spec}


@pytest.mark.parametrize("value", ["True", "true", " TRUE ", "1", "yes", "none", ""])
def test_remote_code_without_allow_code_execution_is_refused(
    poller_installed: ControlPlane, admin_api: client.ApiClient, namespace: str, value: str
) -> None:
    for spec in (_remote(value), _remote(value, allowCodeExecution=False)):
        code, message = _create(admin_api, namespace, **spec)
        assert code == 422, (code, message)
        assert "spec.modelArgs" in message, message
        assert "trust_remote_code other than false or 0" in message, message
        assert "spec.allowCodeExecution: true" in message, message


@pytest.mark.parametrize(
    "spec",
    [
        _remote("false"),
        _remote(" FALSE "),
        _remote("0"),
        _remote("True", allowCodeExecution=True),
        {"modelArgs": [{"name": "remote_code", "value": "True"}]},
    ],
    ids=["false", "FALSE", "0", "code-allowed", "another-name"],
)
def test_remote_code_off_or_allowed_is_admitted(
    poller_installed: ControlPlane, admin_api: client.ApiClient, namespace: str, spec: Any
) -> None:
    assert _create(admin_api, namespace, **spec) == (201, "")
