"""``lmeval suite verify``: check each kept run's signed verdict against the suite's record.

Why this module exists: a suite with ``spec.attestation`` has every verdict
signed (``poller.decisions.attestation``: an in-toto statement in a DSSE
envelope, signed in a short-lived pod with the suite's key) and keeps the
envelope in the run's ConfigMap ``<run>-attestation``. ``suite get`` shows
what the status says; this says whether the key's holder said the same.
For each run the status keeps with a ``Signed`` attestation it reads the
ConfigMap, only when its controller ownerReference is the run's LMEvalJob
by the UID the status records (names are predictable: a co-tenant who may
create ConfigMaps may make one first), verifies the envelope with the
public key the person gives (`driver.attest.verify_envelope`: the same code
that signs it, so the two cannot drift apart in what they call DSSE), and
checks that the statement agrees with the status: the suite, the run, its
verdict and reason, each criterion's numbers, the subject, and the sha256
of the payload. A disagreement is a failure even with a good signature: the
status is what people and ``kubectl wait --for=condition=Passed`` read.

The checks are pure (`check_run`): the command reads the ConfigMaps and
hands them over. `driver.attest` needs ``cryptography`` (the CLI's
distribution requires ``lmeval-driver[attest]``); it is imported only by
this module, which ``lmeval suite verify`` alone imports, so no other
command pays for loading it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from driver import attest
from driver.boundedjson import UntrustedJsonError, parse_untrusted_json
from driver.protocol import ATTESTATION_OUTPUT_LIMITS
from lmeval_cli import facts, render
from lmeval_cli.client import Cluster, controller_text
from lmeval_cli.errors import ApiError, CliError, ExitCode, explain
from poller.cliapi import ATTESTATION_KEY, attestation_configmap_name, controller_uid

__all__ = [
    "ATTESTATION_KEY",
    "FAILED",
    "NOT_SIGNED",
    "OK",
    "VERIFY_FAILED",
    "RunCheck",
    "attestation_configmap_name",
    "check_run",
    "checks_grid",
    "disagreements",
    "failures",
    "nothing_verified",
    "read_public_key",
    "refusal",
    "verify_runs",
]

# The attestation states the poller writes (poller.decisions.attestation).
SIGNED, SIGNING, SIGN_FAILED = "Signed", "Signing", "Failed"
OK, FAILED = "OK", "FAILED"
NOT_SIGNED = "NotSigned"
# How the runs that were not verified are counted, by RunCheck.outcome.
_UNVERIFIED = {
    SIGNING: "still signing",
    SIGN_FAILED: "whose signing failed",
    NOT_SIGNED: "not signed",
}
# Exit status of a verification that failed, or of one that verified nothing:
# 1, as `wait` for a job that did not succeed (what a CI step tests for).
VERIFY_FAILED = ExitCode.JOB_FAILED
# The fields of a criterion's outcome that the statement and the status must share.
_CRITERION_FIELDS = (
    "tier",
    "verdict",
    "reason",
    "pValue",
    "difference",
    "paired",
    "minimumDetectableDrop",
)
_MAX_DISAGREEMENTS = 6  # named in the message; the rest counted


@dataclass(frozen=True)
class RunCheck:
    """One run's line: what the status says, and what verifying its envelope found.

    `outcome`: OK or FAILED for a run whose attestation is Signed (verified);
    else the reason it was not verified (the attestation's state, or "not
    signed"), with `why` saying more. `statement` is the verified statement
    (OK only)."""

    run: str
    verdict: str
    subject: str
    outcome: str
    why: str = ""
    statement: dict[str, Any] | None = None

    @property
    def verified(self) -> bool:
        return self.outcome in (OK, FAILED)

    def result(self) -> str:
        """The RESULT cell: OK, FAILED: why, or not verified: why."""
        if self.outcome == OK:
            return OK
        if self.outcome == FAILED:
            return f"{FAILED}: {self.why}"
        return f"not verified: {self.why}"


def read_public_key(path: str) -> bytes:
    """The PEM public key in `path` (cosign.pub), bounded; CliError (usage) when it
    cannot be read or is plainly not a public key."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(attest.MAX_KEY + 1)
    except OSError as error:
        raise CliError(f"--key {path}: {error.strerror or error}", ExitCode.USAGE) from None
    if len(data) > attest.MAX_KEY:
        raise CliError(
            f"--key {path} exceeds {attest.MAX_KEY} bytes: not a public key", ExitCode.USAGE
        )
    if b"PRIVATE KEY-----" in data:
        raise CliError(
            f"--key {path} is a private key: verify with its public key (cosign.pub; "
            "`cosign public-key --key cosign.key`, or `openssl pkey -pubout -in KEY`)",
            ExitCode.USAGE,
        )
    if b"-----BEGIN PUBLIC KEY-----" not in data:
        raise CliError(
            f"--key {path} is not a PEM public key (-----BEGIN PUBLIC KEY-----), as cosign.pub is",
            ExitCode.USAGE,
        )
    return data


def refusal(error: attest.AttestError, key_name: str) -> str:
    """Why `driver.attest.verify_envelope` refused an envelope, in words.

    A key that did not make the signature is what a person most needs told
    apart (the wrong key file, or a forged envelope); a key that cannot be
    used at all is the command's error, not the run's (CliError).
    """
    message = str(error)
    if message.startswith("bad signature"):
        return f"signature does not verify with {key_name}"
    if message.startswith("the public key"):
        raise CliError(f"--key {key_name}: {message}", ExitCode.USAGE)
    if message.startswith("signing and verifying need"):  # no `cryptography`
        raise CliError(message, ExitCode.CLUSTER)
    return f"the envelope: {message}"


# -- the checks --------------------------------------------------------------------


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values: 400 and 400.0 are one number (the apiserver may write
    either); a boolean is never a number."""
    numbers = (int, float)
    if (
        isinstance(a, numbers)
        and isinstance(b, numbers)
        and not isinstance(a, bool)
        and not isinstance(b, bool)
    ):
        return float(a) == float(b)
    return bool(a == b) and type(a) is type(b)


def _shown(value: Any) -> str:
    return "none" if value is None else render.safe(str(value), 120)


def _differs(what: str, signed: Any, recorded: Any) -> str | None:
    if _same(signed, recorded):
        return None
    return f"{what}: the statement says {_shown(signed)}, the status {_shown(recorded)}"


def _subject_text(statement: Mapping[str, Any]) -> str:
    subjects = statement.get("subject")
    first = _mapping(subjects[0]) if isinstance(subjects, list) and subjects else {}
    digest = _mapping(first.get("digest")).get("sha256")
    return f"{first.get('name')}@sha256:{digest}"


def _criteria_differences(signed: Any, recorded: Any) -> list[str]:
    """Each criterion of the status against the statement's, by (task, metric)."""

    def keyed(value: Any) -> dict[tuple[str, str], dict[str, Any]]:
        items = [c for c in value if isinstance(c, dict)] if isinstance(value, list) else []
        return {(str(c.get("task")), str(c.get("metric"))): c for c in items}

    in_status, in_statement = keyed(recorded), keyed(signed)
    found = []
    for key in sorted(set(in_status) | set(in_statement)):
        name = render.safe(f"criterion {key[0]} {key[1]}", 200)
        if key not in in_statement:
            found.append(f"{name}: in the status, not in the statement")
            continue
        if key not in in_status:
            found.append(f"{name}: in the statement, not in the status")
            continue
        for field in _CRITERION_FIELDS:
            said, recorded_value = in_statement[key].get(field), in_status[key].get(field)
            differs = _differs(f"{name} {field}", said, recorded_value)
            if differs:
                found.append(differs)
    return found


def disagreements(
    statement: Mapping[str, Any],
    payload: bytes,
    suite: Mapping[str, Any],
    run: Mapping[str, Any],
) -> list[str]:
    """Where a verified statement and the suite's status disagree (empty: nowhere)."""
    found: list[str] = []
    if statement.get("predicateType") != attest.PREDICATE_TYPE:
        found.append(
            f"the statement's predicate type is {_shown(statement.get('predicateType'))}, "
            f"not a suite verdict ({attest.PREDICATE_TYPE})"
        )
    signed = _mapping(run.get("attestation"))
    digest = "sha256:" + hashlib.sha256(payload).hexdigest()
    if digest != signed.get("payloadDigest"):
        found.append(
            f"the payload's digest is {digest}, the status records "
            f"{_shown(signed.get('payloadDigest'))}"
        )
    subject = str(signed.get("subject") or "")
    name, _, hexdigest = subject.rpartition("@sha256:")
    try:
        matches = bool(name) and attest.statement_subject_matches(statement, hexdigest, name)
    except attest.AttestError:  # the status's subject has no sha256 digest
        matches = False
    if not matches:
        found.append(
            f"the statement's subject is {_shown(_subject_text(statement))}, the status "
            f"records {_shown(subject or None)}"
        )
    predicate = _mapping(statement.get("predicate"))
    meta = _mapping(suite.get("metadata"))
    about = _mapping(predicate.get("suite"))
    for field in ("namespace", "name", "uid"):
        differs = _differs(f"suite {field}", about.get(field), meta.get(field))
        if differs:
            found.append(differs)
    ran = _mapping(predicate.get("run"))
    for what, said, recorded in (
        ("run name", ran.get("name"), run.get("name")),
        ("run uid", ran.get("uid"), run.get("uid")),
        ("verdict", predicate.get("verdict"), run.get("verdict")),
        ("reason", predicate.get("reason"), run.get("reason")),
        ("baseline", ran.get("baseline"), run.get("baseline")),
    ):
        differs = _differs(what, said, recorded)
        if differs:
            found.append(differs)
    found += _criteria_differences(ran.get("criteria"), run.get("criteria"))
    return found


def _not_verified(run: Mapping[str, Any], verdict: str) -> RunCheck | None:
    """The line of a run whose attestation is not Signed (None: it is)."""
    name = render.safe(str(run.get("name") or "-"))
    signed = _mapping(run.get("attestation"))
    state = signed.get("state")
    subject = render.safe(str(signed.get("subject") or "-"), 400)
    if state == SIGNED:
        return None
    if state == SIGNING:
        return RunCheck(name, verdict, subject, SIGNING, "Signing (the signing pod runs)")
    if state == SIGN_FAILED:
        message = render.safe(str(signed.get("message") or "no message"), 300)
        return RunCheck(name, verdict, subject, SIGN_FAILED, f"signing Failed: {message}")
    if state:
        return RunCheck(name, verdict, subject, str(state), f"attestation {render.safe(state)}")
    if run.get("state") == "Active":
        why = "not signed (no verdict yet)"
    elif not run.get("verdict"):
        why = "not signed (no verdict: the job did not succeed)"
    else:
        why = "not signed"
    return RunCheck(name, verdict, subject, NOT_SIGNED, why)


def check_run(
    suite: Mapping[str, Any],
    run: Mapping[str, Any],
    configmap: Mapping[str, Any] | None,
    public_key_pem: bytes,
    key_name: str,
) -> RunCheck:
    """One run of `suite` (an entry of status.runs) checked: its attestation ConfigMap
    as read (None: it does not exist), with the key in `public_key_pem` (named
    `key_name` in the words)."""
    verdict = render.safe(str(run.get("verdict") or run.get("state") or "-"))
    skipped = _not_verified(run, verdict)
    if skipped is not None:
        return skipped
    name = str(run.get("name") or "")
    signed = _mapping(run.get("attestation"))
    subject = render.safe(str(signed.get("subject") or "-"), 400)

    def failed(why: str) -> RunCheck:
        return RunCheck(render.safe(name), verdict, subject, FAILED, render.safe(why, 1000))

    cm_name = str(signed.get("configMap") or attestation_configmap_name(name))
    namespace = str(_mapping(suite.get("metadata")).get("namespace") or "")
    uid = run.get("uid")
    if not uid:
        return failed("the status records no UID for the run: whose ConfigMap it is is unknown")
    if configmap is None:
        return failed(f"ConfigMap {cm_name} not found in namespace {namespace}")
    if controller_uid(configmap) != uid:
        return failed(
            f"ConfigMap {cm_name} is not the run's: its controller ownerReference is "
            f"{controller_text(configmap)}, not LMEvalJob {name} (uid {uid}); nothing in it "
            "is trusted"
        )
    text = _mapping(configmap.get("data")).get(ATTESTATION_KEY)
    if not isinstance(text, str):
        return failed(f"ConfigMap {cm_name} has no {ATTESTATION_KEY}")
    try:
        envelope = parse_untrusted_json(text.encode("utf-8"), ATTESTATION_OUTPUT_LIMITS)
    except UntrustedJsonError as error:
        return failed(f"{ATTESTATION_KEY} in ConfigMap {cm_name}: {error}")
    if not isinstance(envelope, dict):
        return failed(f"{ATTESTATION_KEY} in ConfigMap {cm_name} is not a DSSE envelope")
    try:
        statement = attest.verify_envelope(envelope, public_key_pem)
    except attest.AttestError as error:
        return failed(refusal(error, key_name))
    # The signature covers these bytes (verify_envelope decoded them too): the
    # poller recorded their sha256 as the standard base64 it wrote decodes.
    try:
        payload = base64.b64decode(str(envelope.get("payload")), validate=True)
    except (binascii.Error, ValueError):
        return failed("the envelope's payload is not standard base64, as the poller writes it")
    found = disagreements(statement, payload, suite, run)
    if found:
        shown = found[:_MAX_DISAGREEMENTS]
        more = len(found) - len(shown)
        return failed(
            "the signed statement disagrees with the status: "
            + "; ".join(shown)
            + (f"; and {more} more" if more else "")
        )
    return RunCheck(render.safe(name), verdict, subject, OK, statement=statement)


# -- the cluster -------------------------------------------------------------------


def _configmap(cluster: Cluster, namespace: str, run: Mapping[str, Any]) -> dict[str, Any] | None:
    signed = _mapping(run.get("attestation"))
    name = str(signed.get("configMap") or attestation_configmap_name(str(run.get("name"))))
    try:
        return cluster.get_core("configmaps", name, namespace)
    except ApiError as error:
        raise explain(error) from error


def verify_runs(
    cluster: Cluster,
    suite: dict[str, Any],
    runs: Sequence[dict[str, Any]],
    public_key_pem: bytes,
    key_name: str,
) -> list[RunCheck]:
    """Each of `runs` (entries of the suite's status.runs) checked, in order; only
    the ConfigMaps of Signed runs are read."""
    namespace = str(suite["metadata"]["namespace"])
    checks = []
    for run in runs:
        signed = _mapping(run.get("attestation")).get("state") == SIGNED
        configmap = _configmap(cluster, namespace, run) if signed and run.get("uid") else None
        checks.append(check_run(suite, run, configmap, public_key_pem, key_name))
    return checks


def checks_grid(checks: Sequence[RunCheck]) -> render.Grid:
    """RUN, VERDICT, SUBJECT, RESULT: one row per run."""
    rows = [[c.run, c.verdict, c.subject, c.result()] for c in checks]
    return ["RUN", "VERDICT", "SUBJECT", "RESULT"], rows


# -- the command's last words --------------------------------------------------------


def failures(failed: Sequence[RunCheck], *, table: bool) -> str:
    """The runs that failed and why: the reason once when they share it (a wrong
    key), else the names only when the table printed gives each reason."""
    names = ", ".join(c.run for c in failed)
    reasons = {c.why for c in failed}
    if len(reasons) == 1:
        return f"{names}: {reasons.pop()}"
    if table:
        return f"{names} (RESULT above says why)"
    return "; ".join(f"{c.run}: {c.why}" for c in failed)


def nothing_verified(suite: dict[str, Any], checks: Sequence[RunCheck], *, only: bool) -> CliError:
    """Why no run was verified (`only`: one run was named): it, or none, has a
    signed verdict; exit 1, since a CI step that verified nothing proved nothing."""
    name = suite["metadata"]["name"]
    if only and checks:
        return CliError(
            f"run {checks[0].run} of suite {name} has no signed verdict to verify: {checks[0].why}",
            VERIFY_FAILED,
        )
    if not checks:
        return CliError(f"suite {name} keeps no runs yet: nothing to verify", VERIFY_FAILED)
    counts: dict[str, int] = {}
    for check in checks:
        label = _UNVERIFIED.get(check.outcome, f"with attestation {check.outcome}")
        counts[label] = counts.get(label, 0) + 1
    states = ", ".join(f"{n} {label}" for label, n in counts.items())
    unset = not isinstance(facts.spec(suite).get("attestation"), dict)
    hint = "; spec.attestation is not set: the poller signs no verdict" if unset else ""
    return CliError(
        f"no run of suite {name} has a signed verdict to verify ({states}){hint}", VERIFY_FAILED
    )
