"""The admission policy and the schema on LMEvalSuites, with real users on the real apiserver.

A suite makes the poller create LMEvalJobs (its runs) from ``spec.template``
long after the suite was written, as the poller's ServiceAccount, which may
not read the Secrets a template names. So the policy judges the template
when the suite is made or changed, with its *author's* rights and the same
rules as a job (messages name ``spec.template.<field>``), and the suite's
own references too: the pinned baseline, the attestation's signing key and
registry credentials. The run the poller then creates passes without the
per-reference checks, but only for the poller's own ServiceAccount and only
with the suite label: a user who puts the label on a job of theirs is judged
as ever.

Users are client-certificate identities with Roles in the test namespace,
so the policy's CEL ``authorizer`` sees real RBAC. sue writes suites: she may
create suites and jobs, ``get`` the Secrets ``s-shared`` and ``key-shared``
and the LMEvalJob ``base-shared``, and nothing else (no pod rights). tom, a
co-tenant, may only read and patch suites: he may ask for a run of sue's
suite (an annotation), but any change of its spec is judged, all of it, with
his rights. Authorization is by name, so the objects named need not exist.

The poller's ServiceAccount is impersonated by the admin (the same username
and groups for RBAC and the policy), so that the audit of what the poller
itself did in the session (test_zz_rbac_usage) does not count this module's
requests.

The schema's checks (422, before the policy) are tried on the same suites: a
cron expression that is not one, a baseline in another namespace, a model
trigger on a kind the poller may not read, a maxDrop of 0, a template that
sets what the suite decides, and a suite name too long for its runs' names.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.identities import api_client, user_kubeconfig

from poller import api
from tests.deploy import test_admission as base
from tests.deploy.test_admission import env_secret, job, refused
from tests.poller_fixtures import POLLER_USER
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

# The policy from deploy/admission, applied as test_admission applies it.
policy = base.policy

Result = tuple[int, str]
# The model artifact an attestation is pushed beside (by digest).
REFERENCE = "registry.example.com/team/model@sha256:" + "a" * 64


def suite(name: str, template: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """An LMEvalSuite that the schema admits, with `template` and `spec` merged in."""
    return {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.SUITE_KIND,
        "metadata": {"name": name},
        "spec": {
            "template": {"model": "dummy", "tasks": ["toy_mc"], **(template or {})},
            "criteria": [{"task": "toy_mc", "maxDrop": 0.05}],
            **spec,
        },
    }


def signing_key(name: str) -> dict[str, Any]:
    return {"name": name, "key": "cosign.key"}


def _as_the_poller(plane: ControlPlane) -> client.ApiClient:
    """The admin, impersonating the poller's ServiceAccount.

    The apiserver authorizes and admits each request as the ServiceAccount
    (its username and groups are what the policy sees), while its audit log
    records the admin who made it: test_zz_rbac_usage audits what the poller
    itself did in the session, where a refusal is never allowed, and this
    module's requests, one refused on purpose, are not the poller's.
    """
    made = api_client(plane.kubeconfig)
    made.set_default_header("Impersonate-User", POLLER_USER)
    return made


class Requests:
    """Creates and patches as sue, tom or the poller's ServiceAccount, as (status, message)."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        self.namespace = namespace
        self.clients = {
            "sue": api_client(user_kubeconfig(plane, "sue")),
            "tom": api_client(user_kubeconfig(plane, "tom")),
            "poller": _as_the_poller(plane),
        }

    def close(self) -> None:
        for each in self.clients.values():
            each.close()

    def _call(self, who: str, method: str, *args: Any, **kwargs: Any) -> Result:
        custom = client.CustomObjectsApi(self.clients[who])
        try:
            getattr(custom, method)(api.API_GROUP, api.API_VERSION, self.namespace, *args, **kwargs)
        except ApiException as error:
            return error.status, json.loads(error.body).get("message", "")
        return 201 if method.startswith("create") else 200, ""

    def create(
        self, who: str, body: dict[str, Any], *, dry_run: bool = True, **extra: Any
    ) -> Result:
        """Create `body` (an LMEvalSuite or an LMEvalJob, by its kind) as `who`."""
        plural = api.SUITE_PLURAL if body["kind"] == api.SUITE_KIND else api.PLURAL
        dry = "All" if dry_run else None
        return self._call(
            who, "create_namespaced_custom_object", plural, body, dry_run=dry, **extra
        )

    def patch_suite(self, who: str, name: str, patch: dict[str, Any]) -> Result:
        return self._call(who, "patch_namespaced_custom_object", api.SUITE_PLURAL, name, patch)


@pytest.fixture
def requests(policy: ControlPlane, namespace: str) -> Iterator[Requests]:
    rules = [
        {
            "apiGroups": [api.API_GROUP],
            "resources": [api.SUITE_PLURAL],
            "verbs": ["create", "get", "update", "patch"],
        },
        {"apiGroups": [api.API_GROUP], "resources": [api.PLURAL], "verbs": ["create"]},
        {
            "apiGroups": [api.API_GROUP],
            "resources": [api.PLURAL],
            "resourceNames": ["base-shared"],
            "verbs": ["get"],
        },
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["s-shared", "key-shared"],
            "verbs": ["get"],
        },
        {
            "apiGroups": ["serving.kserve.io"],
            "resources": ["inferenceservices"],
            "resourceNames": ["model-shared"],
            "verbs": ["get"],
        },
    ]
    # tom, a co-tenant, may read and patch suites and nothing else.
    editor = [
        {
            "apiGroups": [api.API_GROUP],
            "resources": [api.SUITE_PLURAL],
            "verbs": ["get", "patch"],
        }
    ]
    objects = []
    for user, granted in (("sue", rules), ("tom", editor)):
        name = f"lmevalsuite-{user}"
        objects += [base._role(name, granted), base._binding(name, user)]
    policy.kubectl("apply", "-n", namespace, "-f", "-", input_text=yaml.safe_dump_all(objects))
    made = Requests(policy, namespace)

    def settled() -> bool:
        # RBAC and the policy reach the apiserver's caches asynchronously.
        admitted, _ = made.create("sue", suite("probe", {"envSecrets": [env_secret("s-shared")]}))
        denied, text = made.create("sue", suite("probe", {"envSecrets": [env_secret("s-hidden")]}))
        unknown, _ = made.patch_suite("tom", "no-such-suite", {"metadata": {"labels": {"a": "b"}}})
        # 404 once tom may patch suites (403 before).
        return admitted == 201 and denied == 403 and base.POLICY in text and unknown == 404

    wait_for(settled, timeout=30, what="RBAC and the admission policy in force")
    yield made
    made.close()


# -- the template: a job's rules, with the author's rights --------------------------


def test_a_template_is_judged_with_its_authors_rights(requests: Requests) -> None:
    ns = requests.namespace
    refused(
        requests.create("sue", suite("evals", {"envSecrets": [env_secret("s-hidden")]})),
        403,
        "spec.template.envSecrets[0].secretRef.name:",
        "sue may not get Secret s-hidden",
        f"in namespace {ns}",
    )
    # The template's other rules hold too: code of hers needs pod rights.
    refused(
        requests.create("sue", suite("evals", {"allowCodeExecution": True})),
        403,
        "spec.template.allowCodeExecution needs the right to create pods",
    )
    admitted = suite("evals", {"envSecrets": [env_secret("s-shared")]})
    assert requests.create("sue", admitted, dry_run=False) == (201, "")
    # A change of the template is judged again, as a job's spec is.
    hidden = {"spec": {"template": {"envSecrets": [env_secret("s-hidden")]}}}
    refused(
        requests.patch_suite("sue", "evals", hidden),
        403,
        "spec.template.envSecrets[0].secretRef.name:",
        "s-hidden",
    )
    # tom, who may patch suites but read no Secret, may ask for a run (an
    # annotation: no spec changes, nothing judged), but any change of the spec
    # judges all of it with *his* rights, the template's s-shared included.
    request = {"metadata": {"annotations": {api.RUN_REQUESTED_ANNOTATION: "now"}}}
    assert requests.patch_suite("tom", "evals", request) == (200, "")
    refused(
        requests.patch_suite("tom", "evals", {"spec": {"concurrencyPolicy": "Allow"}}),
        403,
        "spec.template.envSecrets[0].secretRef.name: tom may not get Secret s-shared",
    )


def test_a_pinned_baseline_needs_the_authors_read_right(requests: Requests) -> None:
    refused(
        requests.create("sue", suite("evals", baseline={"pinned": "base-hidden"})),
        403,
        "spec.baseline.pinned: sue may not get LMEvalJob base-hidden",
        f"in namespace {requests.namespace}",
        "whose scores the suite's verdicts would copy",
    )
    pinned = suite("evals", baseline={"policy": "Pinned", "pinned": "base-shared"})
    assert requests.create("sue", pinned) == (201, "")


def test_the_model_triggers_inference_service_needs_the_authors_read_right(
    requests: Requests,
) -> None:
    def watching(name: str) -> dict[str, Any]:
        return suite("evals", triggers={"modelChange": {"inferenceService": {"name": name}}})

    refused(
        requests.create("sue", watching("model-hidden")),
        403,
        "spec.triggers.modelChange.inferenceService.name: sue may not get InferenceService "
        "model-hidden",
        "whose revision the suite would record",
    )
    assert requests.create("sue", watching("model-shared")) == (201, "")


def test_the_attestations_secrets_need_the_authors_read_right(requests: Requests) -> None:
    signed = suite("evals", attestation={"signingKey": signing_key("key-hidden")})
    refused(
        requests.create("sue", signed),
        403,
        "spec.attestation.signingKey.name: sue may not get Secret key-hidden",
        "which the signing pod would mount",
    )

    def pushed(credentials: str) -> dict[str, Any]:
        push = {"reference": REFERENCE, "credentialsSecret": credentials}
        return suite("evals", attestation={"signingKey": signing_key("key-shared"), "push": push})

    refused(
        requests.create("sue", pushed("s-hidden")),
        403,
        "spec.attestation.push.credentialsSecret: sue may not get Secret s-hidden",
    )
    assert requests.create("sue", pushed("s-shared")) == (201, "")


# -- the schema ------------------------------------------------------------------------


def invalid(result: Result, *words: str) -> None:
    """`result` is the schema's 422 (not the policy's 403), naming every one of `words`."""
    code, message = result
    assert code == 422, (code, message)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_the_schema_refuses_bad_input_naming_the_field(requests: Requests) -> None:
    def create(body: dict[str, Any], **extra: Any) -> Result:
        return requests.create("sue", body, **extra)

    invalid(
        create(suite("evals", triggers={"schedule": {"cron": "not a cron"}})),
        "spec.triggers.schedule.cron",
    )
    # A baseline is an LMEvalJob of the suite's own namespace: a name, no path.
    invalid(create(suite("evals", baseline={"pinned": "other/job"})), "spec.baseline.pinned")
    # The model trigger reads only KServe's InferenceServices (the one kind the
    # poller may get): another kind is pruned, and then the trigger lacks its
    # InferenceService; with strict field validation, the unknown key is named.
    elsewhere = {"modelChange": {"deployment": {"name": "x"}}}
    invalid(
        create(suite("evals", triggers=elsewhere)),
        "spec.triggers.modelChange.inferenceService: Required value",
    )
    code, message = create(suite("evals", triggers=elsewhere), field_validation="Strict")
    assert code == 400, (code, message)  # the decoder's BadRequest, before any schema check
    assert 'unknown field "spec.triggers.modelChange.deployment"' in message, message
    unnamed = create(suite("evals", triggers={"modelChange": {"inferenceService": {}}}))
    invalid(unnamed, "spec.triggers.modelChange.inferenceService.name: Required value")
    no_drop = suite("evals")
    no_drop["spec"]["criteria"][0]["maxDrop"] = 0
    invalid(create(no_drop), "spec.criteria[0].maxDrop")
    # What the suite decides for each run is not the template's to say.
    invalid(
        create(suite("evals", {"baseline": "base-shared"})),
        "spec.template",
        "may not set baseline or gate",
    )
    invalid(
        create(suite("evals", {"gate": {"task": "toy_mc"}})),
        "spec.template",
        "may not set baseline or gate",
    )
    invalid(create(suite("evals", {"suspend": True})), "spec.template may not set cancel")
    # Runs and their pods are named after the suite: at most 40 characters.
    assert requests.create("sue", suite("s" * api.SUITE_NAME_MAX)) == (201, "")
    invalid(
        create(suite("s" * (api.SUITE_NAME_MAX + 1))),
        f"metadata.name: a suite's name has at most {api.SUITE_NAME_MAX} characters",
    )


# -- the poller's runs -----------------------------------------------------------------


def run_job(secret: str, *, labelled: bool = True) -> dict[str, Any]:
    """A suite's run as the poller makes it (the suite label), naming Secret `secret`."""
    body = job("evals-1a2b3c4d", envSecrets=[env_secret(secret)])
    if labelled:
        body["metadata"]["labels"] = {api.SUITE_LABEL: "evals"}
    return body


def test_only_the_pollers_labelled_runs_skip_the_per_reference_checks(
    requests: Requests,
) -> None:
    # The poller may not read s-hidden; the suite's template was judged with its
    # author's rights when the suite was made, so its run passes.
    assert requests.create("poller", run_job("s-hidden")) == (201, "")
    # The same job without the label is any job of the poller's: judged.
    refused(
        requests.create("poller", run_job("s-hidden", labelled=False)),
        403,
        "spec.envSecrets[0].secretRef.name:",
        f"{POLLER_USER} may not get Secret s-hidden",
    )
    # A user cannot use the label to skip the checks (nor is it refused them).
    refused(
        requests.create("sue", run_job("s-hidden")),
        403,
        "spec.envSecrets[0].secretRef.name: sue may not get Secret s-hidden",
    )
    assert requests.create("sue", run_job("s-shared")) == (201, "")
