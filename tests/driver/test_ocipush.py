"""The driver pushes a completed run's results to a real OCI registry (spec.outputs.oci).

A real ``docker-registry`` on loopback (``tests.ociregistry``), anonymous or
with Basic auth from an htpasswd file; the driver runs as a process, as in
the pod, with a fake lm_eval child that writes a results file. The artifact
is read back with skopeo and its results blob compared byte for byte with
the results the driver reported. Bearer tokens come from a token service of
the test's (RS256 JWTs with their certificate in ``x5c``) that the real
registry verifies against its ``rootcertbundle``. A push that fails (wrong credentials, no
registry) never fails the run: the final marker says why.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver import ocipush
from driver.protocol import EXIT_OK
from tests import ociregistry
from tests.driver.conftest import WRITE_RESULTS, fake_child, run_driver
from tests.driver.test_outcomes import only_final

pytestmark = pytest.mark.skipif(not ociregistry.available(), reason="docker-registry/skopeo")

RESULTS = {"results": {"arc": {"acc,none": 0.5}}, "config": {"model": "fake"}}


def _run(tmp_path: Path, env: dict[str, str], *options: str) -> tuple[int, dict[str, object]]:
    results = tmp_path / "results.json"
    tmp_path.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(RESULTS))
    env["FAKE_RESULTS"] = str(results)
    run = run_driver(
        ["--output-root", str(tmp_path / "root"), "--run-id", "run-1", *options],
        fake_child(WRITE_RESULTS),
        env,
    )
    return run.returncode, only_final(run)


def _check_artifact(registry: ociregistry.Registry, artifact: str, tag: str) -> dict[str, object]:
    repository, digest = artifact.removeprefix(f"{registry.address}/").split("@")
    manifest = registry.skopeo_raw(f"{repository}:{tag}")
    assert manifest["mediaType"] == ocipush.MANIFEST_TYPE
    assert manifest["artifactType"] == ocipush.ARTIFACT_TYPE
    assert registry.skopeo_raw(f"{repository}@{digest}") == manifest
    layers = manifest["layers"]
    assert isinstance(layers, list) and len(layers) == 2
    blob = registry.get(f"/v2/{repository}/blobs/{layers[0]['digest']}")
    assert json.loads(blob) == RESULTS
    provenance = json.loads(registry.get(f"/v2/{repository}/blobs/{layers[1]['digest']}"))
    assert provenance["run_id"] == "run-1" and "driver_version" in provenance
    assert provenance["argv"][-2] == "--output_path"
    return manifest


def test_anonymous_push_with_a_subject(tmp_path: Path, env: dict[str, str]) -> None:
    with ociregistry.running(tmp_path / "registry") as registry:
        ref = f"{registry.address}/team/evals"
        code, final = _run(tmp_path / "a", env, f"--oci-push={ref}:model", "--oci-scheme=http")
        assert code == EXIT_OK and final["event"] == "completed", final
        model = str(final["results_artifact"])
        _check_artifact(registry, model, "model")
        # A second artifact attached to the first as its OCI 1.1 subject.
        subject = model.split("@")[1]
        code, final = _run(
            tmp_path / "b",
            env,
            f"--oci-push={ref}:run-2",
            "--oci-scheme=http",
            f"--oci-subject={subject}",
        )
        assert code == EXIT_OK, final
        manifest = _check_artifact(registry, str(final["results_artifact"]), "run-2")
        assert isinstance(manifest["subject"], dict)
        assert manifest["subject"]["digest"] == subject
        # An unknown subject fails the push, not the run.
        code, final = _run(
            tmp_path / "c",
            env,
            f"--oci-push={ref}:run-3",
            "--oci-scheme=http",
            "--oci-subject=sha256:" + "0" * 64,
        )
        assert code == EXIT_OK and final["event"] == "completed"
        assert "results_artifact" not in final
        assert "not found" in str(final["results_artifact_error"])


def test_basic_auth_from_a_docker_config(tmp_path: Path, env: dict[str, str]) -> None:
    with ociregistry.running(tmp_path / "registry", {"pusher": "s3cret-pass"}) as registry:
        ref = f"{registry.address}/team/evals:job-1"
        good = registry.docker_config(tmp_path / "good.json")
        bad = registry.docker_config(tmp_path / "bad.json", password="wrong")
        code, final = _run(tmp_path / "none", env, f"--oci-push={ref}", "--oci-scheme=http")
        assert code == EXIT_OK and "results_artifact" not in final
        assert "401" in str(final["results_artifact_error"]), final
        code, final = _run(
            tmp_path / "bad", env, f"--oci-push={ref}", "--oci-scheme=http", f"--oci-auth={bad}"
        )
        assert code == EXIT_OK and "refused the credentials" in str(
            final["results_artifact_error"]
        ), final
        code, final = _run(
            tmp_path / "good", env, f"--oci-push={ref}", "--oci-scheme=http", f"--oci-auth={good}"
        )
        assert code == EXIT_OK and final["event"] == "completed", final
        _check_artifact(registry, str(final["results_artifact"]), "job-1")
        assert "s3cret" not in json.dumps(final)


def test_bearer_token_from_the_challenges_realm(tmp_path: Path, env: dict[str, str]) -> None:
    users = {"pusher": "token-pass"}
    with ociregistry.running(tmp_path / "registry", users, bearer=True) as registry:
        assert registry.tokens is not None
        ref = f"{registry.address}/team/evals:job-1"
        good = registry.docker_config(tmp_path / "good.json")
        code, final = _run(tmp_path / "none", env, f"--oci-push={ref}", "--oci-scheme=http")
        assert code == EXIT_OK and "token from" in str(final["results_artifact_error"]), final
        code, final = _run(
            tmp_path / "good", env, f"--oci-push={ref}", "--oci-scheme=http", f"--oci-auth={good}"
        )
        assert code == EXIT_OK and final["event"] == "completed", final
        _check_artifact(registry, str(final["results_artifact"]), "job-1")
        # The driver asked for push and pull on its repository, for the registry's service.
        wanted = {"scope": "repository:team/evals:pull,push", "service": "lmeval-test-registry"}
        assert wanted in registry.tokens.requests, registry.tokens.requests


def test_no_registry_and_no_plain_http_off_loopback(tmp_path: Path, env: dict[str, str]) -> None:
    port = ociregistry.free_port()
    code, final = _run(
        tmp_path / "a", env, f"--oci-push=127.0.0.1:{port}/evals:x", "--oci-scheme=http"
    )
    assert code == EXIT_OK and final["event"] == "completed"
    assert "results_artifact_error" in final and "results_artifact" not in final
    code, final = _run(
        tmp_path / "b", env, "--oci-push=registry.example.com/evals:x", "--oci-scheme=http"
    )
    assert code == EXIT_OK
    assert "only to a loopback registry" in str(final["results_artifact_error"])
