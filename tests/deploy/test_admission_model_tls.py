"""The admission policy and spec.modelTLS.caBundle (issue 18): the requester's own rights.

A job's CA bundle comes from a ConfigMap or a Secret that the job pod
mounts, so the requester must be able to ``get`` it, exactly as for the
Secrets and ConfigMaps other fields name. Same users and objects as
``test_admission`` (alice reads ``s-shared`` and ConfigMap ``tasks-shared``,
not ``s-hidden`` nor ``tasks-hidden``); each refusal names the field.
"""

from __future__ import annotations

import pytest

from tests.deploy import test_admission as base
from tests.deploy.test_admission import People, env_secret, file_secret, job, refused

pytestmark = pytest.mark.cluster

# The shared fixtures: the policy applied, alice/bob/carol and their objects.
policy = base.policy
people = base.people


def _cm(name: str) -> dict[str, object]:
    return {"caBundle": {"configMapKeyRef": {"name": name, "key": "ca.crt"}}}


def _secret(name: str) -> dict[str, object]:
    return {"caBundle": {"secretKeyRef": {"name": name, "key": "ca.crt"}}}


def test_a_ca_bundle_secret_needs_the_requesters_read_right(people: People) -> None:
    refused(
        people.create("alice", job("j", modelTLS=_secret("s-hidden"))),
        403,
        "spec.modelTLS.caBundle.secretKeyRef.name:",
        "alice may not get Secret s-hidden",
        f"in namespace {people.namespace}",
    )
    # After the other Secret fields, the index still names the right field.
    refused(
        people.create(
            "alice",
            job(
                "j",
                envSecrets=[env_secret("s-shared")],
                fileSecrets=[file_secret("s-0")],
                modelTLS=_secret("s-hidden"),
            ),
        ),
        403,
        "spec.modelTLS.caBundle.secretKeyRef.name:",
        "s-hidden",
    )
    admitted = job("trusts-her-ca", modelTLS=_secret("s-shared"))
    assert people.create("alice", admitted, dry_run=False) == (201, "")
    assert people.create("carol", job("j", modelTLS=_secret("s-hidden"))) == (201, "")


def test_a_ca_bundle_config_map_needs_the_requesters_read_right(people: People) -> None:
    refused(
        people.create("alice", job("j", modelTLS=_cm("tasks-hidden"))),
        403,
        "spec.modelTLS.caBundle.configMapKeyRef.name:",
        "alice may not get ConfigMap tasks-hidden",
    )
    refused(
        people.create(
            "alice",
            job("j", customTasks=[{"configMap": "tasks-shared"}], modelTLS=_cm("tasks-hidden")),
        ),
        403,
        "spec.modelTLS.caBundle.configMapKeyRef.name:",
        "tasks-hidden",
    )
    # A custom-task ConfigMap she may not read is still named as such.
    refused(
        people.create(
            "alice",
            job("j", customTasks=[{"configMap": "tasks-hidden"}], modelTLS=_cm("tasks-shared")),
        ),
        403,
        "spec.customTasks[0].configMap:",
        "tasks-hidden",
    )
    both = job("j", customTasks=[{"configMap": "tasks-shared"}], modelTLS=_cm("tasks-shared"))
    assert people.create("alice", both) == (201, "")
