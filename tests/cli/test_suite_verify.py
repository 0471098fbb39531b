"""``lmeval suite verify`` on the real control plane, and its pure parts.

On the cluster, everything is made as the poller makes it: the suite's
status is patched through the status subresource as an admin, with runs
whose attestation status comes from the poller's own code
(`poller.decisions.attestation.next_step`, fed the signing pod's output
line); each run is a real LMEvalJob (its UID is what the status records and
what the ConfigMap's controller ownerReference names); the attestation
ConfigMaps are the poller's manifest (`poller.jobpod.signer`), created with
the poller's ServiceAccount, and hold envelopes signed by the real signer
(`driver.attest.sign_statement`) with a P-256 key made for the test.

Runs of one suite, each selected with ``--run``, then all together:

- ``good``: verified with the right key: OK, exit 0, ``-o json`` prints its
  statement; with another key: FAILED, "signature does not verify with
  <key file>", exit 1;
- ``tampered``: one byte of the signed payload changed in the ConfigMap:
  FAILED (the signature);
- ``squatted``: a valid envelope, but in a ConfigMap an admin made without
  an ownerReference (as a co-tenant could): FAILED, not the run's;
- ``lying``: a valid signature over a statement whose verdict is not the
  status's: FAILED, naming the field;
- ``signing``, ``sign-failed``, ``active``: listed, not verified; alone,
  nothing was verified: exit 1.

Pure: the names are the poller's, the driver's refusals are told apart,
numbers compare as JSON numbers, every disagreement is named.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from kubernetes import client
from lmeval_cli import suites, suiteverify
from lmeval_cli.__main__ import build_parser
from lmeval_cli.errors import CliError, ExitCode

from driver import attest
from poller import api
from poller.decisions import attestation
from poller.jobpod import signer
from poller.kube.client import Kube
from poller.timefmt import format_time
from tests.cli.conftest import Cli
from tests.poller_fixtures import Jobs

SUITE = "signed"
NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)


def _ago(**delta: float) -> str:
    return format_time(NOW - dt.timedelta(**delta))


def _key_pair(folder: Path, name: str) -> tuple[bytes, Path]:
    """A P-256 private key (PEM PKCS#8) and the path of its public key's PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = folder / f"{name}.pub"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def _spec() -> dict[str, Any]:
    return {
        "template": {"model": "dummy", "tasks": ["toy_mc"]},
        "criteria": [{"task": "toy_mc", "maxDrop": 0.05}],
        "attestation": {"signingKey": {"name": "suite-key", "key": "cosign.key"}},
    }


def _run(name: str, uid: str | None, verdict: str | None, **fields: Any) -> api.RunStatus:
    """A finished run as the poller records it (verdict None: still going)."""
    criteria = []
    if verdict is not None:
        regressed = verdict == "Regressed"
        criteria = [
            api.CriterionStatus(
                task="toy_mc",
                metric="acc,none",
                tier="Must",
                verdict=verdict,
                reason="Regressed" if regressed else "NotRegressed",
                message="toy_mc",
                p_value=0.00031 if regressed else 0.62,
                difference=-0.0725 if regressed else 0.0125,
                paired=400,
                minimum_detectable_drop=0.0412,
            )
        ]
    return api.RunStatus(
        name=name,
        uid=uid,
        trigger="Manual",
        started=_ago(hours=2),
        finished=_ago(hours=1) if verdict else None,
        state="Finished" if verdict else "Active",
        verdict=verdict,
        reason=verdict,
        baseline="prod-eval" if verdict else None,
        criteria=criteria,
        **fields,
    )


class Signed:
    """Signs runs of one suite as the poller and its signing pod do."""

    def __init__(self, suite: dict[str, Any], private_key: bytes) -> None:
        self.suite = suite
        self.spec = api.LMEvalSuiteSpec.model_validate(suite["spec"])
        self.private_key = private_key

    def sign(
        self, run: api.RunStatus, claimed: api.RunStatus | None = None
    ) -> tuple[api.RunStatus, str, dict[str, Any]]:
        """(`run` with its Signed attestation, the envelope's JSON as the poller keeps
        it, the statement); `claimed`: the run the statement is made of instead."""
        meta = self.suite["metadata"]
        statement = attestation.statement(
            spec=self.spec,
            namespace=meta["namespace"],
            suite_name=meta["name"],
            suite_uid=meta["uid"],
            generation=meta["generation"],
            run=claimed or run,
            provenance={},
        )
        started = attestation.next_step(run, None, statement).status
        assert started is not None and started.state == attestation.SIGNING
        signing = run.model_copy(update={"attestation": started})
        envelope = attest.sign_statement(statement, self.private_key)
        line = json.dumps({"envelope": envelope, "pushed": None}).encode()
        view = attestation.SignerView("Succeeded", output=line)
        step = attestation.next_step(signing, view, None)
        assert step.status is not None and step.status.state == attestation.SIGNED
        assert step.keep is not None
        return run.model_copy(update={"attestation": step.status}), step.keep, statement

    def configmap(self, run: api.RunStatus, envelope_json: str) -> dict[str, Any]:
        meta = self.suite["metadata"]
        assert run.uid is not None
        return signer.attestation_configmap(
            meta["namespace"], run.name, run.uid, meta["name"], envelope_json
        )


def _one_byte_changed(envelope_json: str) -> str:
    envelope = json.loads(envelope_json)
    payload = bytearray(base64.b64decode(envelope["payload"]))
    at = payload.index(b'"Passed"') + 1
    payload[at] = ord("p")  # "Passed" -> "passed"
    envelope["payload"] = base64.b64encode(bytes(payload)).decode()
    return json.dumps(envelope, sort_keys=True, separators=(",", ":"))


@pytest.fixture
def signed_suite(
    admin_api: client.ApiClient, jobs: Jobs, poller_kube: Kube, tmp_path: Path
) -> dict[str, Any]:
    """The suite with its runs; returns the key paths and the good run's statement."""
    custom, core = jobs.custom, jobs.core
    namespace = jobs.namespace
    body = {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.SUITE_KIND,
        "metadata": {"name": SUITE},
        "spec": _spec(),
    }
    suite: dict[str, Any] = custom.create_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, namespace, api.SUITE_PLURAL, body
    )
    private, public = _key_pair(tmp_path, "cosign")
    _other_private, other = _key_pair(tmp_path, "other")
    signing = Signed(suite, private)
    uids = {
        name: jobs.create(f"{SUITE}-{name}")["metadata"]["uid"]
        for name in ("good", "tampered", "squatted", "lying")
    }

    good, good_envelope, good_statement = signing.sign(
        _run(f"{SUITE}-good", uids["good"], "Passed")
    )
    poller_kube.apply_configmap(signing.configmap(good, good_envelope))

    tampered, tampered_envelope, _ = signing.sign(
        _run(f"{SUITE}-tampered", uids["tampered"], "Passed")
    )
    changed = _one_byte_changed(tampered_envelope)
    poller_kube.apply_configmap(signing.configmap(tampered, changed))

    squatted, squatted_envelope, _ = signing.sign(
        _run(f"{SUITE}-squatted", uids["squatted"], "Passed")
    )
    squatter = signing.configmap(squatted, squatted_envelope)
    del squatter["metadata"]["ownerReferences"]  # made by someone else, under the run's name
    core.create_namespaced_config_map(namespace, squatter)

    # The status says Regressed; the key's holder signed Passed for it.
    lying_run = _run(f"{SUITE}-lying", uids["lying"], "Regressed")
    lying, lying_envelope, _ = signing.sign(
        lying_run, claimed=_run(f"{SUITE}-lying", uids["lying"], "Passed")
    )
    poller_kube.apply_configmap(signing.configmap(lying, lying_envelope))

    still_signing = _run(
        f"{SUITE}-signing",
        "22222222-0000-0000-0000-000000000005",
        "Passed",
        attestation=api.AttestationStatus(
            state="Signing", subject="lmevaljob/x@sha256:" + "0" * 64
        ),
    )
    sign_failed = _run(
        f"{SUITE}-sign-failed",
        "22222222-0000-0000-0000-000000000006",
        "Inconclusive",
        attestation=api.AttestationStatus(
            state="Failed", message="the signing pod failed: the key is not P-256"
        ),
    )
    active = _run(f"{SUITE}-active", "22222222-0000-0000-0000-000000000007", None)
    runs = [good, tampered, squatted, lying, still_signing, sign_failed, active]
    status = {
        "observedGeneration": 1,
        "lastVerdict": "Regressed",
        "runs": [r.model_dump(by_alias=True, exclude_none=True, mode="json") for r in runs],
    }
    custom.patch_namespaced_custom_object_status(
        api.API_GROUP, api.API_VERSION, namespace, api.SUITE_PLURAL, SUITE, {"status": status}
    )
    return {"key": str(public), "other": str(other), "statement": good_statement}


def _row(stdout: str, run: str) -> list[str]:
    for line in stdout.splitlines():
        cells = re.split(r"\s{3,}", line.strip())
        if cells[0] == f"{SUITE}-{run}":
            return cells
    raise AssertionError(f"no row for {run} in:\n{stdout}")


@pytest.mark.cluster
def test_verify_checks_each_runs_signed_verdict(cli: Cli, signed_suite: dict[str, Any]) -> None:
    key, other = signed_suite["key"], signed_suite["other"]

    good = cli("suite", "verify", SUITE, "--key", key, "--run", f"{SUITE}-good")
    assert good.returncode == 0, (good.stdout, good.stderr)
    assert good.stdout.splitlines()[0].split() == ["RUN", "VERDICT", "SUBJECT", "RESULT"]
    row = _row(good.stdout, "good")
    assert row[1] == "Passed" and row[3] == "OK", row
    assert re.fullmatch(rf"lmevaljob/{cli.namespace}/{SUITE}-good@sha256:[0-9a-f]{{64}}", row[2])
    assert f"verified: 1 signed verdict of suite {SUITE} with {key}" in good.stderr
    as_json = cli("suite", "verify", SUITE, "--key", key, "--run", f"{SUITE}-good", "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == [signed_suite["statement"]]

    wrong = cli("suite", "verify", SUITE, "--key", other, "--run", f"{SUITE}-good")
    assert wrong.returncode == 1, wrong.stderr
    assert _row(wrong.stdout, "good")[3] == f"FAILED: signature does not verify with {other}"
    assert f"signature does not verify with {other}" in wrong.stderr

    for run, why in (
        ("tampered", f"FAILED: signature does not verify with {key}"),
        ("squatted", f"FAILED: ConfigMap {SUITE}-squatted-attestation is not the run's: its "
         "controller ownerReference is none"),
        ("lying", "FAILED: the signed statement disagrees with the status: verdict: the "
         "statement says Passed, the status Regressed"),
    ):  # fmt: skip
        done = cli("suite", "verify", SUITE, "--key", key, "--run", f"{SUITE}-{run}")
        assert done.returncode == 1, (run, done.stdout, done.stderr)
        assert _row(done.stdout, run)[3].startswith(why), (run, done.stdout)
        assert done.stderr.startswith(f"error: 1 of 1 signed verdicts of suite {SUITE} failed")
    lying = cli("suite", "verify", SUITE, "--key", key, "--run", f"{SUITE}-lying")
    assert "criterion toy_mc acc,none pValue: the statement says 0.62, the status 0.00031" in (
        lying.stdout
    )

    # All together: every run listed, the unsigned ones not verified, and exit 1.
    every = cli("suite", "verify", SUITE, "--key", key)
    assert every.returncode == 1, every.stderr
    print(every.stdout, every.stderr)  # shown when a check fails
    assert _row(every.stdout, "good")[3] == "OK"
    assert _row(every.stdout, "signing")[3] == "not verified: Signing (the signing pod runs)"
    assert _row(every.stdout, "sign-failed")[3] == (
        "not verified: signing Failed: the signing pod failed: the key is not P-256"
    )
    assert _row(every.stdout, "active")[1:] == [
        "Active",
        "-",
        "not verified: not signed (no verdict yet)",
    ]
    assert every.stderr == (
        f"error: 3 of 4 signed verdicts of suite {SUITE} failed verification: {SUITE}-tampered, "
        f"{SUITE}-squatted, {SUITE}-lying (RESULT above says why)\n"
    )
    # -o json: the verified statements only; why the others failed goes to stderr.
    quiet = cli("suite", "verify", SUITE, "--key", key, "-o", "json")
    assert quiet.returncode == 1
    assert json.loads(quiet.stdout) == [signed_suite["statement"]]
    assert f"{SUITE}-squatted: ConfigMap {SUITE}-squatted-attestation is not the run's" in (
        quiet.stderr
    )

    # A run with no signed verdict, alone: nothing verified is not a success.
    unsigned = cli("suite", "verify", SUITE, "--key", key, "--run", f"{SUITE}-signing")
    assert unsigned.returncode == 1
    assert f"run {SUITE}-signing of suite {SUITE} has no signed verdict to verify" in (
        unsigned.stderr
    )
    missing = cli("suite", "verify", SUITE, "--key", key, "--run", f"{SUITE}-god")
    assert missing.returncode == ExitCode.NOT_FOUND
    assert f'did you mean "{SUITE}-good"?' in missing.stderr


# -- pure ------------------------------------------------------------------------------


def test_the_names_are_the_pollers() -> None:
    assert suiteverify.ATTESTATION_KEY == signer.ATTESTATION_KEY
    assert suiteverify.attestation_configmap_name("r") == signer.attestation_configmap_name("r")
    assert (suiteverify.SIGNED, suiteverify.SIGNING, suiteverify.SIGN_FAILED) == (
        attestation.SIGNED,
        attestation.SIGNING,
        attestation.FAILED,
    )


def _statement() -> dict[str, Any]:
    return attest.make_statement("lmevaljob/ns/r", "ab" * 32, {"verdict": "Passed"})


def test_the_drivers_refusals_are_told_apart(tmp_path: Path) -> None:
    private, public = _key_pair(tmp_path, "k")
    _, other = _key_pair(tmp_path, "o")
    envelope = attest.sign_statement(_statement(), private)
    assert attest.verify_envelope(envelope, public.read_bytes())["predicate"] == {
        "verdict": "Passed"
    }
    with pytest.raises(attest.AttestError) as refused:
        attest.verify_envelope(envelope, other.read_bytes())
    assert suiteverify.refusal(refused.value, "o.pub") == "signature does not verify with o.pub"
    wrong_type = {**envelope, "payloadType": "text/plain"}
    with pytest.raises(attest.AttestError) as refused:
        attest.verify_envelope(wrong_type, public.read_bytes())
    assert suiteverify.refusal(refused.value, "k.pub").startswith("the envelope: wrong payload")
    # A key that is no P-256 public key is the command's error, not a run's.
    rsa_like = b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"
    with pytest.raises(attest.AttestError) as refused:
        attest.verify_envelope(envelope, rsa_like)
    with pytest.raises(CliError) as usage:
        suiteverify.refusal(refused.value, "bad.pub")
    assert usage.value.code == ExitCode.USAGE


def test_the_key_file_is_checked_before_anything(tmp_path: Path) -> None:
    private, _ = _key_pair(tmp_path, "k")
    (tmp_path / "cosign.key").write_bytes(private)
    (tmp_path / "notes.txt").write_text("hello")
    for name, words in (
        ("cosign.key", "is a private key: verify with its public key"),
        ("notes.txt", "is not a PEM public key"),
        ("absent.pub", "No such file"),
    ):
        with pytest.raises(CliError) as refused:
            suiteverify.read_public_key(str(tmp_path / name))
        assert refused.value.code == ExitCode.USAGE and words in refused.value.message


def test_every_disagreement_is_named() -> None:
    suite = {"metadata": {"name": "s", "namespace": "ns", "uid": "su"}}
    run: dict[str, Any] = {
        "name": "r",
        "uid": "ru",
        "verdict": "Passed",
        "reason": "Passed",
        "criteria": [{"task": "t", "metric": "acc,none", "verdict": "Passed", "paired": 400}],
    }
    predicate = {
        "suite": {"name": "s", "namespace": "ns", "uid": "su"},
        "run": {k: v for k, v in run.items() if k != "verdict"},
        "verdict": "Passed",
        "reason": "Passed",
    }
    payload_statement = attest.make_statement("lmevaljob/ns/r", "cd" * 32, predicate)
    payload = attest.canonical_json(payload_statement)
    run["attestation"] = {
        "state": "Signed",
        "subject": f"lmevaljob/ns/r@sha256:{'cd' * 32}",
        "payloadDigest": "sha256:" + hashlib.sha256(payload).hexdigest(),
    }
    assert suiteverify.disagreements(payload_statement, payload, suite, run) == []
    # 400 and 400.0 are one JSON number (the apiserver may write either).
    as_float = copy.deepcopy(run)
    as_float["criteria"][0]["paired"] = 400.0
    assert suiteverify.disagreements(payload_statement, payload, suite, as_float) == []

    other = copy.deepcopy(run)
    other["attestation"]["subject"] = f"lmevaljob/ns/r@sha256:{'ee' * 32}"
    other["attestation"]["payloadDigest"] = "sha256:" + "0" * 64
    other["criteria"][0]["verdict"] = "Regressed"
    other["criteria"].append({"task": "u", "metric": "acc,none"})
    other["reason"] = "PassedWithWarnings"
    found = suiteverify.disagreements(payload_statement, payload, suite, other)
    assert any(f.startswith("the payload's digest is sha256:") for f in found), found
    assert any(f.startswith("the statement's subject is lmevaljob/ns/r@sha256:cdcd") for f in found)
    assert "reason: the statement says Passed, the status PassedWithWarnings" in found
    assert "criterion t acc,none verdict: the statement says Passed, the status Regressed" in found
    assert "criterion u acc,none: in the status, not in the statement" in found
    elsewhere = {"metadata": {"name": "s", "namespace": "ns", "uid": "another"}}
    assert suiteverify.disagreements(payload_statement, payload, elsewhere, run) == [
        "suite uid: the statement says su, the status another"
    ]


def test_verify_takes_a_key_and_offers_json_and_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    args = parser.parse_args(["lmes", "verify", "s", "--key", "k.pub", "-o", "yaml", "-n", "a"])
    assert (args.func, args.key, args.output.name, args.namespace) == (
        suites.cmd_suite_verify,
        "k.pub",
        "yaml",
        "a",
    )
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["suite", "verify", "s"])
    assert exited.value.code == ExitCode.USAGE
    assert "--key" in capsys.readouterr().err


def test_what_is_said_when_nothing_or_some_failed() -> None:
    unsigned = {"metadata": {"name": "s"}, "spec": {}}
    checks = [
        suiteverify.check_run(unsigned, run, None, b"", "k.pub")
        for run in (
            {"name": "a", "state": "Finished", "verdict": "Passed"},
            {"name": "b", "state": "Failed"},
            {"name": "c", "state": "Finished", "attestation": {"state": "Signing"}},
        )
    ]
    assert [c.verified for c in checks] == [False, False, False]
    said = suiteverify.nothing_verified(unsigned, checks, only=False)
    assert said.code == 1
    assert said.message == (
        "no run of suite s has a signed verdict to verify (2 not signed, 1 still signing); "
        "spec.attestation is not set: the poller signs no verdict"
    )
    assert suiteverify.nothing_verified(unsigned, [], only=False).message == (
        "suite s keeps no runs yet: nothing to verify"
    )
    failed = [
        suiteverify.RunCheck("a", "Passed", "x", suiteverify.FAILED, "signature does not verify"),
        suiteverify.RunCheck("b", "Passed", "x", suiteverify.FAILED, "signature does not verify"),
    ]
    assert suiteverify.failures(failed, table=True) == "a, b: signature does not verify"
    failed.append(suiteverify.RunCheck("c", "Passed", "x", suiteverify.FAILED, "not the run's"))
    assert suiteverify.failures(failed, table=True) == "a, b, c (RESULT above says why)"
    assert suiteverify.failures(failed, table=False).endswith("; c: not the run's")
