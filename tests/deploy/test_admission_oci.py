"""The admission policy and spec.outputs.oci (issue 18): the registry credentials.

The job pod mounts the Secret that ``spec.outputs.oci.credentialsSecret``
names, so the requester must be able to ``get`` it, exactly as for the
Secrets other fields name. Same users and objects as ``test_admission``
(alice reads ``s-shared``, not ``s-hidden``); each refusal names the field.
The schema's own rules on the reference (no scheme, no leading '-', plain
HTTP only to loopback) are checked here too, by the real apiserver.
"""

from __future__ import annotations

import pytest

from tests.deploy import test_admission as base
from tests.deploy.test_admission import People, env_secret, job, refused

pytestmark = pytest.mark.cluster

policy = base.policy
people = base.people


def _oci(secret: str | None = None, **extra: object) -> dict[str, object]:
    oci: dict[str, object] = {"repository": "registry.example.com/team/evals", **extra}
    if secret is not None:
        oci["credentialsSecret"] = secret
    return {"oci": oci}


def test_registry_credentials_need_the_requesters_read_right(people: People) -> None:
    refused(
        people.create("alice", job("j", outputs=_oci("s-hidden"))),
        403,
        "spec.outputs.oci.credentialsSecret:",
        "alice may not get Secret s-hidden",
        f"in namespace {people.namespace}",
    )
    # After the other Secret fields, the position still names the right field.
    refused(
        people.create(
            "alice",
            job(
                "j",
                envSecrets=[env_secret("s-shared")],
                modelTLS={"caBundle": {"secretKeyRef": {"name": "s-shared", "key": "ca.crt"}}},
                outputs=_oci("s-hidden"),
            ),
        ),
        403,
        "spec.outputs.oci.credentialsSecret:",
        "s-hidden",
    )
    admitted = job("pushes-with-her-secret", outputs=_oci("s-shared", tag="v1"))
    assert people.create("alice", admitted, dry_run=False) == (201, "")
    assert people.create("alice", job("anonymous", outputs=_oci())) == (201, "")
    # carol may read every Secret of the namespace: one check covers all names.
    assert people.create("carol", job("j", outputs=_oci("s-hidden"))) == (201, "")


def test_the_schema_checks_the_reference(people: People) -> None:
    for repository in (
        "https://registry.example.com/team/evals",
        "-registry.example.com/evals",
        "registry.example.com",
        "registry.example.com/Team",
    ):
        status, text = people.create("carol", job("j", outputs={"oci": {"repository": repository}}))
        assert status == 422, (repository, status, text)
        assert "spec.outputs.oci.repository" in text
    status, text = people.create("carol", job("j", outputs=_oci(plainHTTP=True)))
    assert status == 422 and "plainHTTP is allowed only for a loopback registry" in text, text
    loopback = {"oci": {"repository": "127.0.0.1:5000/evals", "plainHTTP": True}}
    assert people.create("carol", job("j", outputs=loopback)) == (201, "")
    status, text = people.create("carol", job("j", outputs=_oci(subject="sha256:abc")))
    assert status == 422 and "spec.outputs.oci.subject" in text, text
