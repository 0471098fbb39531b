"""The poller's proof of pod origin, and how a job that keeps failing is ended.

Checks, without a cluster: a proof verifies only for the namespace, pod name,
job UID and attempt it was made for, and only under its key; malformed
proofs verify as nothing; stamping a manifest overrides whatever proof the
job's own annotations claimed; the key is read from its Secret, made when
missing, the winner's read after a lost race, and a Secret with junk is an
error instead of a silent new key. Then `poller.cycle.poison`: poison ends a job at
once, transient errors only after both the attempt count and the window,
conflicts and throttling never; success resets the count; the last-resort
patch is a valid, finite status.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import pytest
import urllib3

from poller import api
from poller.cycle import poison
from poller.cycle.podproof import KEY_FIELD, PodProof, load_pod_proof
from poller.decisions.views import PROOF_ANNOTATION
from poller.kube.client import ApiError, Conflict, NotFound

KEY = b"k" * 32
PROOF = PodProof(KEY)


def test_a_proof_binds_namespace_name_job_and_attempt() -> None:
    value = PROOF.sign("ns", "eval-abc123", "uid-1", 2)
    assert PROOF.verify(value, "ns", "eval-abc123", "uid-1") == 2
    assert PROOF.verify(value, "other", "eval-abc123", "uid-1") is None
    assert PROOF.verify(value, "ns", "eval-abc124", "uid-1") is None
    assert PROOF.verify(value, "ns", "eval-abc123", "uid-2") is None
    assert PodProof(b"x" * 32).verify(value, "ns", "eval-abc123", "uid-1") is None
    forged = value.replace("v1.2.", "v1.3.")
    assert PROOF.verify(forged, "ns", "eval-abc123", "uid-1") is None


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "v1.1",
        "v2.1." + "0" * 64,
        "v1.x." + "0" * 64,
        "v1.0." + "0" * 64,
        "v1.1." + "a" * 500,
    ],
)
def test_malformed_proofs_prove_nothing(value: str | None) -> None:
    assert PROOF.verify(value, "ns", "p", "uid") is None


def test_stamping_overrides_a_proof_the_job_asked_for() -> None:
    manifest = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "annotations": {PROOF_ANNOTATION: "v1.1.forged", "team": "a"},
        }
    }
    stamped = PROOF.stamp(manifest, "uid", 1)
    annotations = stamped["metadata"]["annotations"]
    assert annotations["team"] == "a"
    assert PROOF.verify(annotations[PROOF_ANNOTATION], "ns", "p", "uid") == 1
    assert manifest["metadata"]["annotations"][PROOF_ANNOTATION] == "v1.1.forged"  # not mutated


class SecretStore:
    """Stands in for the two Secret calls of `Kube`; `race` makes the first create lose."""

    def __init__(self, data: dict[str, str] | None = None, race: bool = False) -> None:
        self.data, self.race, self.created = data, race, 0

    def read_secret(self, namespace: str, name: str) -> dict[str, Any]:
        if self.data is None:
            raise NotFound(name)
        return {"metadata": {"creationTimestamp": "2026-12-01T08:00:00Z"}, "data": self.data}

    def create_secret(self, namespace: str, name: str, data: dict[str, str], **_: Any) -> None:
        self.created += 1
        if self.race:
            self.race = False
            self.data = {KEY_FIELD: base64.b64encode(b"w" * 32).decode()}
            raise Conflict(name)
        self.data = data


def test_the_key_is_made_once_and_then_read() -> None:
    store = SecretStore()
    made = load_pod_proof(store, "lmeval-system")  # type: ignore[arg-type]
    assert len(made.key) == 32 and store.created == 1
    read = load_pod_proof(store, "lmeval-system")  # type: ignore[arg-type]
    assert read.key == made.key and store.created == 1
    assert read.since == dt.datetime(2026, 12, 1, 8, 0, tzinfo=dt.UTC)


def test_a_lost_race_reads_the_winners_key() -> None:
    store = SecretStore(race=True)
    assert load_pod_proof(store, "lmeval-system").key == b"w" * 32  # type: ignore[arg-type]


def test_a_secret_with_junk_is_an_error_not_a_new_key() -> None:
    store = SecretStore({KEY_FIELD: "not base64!"})
    with pytest.raises(ValueError, match="holds no usable 'key'"):
        load_pod_proof(store, "lmeval-system")  # type: ignore[arg-type]
    assert store.created == 0


def test_only_pods_older_than_the_key_go_without_a_proof() -> None:
    proof = PodProof(KEY, dt.datetime(2026, 12, 1, 8, 0, tzinfo=dt.UTC))
    # Made by a poller from before proofs existed: attempt 0.
    assert proof.attempt_of(None, "ns", "p", "uid", "2026-12-01T07:59:59Z") == 0
    # Made since: no proof, no trust; and a bad proof is never excused by age.
    assert proof.attempt_of(None, "ns", "p", "uid", "2026-12-01T08:00:00Z") is None
    assert proof.attempt_of("v1.1.bad", "ns", "p", "uid", "2020-01-01T00:00:00Z") is None
    assert PROOF.attempt_of(None, "ns", "p", "uid", "2020-01-01T00:00:00Z") is None
    signed = proof.sign("ns", "p", "uid", 3)
    assert proof.attempt_of(signed, "ns", "p", "uid", "2026-12-01T09:00:00Z") == 3


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (ApiError(500, "Internal Server Error"), "transient"),
        (ApiError(503, "Service Unavailable"), "transient"),
        (urllib3.exceptions.ProtocolError("reset"), "transient"),
        (TimeoutError(), "transient"),
        (ApiError(429, "Too Many Requests"), "waiting"),
        (Conflict("x"), "waiting"),
        (ApiError(422, "Unprocessable Entity"), "poison"),
        (RecursionError(), "poison"),
        (ValueError("NaN"), "poison"),
        (KeyError("x"), "poison"),
    ],
)
def test_errors_are_classified(error: BaseException, kind: str) -> None:
    assert poison.classify(error) == kind


def test_poison_ends_the_job_at_once() -> None:
    ledger = poison.FailureLedger()
    message = ledger.failed("u", RecursionError("deep"), now=0.0)
    assert message is not None and "RecursionError: deep" in message


def test_transient_errors_end_the_job_only_after_count_and_window() -> None:
    ledger = poison.FailureLedger(attempts=3, window=60.0)
    error = ApiError(500, "Internal Server Error", '{"message": "kubelet unreachable"}')
    # Many fast failures: the count is reached, the window is not.
    assert all(ledger.failed("u", error, now=t) is None for t in (0.0, 1.0, 2.0, 3.0, 4.0))
    message = ledger.failed("u", error, now=61.0)
    assert message is not None
    assert "6 cycles in a row over 61 s" in message and "kubelet unreachable" in message
    # A success in between starts the count again.
    ledger.failed("v", error, now=0.0)
    ledger.failed("v", error, now=30.0)
    ledger.succeeded("v")
    assert ledger.failed("v", error, now=100.0) is None


def test_conflicts_and_throttling_never_end_a_job() -> None:
    ledger = poison.FailureLedger(attempts=1, window=0.0)
    assert ledger.failed("u", Conflict("x"), now=0.0) is None
    assert ledger.failed("u", ApiError(429, "Too Many Requests"), now=1000.0) is None


def test_the_last_resort_patch_is_a_valid_finite_status() -> None:
    now = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    patch = poison.failure_patch("x" * 10_000, now)
    json.dumps(patch, allow_nan=False)
    without_nulls = {k: v for k, v in patch.items() if v is not None}
    status = api.LMEvalJobStatus.model_validate(without_nulls)
    assert status.state == api.JobState.COMPLETE and status.reason == api.JobReason.FAILED
    assert patch["progress"] is None  # the driver's untrusted progress goes
    assert {c.type for c in status.conditions or []} >= {"Finished", "Succeeded"}
