"""The admission policy and spec.outputs.mlflow (issue 34): credentials and the server's CA.

The job pod mounts the Secret that ``spec.outputs.mlflow.credentialsSecret``
names and the ConfigMap or Secret of ``spec.outputs.mlflow.caBundle``, so
the requester must be able to ``get`` them, exactly as for the objects other
fields name. Same users and objects as ``test_admission`` (alice reads
``s-shared`` and ConfigMap ``tasks-shared``, not ``s-hidden`` nor
``tasks-hidden``; carol reads every Secret); each refusal names the field,
also after the registry's credentials and other references. A suite's
template is judged with its author's rights (``test_admission_suites``'s
sue). The schema's own rules on the server (http:// to loopback only, no
user information) and the tags (not MLflow's nor the poller's keys) are
checked here too, by the real apiserver.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy import test_admission as base
from tests.deploy.test_admission import People, env_secret, job, refused
from tests.deploy.test_admission_suites import Requests, requests, suite

pytestmark = pytest.mark.cluster

policy = base.policy
people = base.people
__all__ = ["requests"]  # the fixture, from test_admission_suites

URI = "https://mlflow.example.com"


def _mlflow(secret: str | None = None, **extra: Any) -> dict[str, Any]:
    mlflow: dict[str, Any] = {"trackingUri": URI, "experiment": "evals", **extra}
    if secret is not None:
        mlflow["credentialsSecret"] = secret
    return mlflow


def test_mlflow_credentials_need_the_requesters_read_right(people: People) -> None:
    refused(
        people.create("alice", job("j", outputs={"mlflow": _mlflow("s-hidden")})),
        403,
        "spec.outputs.mlflow.credentialsSecret:",
        "alice may not get Secret s-hidden",
        f"in namespace {people.namespace}",
    )
    # After every other Secret field, the registry's included, the position
    # still names the right field.
    refused(
        people.create(
            "alice",
            job(
                "j",
                envSecrets=[env_secret("s-shared")],
                modelTLS={"caBundle": {"secretKeyRef": {"name": "s-shared", "key": "ca.crt"}}},
                outputs={
                    "oci": {
                        "repository": "registry.example.com/team/evals",
                        "credentialsSecret": "s-shared",
                    },
                    "mlflow": _mlflow("s-hidden"),
                },
            ),
        ),
        403,
        "spec.outputs.mlflow.credentialsSecret:",
        "s-hidden",
    )
    # And the registry's, before it, is still named as the registry's.
    refused(
        people.create(
            "alice",
            job(
                "j",
                outputs={
                    "oci": {
                        "repository": "registry.example.com/team/evals",
                        "credentialsSecret": "s-hidden",
                    },
                    "mlflow": _mlflow("s-shared"),
                },
            ),
        ),
        403,
        "spec.outputs.oci.credentialsSecret:",
    )
    admitted = job("exports-with-her-secret", outputs={"mlflow": _mlflow("s-shared")})
    assert people.create("alice", admitted, dry_run=False) == (201, "")
    assert people.create("alice", job("anonymous", outputs={"mlflow": _mlflow()})) == (201, "")
    # carol may read every Secret of the namespace: one check covers all names.
    assert people.create("carol", job("j", outputs={"mlflow": _mlflow("s-hidden")})) == (201, "")


def test_the_servers_ca_bundle_needs_the_requesters_read_right(people: People) -> None:
    hidden_map = {"configMapKeyRef": {"name": "tasks-hidden", "key": "ca.crt"}}
    refused(
        people.create("alice", job("j", outputs={"mlflow": _mlflow(caBundle=hidden_map)})),
        403,
        "spec.outputs.mlflow.caBundle.configMapKeyRef.name:",
        "alice may not get ConfigMap tasks-hidden",
    )
    hidden_secret = {"secretKeyRef": {"name": "s-hidden", "key": "ca.crt"}}
    refused(
        people.create(
            "alice",
            job("j", outputs={"mlflow": _mlflow("s-shared", caBundle=hidden_secret)}),
        ),
        403,
        "spec.outputs.mlflow.caBundle.secretKeyRef.name:",
        "alice may not get Secret s-hidden",
    )
    shared = {"configMapKeyRef": {"name": "tasks-shared", "key": "ca.crt"}}
    assert people.create("alice", job("j", outputs={"mlflow": _mlflow(caBundle=shared)})) == (
        201,
        "",
    )


def test_a_suites_template_is_judged_with_its_authors_rights(requests: Requests) -> None:
    refused(
        requests.create("sue", suite("s", {"outputs": {"mlflow": _mlflow("s-hidden")}})),
        403,
        "spec.template.outputs.mlflow.credentialsSecret:",
        "sue may not get Secret s-hidden",
    )
    assert requests.create("sue", suite("s", {"outputs": {"mlflow": _mlflow("s-shared")}})) == (
        201,
        "",
    )


def test_the_schema_checks_the_server_and_the_tags(people: People) -> None:
    for uri in (
        "http://mlflow.mlflow.svc:5000",
        "https://user:password@mlflow.example.com",
        "https://mlflow.example.com/?token=x",
        "mlflow.example.com",
    ):
        status, text = people.create(
            "carol", job("j", outputs={"mlflow": _mlflow(trackingUri=uri)})
        )
        assert status == 422, (uri, status, text)
        assert "spec.outputs.mlflow" in text, text
    status, text = people.create(
        "carol", job("j", outputs={"mlflow": _mlflow(trackingUri="http://db.example.com")})
    )
    assert "http:// is allowed only for a loopback server" in text, text
    loopback = _mlflow(trackingUri="http://127.0.0.1:5000", runName="nightly run")
    assert people.create("carol", job("j", outputs={"mlflow": loopback})) == (201, "")
    for tags in ({"lmeval.job.uid": "x"}, {"mlflow.user": "x"}, {"bad,key": "x"}):
        status, text = people.create("carol", job("j", outputs={"mlflow": _mlflow(tags=tags)}))
        assert status == 422 and "spec.outputs.mlflow.tags" in text, (tags, text)
    # Keys and values travel in one token of the driver's command line: bounded.
    large = _mlflow(tags={f"k{i}": "x" * 1000 for i in range(20)})
    status, text = people.create("carol", job("j", outputs={"mlflow": large}))
    assert status == 422 and "at most 16384 bytes (UTF-8)" in text, text
    tagged = _mlflow(tags={"team": "evals", "model/family": "granite"})
    assert people.create("carol", job("j", outputs={"mlflow": tagged})) == (201, "")
    status, text = people.create("carol", job("j", outputs={"mlflow": {"trackingUri": URI}}))
    assert status == 422 and "experiment" in text, text
