"""A suite run's signed verdict: the statement, and the signing pod's progress.

Why a module of its own: signing is a short pipeline after a verdict
(statement, signing pod, envelope kept, pod gone) with its own states, and
`poller.decisions.suites` stays about triggers, baselines and verdicts.

The statement is in-toto v1: its subject is what the verdict is about (the
model artifact's digest when ``spec.attestation.push`` names it, else the
InferenceService revision the run was started for, else the run itself);
its predicate (type `driver.protocol.ATTESTATION_PREDICATE_TYPE`) holds the
suite, the run and its trigger, the verdict with every criterion's numbers
(p-values, differences, documents paired, minimum detectable drops), the
baseline, and the provenance of both jobs as the poller recorded them
(lm_eval's task hashes, versions, the image...). The signature is made in
the signing pod (`poller.jobpod.signer`) with the suite's key; the poller
only ever sees the envelope.

A run's ``attestation.state``: Signing (the pod is made, or runs), then
Signed (the envelope is in the run's attestation ConfigMap) or Failed (the
message says why; the verdict stands). Pure.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from driver import protocol
from poller import api
from poller.jobpod import signer as signer_pod

__all__ = [
    "FAILED",
    "SIGNED",
    "SIGNING",
    "SignStep",
    "SignerView",
    "next_step",
    "statement",
    "subject",
]

SIGNING, SIGNED, FAILED = "Signing", "Signed", "Failed"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"


@dataclass(frozen=True)
class SignerView:
    """The signing pod as observed: its phase, and what it said."""

    phase: str  # Pending, Running, Succeeded, Failed; "" when there is none
    message: str = ""  # a failed pod's termination message
    output: bytes | None = None  # a succeeded pod's log tail


@dataclass(frozen=True)
class SignStep:
    """What to do for one run's attestation now."""

    status: api.AttestationStatus | None  # the run's new attestation status (None: unchanged)
    start: str | None = None  # the statement's JSON: make its ConfigMap and the pod
    keep: str | None = None  # the envelope's JSON: write the attestation ConfigMap
    clean: bool = False  # delete the signing pod and the statement's ConfigMap


def subject(
    spec: api.LMEvalSuiteSpec, suite_namespace: str, suite_name: str, run: api.RunStatus
) -> tuple[str, str]:
    """(name, sha256 hex) of what the verdict is about."""
    push = spec.attestation.push if spec.attestation is not None else None
    if push is not None:
        repository, digest = push.reference.split("@sha256:", 1)
        return repository, digest
    model = spec.triggers.model_change
    if run.revision is not None and model is not None:
        name = f"inferenceservice/{suite_namespace}/{model.inference_service.name}"
        return name, hashlib.sha256(run.revision.encode()).hexdigest()
    name = f"lmevaljob/{suite_namespace}/{run.name}"
    return name, hashlib.sha256((run.uid or run.name).encode()).hexdigest()


def statement(
    *,
    spec: api.LMEvalSuiteSpec,
    namespace: str,
    suite_name: str,
    suite_uid: str,
    generation: int,
    run: api.RunStatus,
    provenance: Mapping[str, Any],
) -> dict[str, Any]:
    """The in-toto statement of `run`'s verdict; `provenance` by job name (the run's
    and the baseline's, as recorded in their status)."""
    name, digest = subject(spec, namespace, suite_name, run)
    recorded = run.model_dump(by_alias=True, exclude_none=True, mode="json")
    recorded.pop("attestation", None)
    predicate: dict[str, Any] = {
        "suite": {
            "namespace": namespace,
            "name": suite_name,
            "uid": suite_uid,
            "generation": generation,
            "criteria": [
                c.model_dump(by_alias=True, exclude_none=True, mode="json") for c in spec.criteria
            ],
        },
        "run": recorded,
        "verdict": run.verdict,
        "reason": run.reason,
        "provenance": {job: dict(value) for job, value in sorted(provenance.items())},
        "evaluator": "lmeval-poller",
    }
    if run.revision is not None:
        predicate["model"] = {"revision": run.revision}
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": digest}}],
        "predicateType": protocol.ATTESTATION_PREDICATE_TYPE,
        "predicate": predicate,
    }


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def next_step(
    run: api.RunStatus, signer: SignerView | None, to_sign: Mapping[str, Any] | None
) -> SignStep:
    """The next step of `run`'s attestation, given its signing pod (None: not read).

    `to_sign` is the statement (`statement`) to sign when signing starts."""
    state = run.attestation.state if run.attestation is not None else None
    statement_json = _canonical(to_sign) if to_sign is not None else None
    if state is None:
        if to_sign is None:
            return SignStep(None)
        first = to_sign["subject"][0]
        about = f"{first['name']}@sha256:{first['digest']['sha256']}"
        started = api.AttestationStatus(state=SIGNING, subject=about)
        return SignStep(started, start=statement_json)
    if state != SIGNING or signer is None:
        return SignStep(None)
    current = run.attestation
    assert current is not None
    if signer.phase == "":  # made before a crash lost it, or deleted: make it again
        return SignStep(None, start=statement_json)
    if signer.phase == "Failed":
        message = f"the signing pod failed: {signer.message or 'no message'}"[:1024]
        failed = current.model_copy(update={"state": FAILED, "message": message})
        return SignStep(failed, clean=True)
    if signer.phase != "Succeeded":
        return SignStep(None)
    try:
        envelope, pushed = protocol.parse_attestation_output(signer.output or b"")
        payload = base64.b64decode(str(envelope["payload"]), validate=True)
    except (ValueError, binascii.Error) as error:
        failed = current.model_copy(update={"state": FAILED, "message": str(error)[:1024]})
        return SignStep(failed, clean=True)
    signed = current.model_copy(
        update={
            "state": SIGNED,
            "config_map": signer_pod.attestation_configmap_name(run.name),
            "payload_digest": "sha256:" + hashlib.sha256(payload).hexdigest(),
            "pushed": pushed,
            "message": None,
        }
    )
    return SignStep(signed, keep=_canonical(envelope), clean=True)
