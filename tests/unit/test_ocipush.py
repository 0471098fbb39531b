"""spec.outputs.oci, its pure pieces: the manifest, the auth pieces, the schema, the pod, status.

The push against a real registry is in tests/driver/test_ocipush.py and,
through the whole system, tests/e2e/test_oci_results.py.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from typing import Any

import pytest
from pydantic import ValidationError

from driver import ocipush
from driver.decoder import Outcome
from poller import api
from poller.api.settings import Settings
from poller.decisions import outcome
from poller.decisions.draft import StatusDraft
from poller.decisions.views import JobView
from poller.jobpod import ocioutput, podspec

DIGEST = "sha256:" + "a" * 64


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_manifest_is_an_oci_11_artifact() -> None:
    raw = ocipush.build_manifest(b'{"results": {}}', b'{"run_id": "r"}')
    manifest = json.loads(raw)
    assert manifest["schemaVersion"] == 2
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert manifest["artifactType"] == "application/vnd.lmeval.results.v1+json"
    # The OCI empty config: the two bytes "{}", with the spec's well-known digest.
    assert manifest["config"] == {
        "mediaType": "application/vnd.oci.empty.v1+json",
        "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
        "size": 2,
    }
    results, provenance = manifest["layers"]
    assert results["digest"] == _sha(b'{"results": {}}') and results["size"] == 15
    assert results["annotations"] == {"org.opencontainers.image.title": "results.json"}
    assert provenance["digest"] == _sha(b'{"run_id": "r"}')
    assert "subject" not in manifest
    # Canonical: the same inputs, the same bytes (so the same digest).
    assert ocipush.build_manifest(b'{"results": {}}', b'{"run_id": "r"}') == raw
    attached = json.loads(ocipush.build_manifest(b"{}", b"{}", (ocipush.MANIFEST_TYPE, DIGEST, 9)))
    assert attached["subject"] == {"mediaType": ocipush.MANIFEST_TYPE, "digest": DIGEST, "size": 9}


def test_challenges_and_docker_config_credentials() -> None:
    scheme, params = ocipush.parse_challenge(
        'Bearer realm="https://auth.example.com/token",service="registry.example.com",'
        'scope="repository:team/evals:pull,push"'
    )
    assert scheme == "bearer"
    assert params == {
        "realm": "https://auth.example.com/token",
        "service": "registry.example.com",
        "scope": "repository:team/evals:pull,push",
    }
    assert ocipush.parse_challenge('Basic realm="r"') == ("basic", {"realm": "r"})
    auth = base64.b64encode(b"u:p").decode()
    assert (
        ocipush.basic_credentials(
            {"auths": {"r.example.com:5000": {"auth": auth}}}, "r.example.com:5000"
        )
        == auth
    )
    by_fields = {"auths": {"https://r.example.com": {"username": "u", "password": "p"}}}
    assert ocipush.basic_credentials(by_fields, "r.example.com") == auth
    assert (
        ocipush.basic_credentials({"auths": {"other.example.com": {"auth": auth}}}, "r.example.com")
        is None
    )
    assert ocipush.basic_credentials({"auths": []}, "r.example.com") is None


@pytest.mark.parametrize(
    "reference",
    [
        "https://r.example.com/a:t",
        "-r.example.com/a:t",
        "r.example.com/a",
        "r.example.com/A:t",
        "r/a:-t",
    ],
)
def test_driver_refuses_bad_references(reference: str) -> None:
    with pytest.raises(ocipush.OciError):
        ocipush.parse_reference(reference)


def test_driver_refuses_plain_http_off_loopback_and_bad_subjects() -> None:
    assert ocipush.parse_reference("127.0.0.1:5000/team/evals:t").registry == "127.0.0.1:5000"
    with pytest.raises(ocipush.OciError, match="loopback"):
        ocipush.push_results("r.example.com/a:t", b"{}", b"{}", plain_http=True)
    with pytest.raises(ocipush.OciError, match="subject"):
        ocipush.push_results("127.0.0.1:1/a:t", b"{}", b"{}", subject="latest", plain_http=True)


def _spec(**oci: Any) -> api.LMEvalJobSpec:
    return api.LMEvalJobSpec.model_validate({"model": "m", "tasks": ["t"], "outputs": {"oci": oci}})


@pytest.mark.parametrize(
    "oci",
    [
        {"repository": "https://r.example.com/evals"},
        {"repository": "-r.example.com/evals"},
        {"repository": "r.example.com"},
        {"repository": "r.example.com/evals", "tag": "-x"},
        {"repository": "r.example.com/evals", "subject": "sha256:abc"},
        {"repository": "r.example.com/evals", "credentialsSecret": "Not_A_Name"},
        {"repository": "r.example.com/evals", "plainHTTP": True},
        {"repository": "127.0.0.1.example.com/evals", "plainHTTP": True},
    ],
)
def test_schema_refuses(oci: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        _spec(**oci)


def test_pod_pushes_with_the_mounted_secret() -> None:
    spec = _spec(
        repository="127.0.0.1:5000/team/evals",
        credentialsSecret="registry-creds",
        subject=DIGEST,
        plainHTTP=True,
    )
    pod = podspec.build_pod(name="j", namespace="ns", uid="u", spec=spec, settings=Settings())
    main = pod["spec"]["containers"][0]
    tag = ocioutput.default_tag("j", "u")
    options = main["command"][: main["command"].index("--")]
    assert f"--oci-push=127.0.0.1:5000/team/evals:{tag}" in options
    assert f"--oci-subject={DIGEST}" in options
    assert f"--oci-auth={ocioutput.CREDENTIALS_FILE}" in options
    assert "--oci-scheme=http" in options
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "oci-credentials")
    assert volume["secret"]["secretName"] == "registry-creds"
    assert volume["secret"]["items"] == [{"key": ".dockerconfigjson", "path": "config.json"}]
    mount = next(m for m in main["volumeMounts"] if m["name"] == "oci-credentials")
    assert mount == {
        "name": "oci-credentials",
        "mountPath": ocioutput.CREDENTIALS_DIR,
        "readOnly": True,
    }
    plain = podspec.build_pod(
        name="j",
        namespace="ns",
        uid="u",
        spec=_spec(repository="r.example.com/e", tag="v1"),
        settings=Settings(),
    )
    command = plain["spec"]["containers"][0]["command"]
    assert "--oci-push=r.example.com/e:v1" in command
    assert not any(w.startswith(("--oci-auth", "--oci-scheme", "--oci-subject")) for w in command)
    assert all(v["name"] != "oci-credentials" for v in plain["spec"]["volumes"])


def test_default_tag_is_a_valid_tag_unique_per_job() -> None:
    long = "a" * 120 + ".b-" + "c" * 100
    for name in ("j", long, "x" * 253):
        tag = ocioutput.default_tag(name, "uid-1")
        assert len(tag) <= 128 and api.OciOutput(repository="r.example.com/e", tag=tag)
    assert ocioutput.default_tag("j", "uid-1") != ocioutput.default_tag("j", "uid-2")


NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def _record(spec: dict[str, Any], done: Outcome) -> api.LMEvalJobStatus:
    job = JobView.from_object(
        {
            "metadata": {"namespace": "ns", "name": "j", "uid": "u", "generation": 1},
            "spec": {"model": "m", "tasks": ["t"], **spec},
            "status": {"state": "Running"},
        }
    )
    draft = StatusDraft(job, NOW)
    outcome.record_results_artifact(job, done, draft)
    draft.fields["conditions"] = draft.conditions
    return api.LMEvalJobStatus.model_validate(draft.fields)


def _outcome(**fields: Any) -> Outcome:
    return Outcome(
        event="completed", exit_code=0, signal=None, message="", results_path=None, **fields
    )


def test_status_names_the_artifact_or_why_not() -> None:
    spec = {"outputs": {"oci": {"repository": "r.example.com/team/evals"}}}
    pushed = _record(spec, _outcome(results_artifact=f"r.example.com/team/evals@{DIGEST}"))
    assert pushed.results_artifact == f"r.example.com/team/evals@{DIGEST}"
    (condition,) = pushed.conditions or []
    assert (condition.type, condition.status, condition.reason) == (
        "ResultsPushed",
        "True",
        "Pushed",
    )
    failed = _record(spec, _outcome(results_artifact_error="HTTP 401"))
    assert failed.results_artifact is None and failed.results_artifact_error == "HTTP 401"
    (condition,) = failed.conditions or []
    assert (condition.status, condition.reason) == ("False", "PushFailed")
    # The pod's log may not name another repository.
    forged = _record(spec, _outcome(results_artifact=f"evil.example.com/x@{DIGEST}"))
    assert forged.results_artifact is None
    assert "outside spec.outputs.oci.repository" in (forged.results_artifact_error or "")
    silent = _record(spec, _outcome())
    assert silent.results_artifact_error == "the driver did not report the push"
    # Without spec.outputs.oci, nothing.
    assert (
        _record(
            {}, _outcome(results_artifact=f"r.example.com/team/evals@{DIGEST}")
        ).results_artifact
        is None
    )


def test_lmeval_get_shows_the_artifact() -> None:
    from lmeval_cli import render

    job = {
        "metadata": {"name": "j", "namespace": "ns", "creationTimestamp": "2026-12-01T00:00:00Z"},
        "status": {"state": "Complete", "reason": "Succeeded", "resultsArtifact": f"r/e@{DIGEST}"},
    }
    pairs = render._status_pairs(job, NOW)
    assert ("Results artifact", f"r/e@{DIGEST}") in pairs
    job["status"] = {"state": "Complete", "resultsArtifactError": "HTTP 401"}
    assert ("Results not pushed", "HTTP 401") in render._status_pairs(job, NOW)
