"""Signed verdicts pushed to a real registry and checked by the real cosign (driver.attest).

A real ``docker-registry`` on loopback (``tests.ociregistry``) holds a small
model artifact pushed by ``driver.ocipush``; a statement about its digest is
signed and pushed by ``driver.attest`` (the functions, and ``python -m
driver.attest`` as the job pod runs it); then cosign v2.6.5, built from its
Go module (``lmeval_sandbox.cosign``), runs ``verify-attestation --key
cosign.pub --type <predicateType>`` with its HOME in the test's directory,
an empty trusted root and no transparency log, and a proxy that refuses all
but loopback: it must exit 0 and print our envelope, whose payload is our
statement, without ever trying the network (no TUF fetch in its stderr).

- the ``.att`` manifest is what cosign writes (tag, layer media type,
  annotations, config) plus the OCI 1.1 subject naming the model;
- one changed byte of the statement, pushed as the only attestation, makes
  cosign refuse (non-zero, "no matching attestations: accepted signatures
  do not match threshold"), and
  ``verify_envelope`` too;
- a key made by ``cosign generate-key-pair`` signs; an attestation that
  ``cosign attest`` made first is kept when ours is appended, cosign verifies
  both by their types, and ``replace`` drops only ours of the same type;
- with Basic auth, the command takes the credentials from a mounted
  directory as the pod has them; without them it fails in one line.
"""

from __future__ import annotations

import base64
import copy
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from lmeval_sandbox import cosign

from driver import attest, ocipush
from tests import ociregistry

pytestmark = pytest.mark.skipif(not ociregistry.available(), reason="docker-registry/skopeo")

REPO = Path(__file__).resolve().parents[2]
PREDICATE = {"suite": "nightly", "verdict": "Passed", "run": "nightly-7"}
# Words of cosign's that say it tried Sigstore's services (TUF, Rekor, Fulcio).
NETWORK_WORDS = ("TUF", "trusted_root.json", "proxyconnect", "rekor", "fulcio")


@pytest.fixture(scope="module")
def cosign_binary() -> Path:
    """cosign, built once per cache key (setup.sh's step builds it for CI)."""
    return cosign.ensure_cosign()


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[ociregistry.Registry]:
    with ociregistry.running(tmp_path / "registry") as running:
        yield running


def _model(registry: ociregistry.Registry, name: str = "team/model") -> str:
    """A small model artifact in the registry: ``host/repo@sha256:...``."""
    return ocipush.push_results(
        f"{registry.address}/{name}:v1", b'{"weights": "tiny"}', b'{"origin": "test"}',
        plain_http=True,
    )  # fmt: skip


def _key_pair(directory: Path) -> tuple[Path, Path]:
    """An ECDSA P-256 key as ``openssl genpkey`` writes it (PKCS#8), and cosign.pub."""
    key = ec.generate_private_key(ec.SECP256R1())
    private = directory / "signing.key"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public = directory / "cosign.pub"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def _statement(reference: str, predicate: dict[str, Any] | None = None) -> dict[str, Any]:
    name, digest = reference.split("@")
    return attest.make_statement(name, digest, predicate or PREDICATE)


def _verify(
    reference: str, public: Path, home: Path, predicate_type: str = attest.PREDICATE_TYPE
) -> subprocess.CompletedProcess[str]:
    done = cosign.verify_attestation(reference, public, predicate_type, home=home,
                                     insecure_registry=True)  # fmt: skip
    tried = [word for word in NETWORK_WORDS if word.lower() in done.stderr.lower()]
    assert not tried, f"cosign tried the network ({tried}): {done.stderr}"
    return done


def _statements(stdout: str) -> list[dict[str, Any]]:
    """The statements of the envelopes cosign printed, one a line."""
    out = []
    for line in stdout.splitlines():
        if line.strip():
            envelope = json.loads(line)
            out.append(json.loads(base64.b64decode(envelope["payload"])))
    return out


def _att_manifest(registry: ociregistry.Registry, reference: str) -> dict[str, Any]:
    repository, digest = reference.removeprefix(f"{registry.address}/").split("@")
    raw = registry.get(
        f"/v2/{repository}/manifests/{attest.attestation_tag(digest)}",
        accept=ocipush.MANIFEST_TYPE,
    )
    manifest: dict[str, Any] = json.loads(raw)
    manifest["_digest"] = ocipush.digest_of(raw)
    return manifest


def test_cosign_verifies_our_attestation_and_refuses_a_changed_byte(
    cosign_binary: Path, registry: ociregistry.Registry, tmp_path: Path
) -> None:
    model = _model(registry)
    private, public = _key_pair(tmp_path)
    statement = _statement(model)
    envelope = attest.sign_statement(statement, private.read_bytes())
    pushed = attest.push_attestation(model, envelope, plain_http=True)

    manifest = _att_manifest(registry, model)
    assert manifest["_digest"] == pushed
    assert manifest["mediaType"] == ocipush.MANIFEST_TYPE
    assert manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.dsse.envelope.v1+json"
    assert layer["annotations"] == {
        "dev.cosignproject.cosign/signature": "",
        "predicateType": attest.PREDICATE_TYPE,
    }
    model_digest = model.split("@")[1]
    assert manifest["subject"]["digest"] == model_digest
    assert manifest["subject"]["mediaType"] == ocipush.MANIFEST_TYPE

    home = tmp_path / "cosign-home"
    done = _verify(model, public, home)
    assert done.returncode == 0, done.stderr
    assert _statements(done.stdout) == [statement]
    # A type nobody attested: cosign finds nothing of it.
    other = _verify(model, public, home, "https://example.com/other/v1")
    assert other.returncode != 0 and "none of the attestations matched" in other.stderr

    # One byte of the statement changed ("Passed" -> "Passes"), the signature kept,
    # pushed as the only attestation of that type.
    tampered = copy.deepcopy(envelope)
    payload = base64.b64decode(tampered["payload"])
    assert payload.count(b'"Passed"') == 1
    tampered["payload"] = base64.b64encode(payload.replace(b'"Passed"', b'"Passes"')).decode()
    attest.push_attestation(model, tampered, plain_http=True, replace=True)
    assert len(_att_manifest(registry, model)["layers"]) == 1
    refused = _verify(model, public, home)
    assert refused.returncode != 0, refused.stdout
    assert "no matching attestations" in refused.stderr, refused.stderr
    assert "accepted signatures do not match threshold" in refused.stderr
    assert refused.stdout.strip() == ""
    with pytest.raises(attest.AttestError, match="bad signature"):
        attest.verify_envelope(tampered, public.read_bytes())


def test_a_cosign_key_and_cosigns_own_attestation_side_by_side(
    cosign_binary: Path, registry: ociregistry.Registry, tmp_path: Path
) -> None:
    model = _model(registry)
    home = tmp_path / "cosign-home"
    password = {"COSIGN_PASSWORD": "suite-key-pass"}
    cosign.run_cosign("generate-key-pair", home=home, env=password)
    key, public = home / "cosign.key", home / "cosign.pub"
    assert key.read_text().startswith("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----")

    # cosign's own attestation first, of another type.
    (home / "sbom.json").write_text(json.dumps({"packages": []}))
    theirs = "https://example.com/sbom/v1"
    cosign.run_cosign(
        "attest", "--key", "cosign.key", "--type", theirs, "--predicate", "sbom.json",
        "--tlog-upload=false", "--allow-insecure-registry", "--allow-http-registry", "--yes",
        model, home=home, env=password,
    )  # fmt: skip
    (cosign_layer,) = _att_manifest(registry, model)["layers"]

    # Ours, signed with cosign's key, appended; then a second verdict.
    statement = _statement(model)
    envelope = attest.sign_statement(statement, key.read_bytes(), b"suite-key-pass")
    attest.push_attestation(model, envelope, plain_http=True)
    later = _statement(model, {**PREDICATE, "run": "nightly-8"})
    attest.push_attestation(
        model, attest.sign_statement(later, key.read_bytes(), b"suite-key-pass"), plain_http=True
    )
    layers = _att_manifest(registry, model)["layers"]
    assert len(layers) == 3 and layers[0] == cosign_layer
    done = _verify(model, public, home)
    assert done.returncode == 0, done.stderr
    assert sorted(s["predicate"]["run"] for s in _statements(done.stdout)) == [
        "nightly-7",
        "nightly-8",
    ]
    done = _verify(model, public, home, theirs)
    assert done.returncode == 0, done.stderr
    assert [s["predicateType"] for s in _statements(done.stdout)] == [theirs]

    # The same envelope again changes nothing; replace keeps cosign's layer only.
    before = _att_manifest(registry, model)["_digest"]
    again = attest.sign_statement(later, key.read_bytes(), b"suite-key-pass")
    assert attest.push_attestation(model, _latest(registry, model), plain_http=True) == before
    attest.push_attestation(model, again, plain_http=True, replace=True)
    layers = _att_manifest(registry, model)["layers"]
    assert len(layers) == 2 and layers[0] == cosign_layer
    done = _verify(model, public, home)
    assert done.returncode == 0, done.stderr
    assert [s["predicate"]["run"] for s in _statements(done.stdout)] == ["nightly-8"]


def _latest(registry: ociregistry.Registry, reference: str) -> dict[str, Any]:
    """The envelope of the last layer of `reference`'s .att manifest."""
    repository = reference.removeprefix(f"{registry.address}/").split("@")[0]
    layer = _att_manifest(registry, reference)["layers"][-1]
    envelope: dict[str, Any] = json.loads(registry.get(f"/v2/{repository}/blobs/{layer['digest']}"))
    return envelope


def _command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "driver.attest", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_the_command_pushes_with_the_pods_credentials(cosign_binary: Path, tmp_path: Path) -> None:
    users = {"suite": "push-pass"}
    with ociregistry.running(tmp_path / "registry", users) as registry:
        model = ocipush.push_results(
            f"{registry.address}/team/model:v1", b"{}", b"{}", plain_http=True,
            docker_config=str(registry.docker_config(tmp_path / "model-auth.json")),
        )  # fmt: skip
        private, public = _key_pair(tmp_path)
        statement_file = tmp_path / "statement.json"
        statement = _statement(model)
        statement_file.write_text(json.dumps(statement))
        # As the pod mounts the Secret: a directory holding config.json.
        mounted = tmp_path / "oci-credentials"
        mounted.mkdir()
        registry.docker_config(mounted / "config.json")
        base = ["--statement", str(statement_file), "--key", str(private), "--push", model]
        base.append("--plain-http")

        refused = _command(*base)
        assert refused.returncode == 1 and refused.stdout == ""
        (line,) = refused.stderr.splitlines()
        assert "401" in line, line

        done = _command(*base, "--registry-credentials", str(mounted))
        assert done.returncode == 0, done.stderr
        (line,) = done.stdout.splitlines()
        result = json.loads(line)
        assert attest.verify_envelope(result["envelope"], public.read_bytes()) == statement
        manifest = _att_manifest(registry, model)
        assert result["pushed"] == manifest["_digest"]

        # cosign reads the same credentials from its own Docker configuration.
        home = tmp_path / "cosign-home"
        (home / ".docker").mkdir(parents=True)
        registry.docker_config(home / ".docker" / "config.json")
        done = _verify(model, public, home)
        assert done.returncode == 0, done.stderr
        assert _statements(done.stdout) == [statement]
