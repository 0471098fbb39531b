"""A suite's signed verdict, offline: the statement, the DSSE envelope, the keys (driver.attest).

Checks, without a registry (tests/driver/test_attest.py pushes and runs the
real cosign on the result):

- PAE is byte for byte the DSSE specification's example, and counts bytes;
- a statement made for a model signs and verifies back to itself with a
  generated P-256 key, in every PEM form ``openssl`` writes (PKCS#8, SEC1,
  encrypted PKCS#8); the payload is the canonical JSON of the statement;
- one changed byte of the payload or of the signature, a key of another
  pair, another payload type, a signed payload that is no in-toto statement:
  each refused with its own message;
- cosign's encrypted key (a fixed one made by ``cosign generate-key-pair``
  v2.6.5, password ``unit-test-only``) opens to the key of its cosign.pub,
  and ``keyid`` is its SSH fingerprint as ``ssh-keygen -l`` printed it; a
  wrong password, a damaged box or other scrypt settings are refused;
- RSA and P-384 keys are refused; a password for a plain key is an error;
- the ``.att`` image's configuration is the bytes cosign pushed for one layer;
- a push whose statement is about another digest, or to a reference that is
  no ``@sha256:`` one, or over plain HTTP off loopback, fails before any
  request;
- ``python -m driver.attest`` without --push prints one JSON line, and every
  error (a missing file, an oversized statement, a bad option) is one line
  on stderr with status 1; without ``cryptography`` (an image without the
  ``attest`` extra) statements are still made, and signing says what is
  missing.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from driver import attest, ocipush

REPO = Path(__file__).resolve().parents[2]
MODEL = "sha256:" + "ab" * 32
PREDICATE = {"verdict": "Passed", "criteria": [{"task": "arc_easy", "verdict": "Passed"}]}

# Made by `COSIGN_PASSWORD=unit-test-only cosign generate-key-pair` (cosign v2.6.5,
# built by lmeval_sandbox.cosign). A test key: it signs nothing anywhere else.
COSIGN_KEY = b"""\
-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----
eyJrZGYiOnsibmFtZSI6InNjcnlwdCIsInBhcmFtcyI6eyJOIjo2NTUzNiwiciI6
OCwicCI6MX0sInNhbHQiOiJvbEdVdGZabTRoK2dzYzdvZmphNTZSMFYzYTd0R1ZU
WlpmTnhjVmtaVlpvPSJ9LCJjaXBoZXIiOnsibmFtZSI6Im5hY2wvc2VjcmV0Ym94
Iiwibm9uY2UiOiJpc1NQc3VTVjhaOFVCNzlSeVE2RzJoWDdzeFdVV2pKZyJ9LCJj
aXBoZXJ0ZXh0IjoiQ0RhMkF2VDRVMzJUNXlMSTh6T043UkZoS0ZBNCtTNjF1YUtk
cC90ZlBuWHZIcHY5ZTZvK04xd2NzeFlqb3Z0RzdLQ1B5RE9IaEx0K0ZxY085anJx
Nzl4Qis1aEIwL1VvSTVjMU1ROVVLOTd2OTVNaWdmZnlONkpyV3R4dDdHNHo1MG10
ZWtZSDRDNmZKazYzbFpWcm04K1F5ZjZDMzZDUEdqWTlWdmZER3lpcFBQbHY4VUFt
ck53RFBUUzkrdWZWZ1lid0txVWVsTmNGblE9PSJ9
-----END ENCRYPTED SIGSTORE PRIVATE KEY-----
"""
COSIGN_PASSWORD = b"unit-test-only"
COSIGN_PUB = b"""\
-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEtaDwIpc16sLsisEFrWJf+q2vGKFx
F8aMD/tgsbKHHMLrE/esxfx22pOmreu3PS/2WQbEe3iKqiUUPR245LPMiw==
-----END PUBLIC KEY-----
"""
# `ssh-keygen -l` of that public key (after `ssh-keygen -i -m PKCS8`).
COSIGN_FINGERPRINT = "SHA256:5y8eDEYBFFL4J84AywS5z4DbX9Z5RAa83X14ghlCw5I"


def _pair(curve: ec.EllipticCurve | None = None) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(curve or ec.SECP256R1())
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


def _statement() -> dict[str, Any]:
    return attest.make_statement("registry.example/team/model", MODEL, PREDICATE)


def _flip(text: str, index: int) -> str:
    """`text` (base64) with one byte of what it encodes changed."""
    raw = bytearray(base64.b64decode(text))
    raw[index] ^= 0x01
    return base64.b64encode(bytes(raw)).decode()


def test_pae_is_the_dsse_specifications_example() -> None:
    assert (
        attest.pae("http://example.com/HelloWorld", b"hello world")
        == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
    # Lengths are in bytes of UTF-8, not characters.
    assert attest.pae("t\u00e9", "\u00e9".encode()) == "DSSEv1 3 t\u00e9 2 \u00e9".encode()


def test_a_statement_signs_and_verifies_back() -> None:
    private, public = _pair()
    statement = _statement()
    assert statement == {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "registry.example/team/model", "digest": {"sha256": "ab" * 32}}],
        "predicateType": "https://foundation-model-stack.github.com/lmeval/suite-verdict/v1",
        "predicate": PREDICATE,
    }
    envelope = attest.sign_statement(statement, private)
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    payload = base64.b64decode(envelope["payload"])
    assert payload == json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    (signature,) = envelope["signatures"]
    assert set(signature) == {"keyid", "sig"}
    assert attest.verify_envelope(envelope, public) == statement
    # ECDSA signatures differ each time; both verify.
    again = attest.sign_statement(statement, private)
    assert again["payload"] == envelope["payload"] and again["signatures"] != envelope["signatures"]
    assert attest.verify_envelope(again, public) == statement
    assert attest.public_key_pem(private) == public
    assert attest.statement_subject_matches(statement, MODEL)
    assert attest.statement_subject_matches(statement, "ab" * 32, "registry.example/team/model")
    assert not attest.statement_subject_matches(statement, MODEL, "elsewhere/model")
    assert not attest.statement_subject_matches(statement, "sha256:" + "cd" * 32)


@pytest.mark.parametrize("where", ["payload", "signature"])
def test_one_changed_byte_is_refused(where: str) -> None:
    private, public = _pair()
    envelope = attest.sign_statement(_statement(), private)
    for index in (0, 7, -1):
        tampered = copy.deepcopy(envelope)
        if where == "payload":
            tampered["payload"] = _flip(tampered["payload"], index)
        else:
            tampered["signatures"][0]["sig"] = _flip(tampered["signatures"][0]["sig"], index)
        with pytest.raises(attest.AttestError, match="bad signature"):
            attest.verify_envelope(tampered, public)


def test_a_key_of_another_pair_is_refused() -> None:
    private, _public = _pair()
    _other_private, other_public = _pair()
    envelope = attest.sign_statement(_statement(), private)
    with pytest.raises(attest.AttestError, match="bad signature"):
        attest.verify_envelope(envelope, other_public)


def test_another_payload_type_or_no_statement_is_refused() -> None:
    private, public = _pair()
    envelope = attest.sign_statement(_statement(), private)
    envelope["payloadType"] = "application/json"
    with pytest.raises(attest.AttestError, match="wrong payload type"):
        attest.verify_envelope(envelope, public)
    # A valid signature over a payload that is no in-toto statement.
    key = serialization.load_pem_private_key(private, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    for payload in (b'{"hello": "world"}', b"not json", b'{"_type": "x"}'):
        signature = key.sign(attest.pae(attest.PAYLOAD_TYPE, payload), ec.ECDSA(hashes.SHA256()))
        forged = {
            "payloadType": attest.PAYLOAD_TYPE,
            "payload": base64.b64encode(payload).decode(),
            "signatures": [{"keyid": "", "sig": base64.b64encode(signature).decode()}],
        }
        with pytest.raises(attest.AttestError, match="not an in-toto statement"):
            attest.verify_envelope(forged, public)
    for broken in ({}, {"payloadType": attest.PAYLOAD_TYPE, "payload": "%%", "signatures": []}):
        with pytest.raises(attest.AttestError):
            attest.verify_envelope(broken, public)


def test_statements_are_checked_before_signing() -> None:
    private, _public = _pair()
    good = _statement()
    changes: list[dict[str, Any]] = [
        {"_type": "https://in-toto.io/Statement/v2"},
        {"subject": []},
        {"subject": [{"name": "m", "digest": {"sha256": "XYZ"}}]},
        {"subject": [{"name": 3, "digest": {"sha256": "ab" * 32}}]},
        {"predicateType": ""},
        {"predicate": ["not", "an", "object"]},
    ]
    for change in changes:
        with pytest.raises(attest.AttestError, match="not an in-toto statement"):
            attest.sign_statement({**good, **change}, private)
    with pytest.raises(attest.AttestError, match="not serialisable"):
        attest.sign_statement({**good, "predicate": {"score": float("nan")}}, private)
    for digest in ("latest", MODEL + "\n", MODEL.upper()):
        with pytest.raises(attest.AttestError, match="not a sha256 digest"):
            attest.make_statement("m", digest, {})


def test_every_pem_form_openssl_writes() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    forms: list[tuple[bytes, bytes | None]] = [
        (
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,  # EC PRIVATE KEY (SEC1)
                serialization.NoEncryption(),
            ),
            None,
        ),
        (
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(b"pem-pass"),
            ),
            b"pem-pass",
        ),
    ]
    for pem, password in forms:
        envelope = attest.sign_statement(_statement(), pem, password)
        assert attest.verify_envelope(envelope, public) == _statement()
    encrypted = forms[1][0]
    with pytest.raises(attest.AttestError, match="private key"):
        attest.sign_statement(_statement(), encrypted)  # no password
    with pytest.raises(attest.AttestError, match="wrong password"):
        attest.sign_statement(_statement(), encrypted, b"wrong")
    with pytest.raises(attest.AttestError, match="not encrypted"):
        attest.sign_statement(_statement(), forms[0][0], b"unneeded")


def test_keys_other_than_p256_are_refused() -> None:
    p384, p384_public = _pair(ec.SECP384R1())
    with pytest.raises(attest.AttestError, match="P-256"):
        attest.sign_statement(_statement(), p384)
    private, _public = _pair()
    with pytest.raises(attest.AttestError, match="P-256"):
        attest.verify_envelope(attest.sign_statement(_statement(), private), p384_public)
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa_pem = rsa_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with pytest.raises(attest.AttestError, match="P-256"):
        attest.sign_statement(_statement(), rsa_pem)
    with pytest.raises(attest.AttestError, match="not PEM"):
        attest.sign_statement(_statement(), b"just some bytes")


def test_cosigns_encrypted_key_opens() -> None:
    assert attest.public_key_pem(COSIGN_KEY, COSIGN_PASSWORD) == COSIGN_PUB
    envelope = attest.sign_statement(_statement(), COSIGN_KEY, COSIGN_PASSWORD)
    assert attest.verify_envelope(envelope, COSIGN_PUB) == _statement()
    assert envelope["signatures"][0]["keyid"] == COSIGN_FINGERPRINT
    with pytest.raises(attest.AttestError, match="wrong password"):
        attest.sign_statement(_statement(), COSIGN_KEY, b"unit-test-onlx")
    with pytest.raises(attest.AttestError, match="wrong password"):
        attest.sign_statement(_statement(), COSIGN_KEY)  # cosign's empty password


def _reseal(change: dict[str, Any]) -> bytes:
    """COSIGN_KEY with its sealed JSON changed."""
    lines = COSIGN_KEY.decode().splitlines()
    sealed = json.loads(base64.b64decode("".join(lines[1:-1])))
    for path, value in change.items():
        node = sealed
        *parents, last = path.split(".")
        for name in parents:
            node = node[name]
        node[last] = value
    body = base64.b64encode(json.dumps(sealed).encode()).decode()
    return f"{lines[0]}\n{body}\n{lines[-1]}\n".encode()


def test_damaged_or_foreign_cosign_keys_are_refused() -> None:
    sealed = json.loads(base64.b64decode("".join(COSIGN_KEY.decode().splitlines()[1:-1])))
    box = bytearray(base64.b64decode(sealed["ciphertext"]))
    box[-1] ^= 0x80
    cases = {
        "ciphertext": (base64.b64encode(bytes(box)).decode(), "wrong password, or damaged"),
        "kdf.params.N": (1 << 20, "scrypt parameters"),
        "kdf.name": ("argon2", "unknown kdf"),
        "cipher.name": ("aes-gcm", "unknown cipher"),
        "cipher.nonce": (base64.b64encode(b"short").decode(), "nonce"),
    }
    for path, (value, message) in cases.items():
        with pytest.raises(attest.AttestError, match=message):
            attest.sign_statement(_statement(), _reseal({path: value}), COSIGN_PASSWORD)


def test_the_att_images_config_is_the_bytes_cosign_pushes() -> None:
    # `cosign attest` v2.6.5 pushed this config (233 bytes) for one layer.
    layer = "sha256:e24b081b48c76f8b5bd2be55e1e637289dc47d85cbf5a1c29261a5ffd38f1b6f"
    config = attest.cosign_config([{"digest": layer}])
    assert config == (
        b'{"architecture":"","created":"0001-01-01T00:00:00Z","history":'
        b'[{"created":"0001-01-01T00:00:00Z"}],"os":"","rootfs":{"type":"layers",'
        b'"diff_ids":["' + layer.encode() + b'"]},"config":{}}'
    )
    assert ocipush.digest_of(config) == (
        "sha256:b38507b139bf06cd4f26017215f6c220af91effb3965df98cd26bc52a83d105a"
    )
    assert attest.attestation_tag(MODEL) == f"sha256-{'ab' * 32}.att"
    manifest, _config = attest.attestation_manifest(
        [{"digest": layer}], ("application/vnd.oci.image.manifest.v1+json", MODEL, 9)
    )
    assert json.loads(manifest)["subject"]["digest"] == MODEL


def test_a_push_is_checked_before_the_registry_is_asked() -> None:
    private, _public = _pair()
    envelope = attest.sign_statement(_statement(), private)
    # Port 1 of loopback: nothing answers, so each error below comes before any request.
    other = "127.0.0.1:1/team/model@sha256:" + "cd" * 32
    with pytest.raises(attest.AttestError, match="subject"):
        attest.push_attestation(other, envelope, plain_http=True)
    with pytest.raises(ocipush.OciError, match="host\\[:port\\]/path@sha256"):
        attest.push_attestation("127.0.0.1:1/team/model:latest", envelope, plain_http=True)
    same = f"registry.example/team/model@{MODEL}"
    with pytest.raises(ocipush.OciError, match="loopback"):
        attest.push_attestation(same, envelope, plain_http=True)
    wrong_type = {**envelope, "payloadType": "text/plain"}
    with pytest.raises(attest.AttestError, match="wrong payload type"):
        attest.push_attestation(same, wrong_type, plain_http=True)


def _command(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "driver.attest", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def test_the_command_prints_one_line(tmp_path: Path) -> None:
    statement = tmp_path / "statement.json"
    statement.write_text(json.dumps(_statement()))
    key = tmp_path / "cosign.key"
    key.write_bytes(COSIGN_KEY)
    password = tmp_path / "password"
    password.write_bytes(COSIGN_PASSWORD + b"\n")  # as a Secret made from `echo` holds it
    done = _command(
        tmp_path, "--statement", str(statement), "--key", str(key), "--password-file", str(password)
    )
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    result = json.loads(line)
    assert result["pushed"] is None
    assert attest.verify_envelope(result["envelope"], COSIGN_PUB) == _statement()


def test_the_command_fails_in_one_line(tmp_path: Path) -> None:
    statement = tmp_path / "statement.json"
    statement.write_text(json.dumps(_statement()))
    key = tmp_path / "key.pem"
    key.write_bytes(_pair()[0])
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({"pad": "x" * attest.MAX_STATEMENT}))
    cases = [
        (["--statement", str(tmp_path / "missing.json"), "--key", str(key)], "missing.json"),
        (["--statement", str(huge), "--key", str(key)], "exceeds"),
        (["--statement", str(statement)], "required"),
        (["--statement", str(statement), "--key", str(key), "--plain-http"], "need --push"),
        (["--statement", str(statement), "--key", str(key), "--push", "latest"], "reference"),
        (["--statement", str(key), "--key", str(key)], "not valid JSON"),
    ]
    for args, message in cases:
        done = _command(tmp_path, *args)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert done.stdout == ""
        (line,) = done.stderr.splitlines()
        assert line.startswith("driver.attest: ") and message in line, line


def test_without_cryptography_statements_still_build_and_signing_says_why(tmp_path: Path) -> None:
    statement = tmp_path / "statement.json"
    statement.write_text(json.dumps(_statement()))
    key = tmp_path / "cosign.key"
    key.write_bytes(COSIGN_KEY)
    # An image without the extra: importing cryptography fails.
    program = (
        "import sys; sys.modules['cryptography'] = None\n"
        "from driver import attest\n"
        "attest.make_statement('m', 'sha256:' + 'ab' * 32, {})\n"
        f"sys.exit(attest.main(['--statement', {str(statement)!r}, '--key', {str(key)!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert "`cryptography`" in line and "lmeval-driver[eval,attest]" in line, line


def test_the_command_signs_only_the_statement_its_pod_was_made_for(tmp_path: Path) -> None:
    """The statement file is a ConfigMap of the namespace, which a co-tenant may
    replace; the digest in the pod's command decides what may be signed."""
    statement = tmp_path / "statement.json"
    statement.write_text(json.dumps(_statement()))
    key = tmp_path / "key.pem"
    private, public = _pair()
    key.write_bytes(private)
    wanted = hashlib.sha256(statement.read_bytes()).hexdigest()
    signed = _command(
        tmp_path, "--statement", str(statement), "--key", str(key), "--statement-sha256", wanted
    )
    assert signed.returncode == 0, signed.stderr
    envelope = json.loads(signed.stdout)["envelope"]
    assert attest.verify_envelope(envelope, public) == _statement()
    # A co-tenant's statement in its place: nothing is signed.
    statement.write_text(json.dumps({**_statement(), "predicate": {"verdict": "Passed"}}))
    refused = _command(
        tmp_path, "--statement", str(statement), "--key", str(key), "--statement-sha256", wanted
    )
    assert refused.returncode == 1 and refused.stdout == ""
    assert "is not the one this pod was made for" in refused.stderr
