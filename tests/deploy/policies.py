"""Shared pieces of the admission-policy tests: one policy at a time, in one namespace.

The control plane is shared by the whole session, and other modules create
objects that a cluster-wide binding would refuse (claimed pods made as the
admin, to play forged or pre-existing ones). So each policy test applies the
policy object alone (`apply_policy`) and binds it to one test's namespace
(`bound_to`), removing the binding afterwards; requests are made as real
users (`Requester`) and judged by their HTTP status and the apiserver's
message (`refused`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.identities import api_client

from tests.deploy.conftest import yaml_file
from tests.waiting import wait_for

__all__ = ["Requester", "Result", "apply_policy", "bound_to", "refused", "type_check_status"]

Result = tuple[int, str]


def apply_policy(plane: ControlPlane, path: Path, name: str) -> None:
    """Apply the ValidatingAdmissionPolicy of file `path` (named `name`), not its binding."""
    (policy,) = [d for d in yaml_file(path) if d["kind"] == "ValidatingAdmissionPolicy"]
    assert policy["metadata"]["name"] == name
    plane.kubectl("apply", "--server-side", "-f", "-", input_text=yaml.safe_dump(policy))


@contextmanager
def bound_to(
    plane: ControlPlane, policy: str, namespace: str, in_force: Callable[[], bool]
) -> Iterator[str]:
    """Policy `policy` in force in `namespace` only, until the block ends.

    `in_force` tells when the binding has reached the apiserver's policy
    cache (asynchronously): a request the policy refuses, tried dry.
    """
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": f"{policy}-{namespace}"[:253]},
        "spec": {
            "policyName": policy,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }
    text = yaml.safe_dump(binding)
    plane.kubectl("apply", "-f", "-", input_text=text)
    try:
        wait_for(in_force, timeout=30, what=f"{policy} in force in {namespace}")
        yield namespace
    finally:
        plane.kubectl("delete", "--wait=false", "-f", "-", input_text=text, check=False)


def type_check_status(plane: ControlPlane, policy: str) -> dict[str, Any]:
    """The policy's ``status.typeChecking``, once the apiserver has written it."""

    def checked() -> dict[str, Any] | None:
        out = plane.kubectl("get", "validatingadmissionpolicies", policy, "-o", "json")
        status: dict[str, Any] = json.loads(out.stdout).get("status") or {}
        return status if "typeChecking" in status else None

    found: dict[str, Any] = wait_for(checked, timeout=30, what=f"{policy}'s type checking")
    return dict(found["typeChecking"])


def refused(policy: str, result: Result, *words: str) -> None:
    """`result` is `policy`'s 403, and its message holds every one of `words`."""
    code, message = result
    assert code == 403, (code, message)
    assert f"ValidatingAdmissionPolicy '{policy}'" in message, message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


class Requester:
    """Requests in one namespace as one identity, as (status, message)."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.api = api_client(kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.namespace = namespace

    def close(self) -> None:
        self.api.close()

    def call(self, call: Any, *args: Any, **kwargs: Any) -> Result:
        try:
            call(*args, **kwargs)
        except ApiException as error:
            return error.status, json.loads(error.body).get("message", "")
        return 200, ""

    def create_pod(self, body: dict[str, Any], *, dry_run: bool = True) -> Result:
        return self.call(
            self.core.create_namespaced_pod,
            self.namespace,
            body,
            dry_run="All" if dry_run else None,
        )

    def patch_pod(self, name: str, patch: Any) -> Result:
        return self.call(self.core.patch_namespaced_pod, name, self.namespace, patch)
