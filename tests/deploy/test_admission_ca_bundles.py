"""The admission policy and every caBundle beside modelTLS's (issue 34): the requester's rights.

An S3 endpoint's, a registry's and each Git source's ``caBundle`` comes from a
ConfigMap or a Secret that the job pod mounts, so the requester must be able
to ``get`` it, as for ``spec.modelTLS.caBundle``
(``test_admission_model_tls``). Same users and objects as
``test_admission`` (alice reads ``s-shared`` and ConfigMap ``tasks-shared``,
not ``s-hidden`` nor ``tasks-hidden``); each refusal names the field, also
when several caBundles and other references come before it. The bundles the
poller setting ``trusted-ca-bundles`` picks up are the admin's, not named by
the job, and not judged.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy import test_admission as base
from tests.deploy.test_admission import People, env_secret, job, refused

pytestmark = pytest.mark.cluster

policy = base.policy
people = base.people


def _cm(name: str) -> dict[str, Any]:
    return {"configMapKeyRef": {"name": name, "key": "ca.crt"}}


def _secret(name: str) -> dict[str, Any]:
    return {"secretKeyRef": {"name": name, "key": "ca.crt"}}


def _s3(ca: dict[str, Any] | None = None) -> dict[str, Any]:
    ref = {"name": "s-shared", "key": "k"}
    s3: dict[str, Any] = {
        "accessKeyId": ref,
        "secretAccessKey": ref,
        "bucket": ref,
        "endpoint": ref,
    }
    if ca is not None:
        s3["caBundle"] = ca
    return {"storage": {"s3": s3}}


def _oci(ca: dict[str, Any]) -> dict[str, Any]:
    return {"oci": {"repository": "registry.example.com/team/evals", "caBundle": ca}}


def _git(ca: dict[str, Any] | None = None) -> dict[str, Any]:
    source: dict[str, Any] = {"url": "https://git.example.com/tasks.git"}
    if ca is not None:
        source["caBundle"] = ca
    return {"git": source}


def test_each_ca_bundle_secret_needs_the_requesters_read_right(people: People) -> None:
    cases = {
        "spec.offline.storage.s3.caBundle.secretKeyRef.name:": {
            "offline": _s3(_secret("s-hidden"))
        },
        "spec.outputs.oci.caBundle.secretKeyRef.name:": {"outputs": _oci(_secret("s-hidden"))},
        "spec.customTasks[1].git.caBundle.secretKeyRef.name:": {
            "customTasks": [_git(), _git(_secret("s-hidden"))]
        },
    }
    for field, spec in cases.items():
        refused(
            people.create("alice", job("j", **spec)),
            403,
            field,
            "alice may not get Secret s-hidden",
            f"in namespace {people.namespace}",
        )
        # carol reads every Secret of the namespace.
        assert people.create("carol", job("j", **spec)) == (201, ""), field


def test_the_message_names_the_field_after_other_references(people: People) -> None:
    # The S3 credentials' Secret comes first (four times, the policy's first
    # eight positions hold them all); the caBundles in the order model, Git,
    # S3, registry.
    refused(
        people.create(
            "alice",
            job(
                "j",
                modelTLS={"caBundle": _secret("s-0")},
                customTasks=[_git(_secret("s-1"))],
                offline=_s3(_secret("s-2")),
                outputs=_oci(_secret("s-hidden")),
            ),
        ),
        403,
        "spec.outputs.oci.caBundle.secretKeyRef.name:",
        "s-hidden",
    )
    refused(
        people.create(
            "alice",
            job(
                "j",
                envSecrets=[env_secret("s-shared")],
                modelTLS={"caBundle": _secret("s-0")},
                customTasks=[_git(_secret("s-1")), _git(_secret("s-hidden"))],
            ),
        ),
        403,
        "spec.customTasks[1].git.caBundle.secretKeyRef.name:",
        "s-hidden",
    )
    admitted = job(
        "trusts-its-cas",
        modelTLS={"caBundle": _secret("s-0")},
        customTasks=[_git(_secret("s-1"))],
        offline=_s3(_secret("s-2")),
        outputs=_oci(_secret("s-3")),
    )
    assert people.create("alice", admitted, dry_run=False) == (201, "")


def test_each_ca_bundle_config_map_needs_the_requesters_read_right(people: People) -> None:
    cases = {
        "spec.offline.storage.s3.caBundle.configMapKeyRef.name:": {
            "offline": _s3(_cm("tasks-hidden"))
        },
        "spec.outputs.oci.caBundle.configMapKeyRef.name:": {"outputs": _oci(_cm("tasks-hidden"))},
        "spec.customTasks[2].git.caBundle.configMapKeyRef.name:": {
            # A ConfigMap task source and a Git source before it.
            "customTasks": [
                {"configMap": "tasks-shared"},
                _git(_cm("tasks-shared")),
                _git(_cm("tasks-hidden")),
            ]
        },
    }
    for field, spec in cases.items():
        refused(
            people.create("alice", job("j", modelTLS={"caBundle": _cm("tasks-shared")}, **spec)),
            403,
            field,
            "alice may not get ConfigMap tasks-hidden",
        )
    shared = job(
        "j",
        customTasks=[_git(_cm("tasks-shared"))],
        offline=_s3(_cm("tasks-shared")),
        outputs=_oci(_cm("tasks-shared")),
    )
    assert people.create("alice", shared) == (201, "")
