"""Signed verdicts: an in-toto statement in a DSSE envelope, stored where cosign looks.

Why this module exists: an ``LMEvalSuite``'s verdict on a model (Passed,
Regressed, Inconclusive) is worth something outside the cluster only when
anyone can check, without trusting the cluster, who said it about which
model. So the verdict is an in-toto statement (v1) whose subject is the model
artifact's digest, signed as a DSSE envelope with the suite's ECDSA P-256
key, and pushed beside the model exactly as ``cosign attest`` would, so that
the ordinary ``cosign verify-attestation --key cosign.pub --type
<predicateType> <model>@sha256:...`` checks it (tests/driver/test_attest.py
runs the real cosign v2.6.5 on what this module pushes).

What is signed (DSSE v1): ``PAE(payloadType, payload)`` =
``"DSSEv1" SP len(type) SP type SP len(payload) SP payload``, with ECDSA
over SHA-256, the signature DER-encoded as cosign writes it. The payload is
the statement serialised canonically (sorted keys, no spaces, UTF-8), so
that one statement always makes one payload. ``keyid`` is the key's SSH
SHA-256 fingerprint, what go-securesystemslib derives from a public key when
it matches a signature to a verifier (cosign ignores it; the empty string
would do as well, but a non-empty hint says which key signed).

Where it goes (cosign v2.6.5: ``cmd/cosign/cli/attest``, ``pkg/oci/static``,
``pkg/oci/mutate``, ``pkg/oci/remote``): in the model's repository, an OCI
image manifest tagged ``sha256-<hex>.att``; one layer per envelope, media
type ``application/vnd.dsse.envelope.v1+json``, annotated with
``dev.cosignproject.cosign/signature: ""`` (cosign's reader requires the key)
and ``predicateType``; the config is the image configuration
go-containerregistry writes for those layers (their digests are their
diff_ids: the layers are stored uncompressed). An existing ``.att`` manifest
keeps its layers and gets ours appended, as cosign appends (``replace``
first drops those of the same predicate type, as ``cosign attest
--replace``). We add what cosign does not: the OCI 1.1 ``subject``, the
model's manifest, so that a registry with the referrers API lists the
attestation under the model too.

Keys: a PEM private key that ``openssl genpkey`` or ``openssl ecparam``
writes (PKCS#8, SEC1, or encrypted PKCS#8 with a password), and cosign's own
``ENCRYPTED SIGSTORE PRIVATE KEY`` (``cosign generate-key-pair``; ``cosign
import-key-pair`` turns any PEM key into one). That format is scrypt
(``hashlib``) and NaCl's secretbox, XSalsa20-Poly1305: Poly1305 comes from
``cryptography``, and XSalsa20 is the few lines of Salsa20 below (a key is
three 64-byte blocks), so the job image needs no PyNaCl and its libsodium.
A mistake in that stream could only make a key fail its Poly1305 tag, never
yield another key; the tests decrypt keys made by the real cosign.

Why ``cryptography`` here, in a driver that is otherwise standard library
only: the standard library has no ECDSA, and a signature scheme of our own
would be worth nothing. It is this module's alone (the driver's ``attest``
extra, which the job image installs); nothing else in the driver imports
this module, so an image without the extra (the driver-image path: any
image with Python and lm-eval) still runs every evaluation, and fails here
only, saying what is missing.

``python -m driver.attest --statement FILE --key FILE [--password-file
FILE] [--push REF [--registry-credentials PATH] [--plain-http]
[--replace]]`` prints one line, ``{"envelope": ..., "pushed": <manifest
digest or null>}``, which the poller reads from the pod's log; any error is
one line on stderr and exit status 1. Every file and every answer of the
registry it reads is bounded.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import os
import re
import struct
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from driver import contract, ocipush
from driver.boundedjson import JsonLimits, UntrustedJsonError, parse_untrusted_json

try:
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.poly1305 import Poly1305
except ImportError:  # the driver in an image without the `attest` extra
    _HAVE_CRYPTOGRAPHY = False
else:
    _HAVE_CRYPTOGRAPHY = True

__all__ = [
    "ATTESTATION_LAYER_TYPE",
    "PAYLOAD_TYPE",
    "PREDICATE_TYPE",
    "STATEMENT_TYPE",
    "AttestError",
    "attestation_manifest",
    "attestation_tag",
    "canonical_json",
    "check_statement",
    "cosign_config",
    "key_id",
    "main",
    "make_statement",
    "pae",
    "public_key_pem",
    "push_attestation",
    "sign_statement",
    "statement_subject_matches",
    "verify_envelope",
]

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
# What cosign itself still writes (``cosign attest``); read, never written here.
_STATEMENT_TYPES = (STATEMENT_TYPE, "https://in-toto.io/Statement/v0.1")
# The poller builds the statement (driver.contract is what both sides share).
PREDICATE_TYPE = contract.ATTESTATION_PREDICATE_TYPE
PAYLOAD_TYPE = "application/vnd.in-toto+json"
ATTESTATION_LAYER_TYPE = "application/vnd.dsse.envelope.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
PREDICATE_ANNOTATION = "predicateType"
ATTESTATION_SUFFIX = ".att"

# Bounds on what is read: a verdict is a few KB; a key, a password, far less.
MAX_STATEMENT = 512 * 1024
MAX_ENVELOPE = 1024 * 1024  # base64 makes 4/3 of the statement, plus signatures
MAX_KEY = 64 * 1024
MAX_PASSWORD = 4 * 1024
MAX_SIGNATURES = 16
# cosign refuses to read an .att manifest of more layers (pkg/oci/remote).
MAX_LAYERS = 1000
_STATEMENT_LIMITS = JsonLimits(max_bytes=MAX_STATEMENT, max_depth=32, max_elements=50_000)
_MANIFEST_LIMITS = JsonLimits(
    max_bytes=ocipush.MAX_MANIFEST, max_depth=8, max_elements=20 * MAX_LAYERS + 200
)
_KEY_LIMITS = JsonLimits(max_bytes=MAX_KEY, max_depth=4, max_elements=50)

_HEX = re.compile(r"[a-f0-9]{64}")  # with fullmatch: "$" would let a "\n" through
_PEM = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n(.*?)\r?\n-----END \1-----", re.DOTALL)
_COSIGN_KEY_TYPES = (b"ENCRYPTED SIGSTORE PRIVATE KEY", b"ENCRYPTED COSIGN PRIVATE KEY")
# The scrypt settings go-securesystemslib's `encrypted` package writes and
# accepts (legacy, standard, OWASP): anything else is refused, which also
# bounds the memory a key file can make us spend (128 MiB at most).
_SCRYPT_PARAMS = ((32768, 8, 1), (65536, 8, 1), (131072, 8, 1))


class AttestError(Exception):
    """Signing, verifying or pushing failed; the message says what and why."""


def _require_cryptography() -> None:
    if not _HAVE_CRYPTOGRAPHY:
        raise AttestError(
            "signing and verifying need the Python package `cryptography` (the driver's "
            "`attest` extra, which the job image installs: lmeval-driver[eval,attest])"
        )


# -- the statement -----------------------------------------------------------------


def canonical_json(value: object) -> bytes:
    """`value` as JSON with sorted keys and no spaces, UTF-8 (no NaN, no Infinity)."""
    try:
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        return text.encode("utf-8")
    except (TypeError, ValueError, UnicodeError) as exc:
        raise AttestError(f"not serialisable as JSON: {exc}") from None


def _bare_digest(digest: str) -> str:
    hexdigest = digest.removeprefix("sha256:")
    if not _HEX.fullmatch(hexdigest):
        raise AttestError(f"not a sha256 digest: {digest!r}")
    return hexdigest


def make_statement(
    subject_name: str,
    subject_digest: str,
    predicate: Mapping[str, object],
    predicate_type: str = PREDICATE_TYPE,
) -> dict[str, Any]:
    """An in-toto statement v1 about one artifact (`subject_digest`: ``sha256:<hex>``
    or the bare hex)."""
    statement: dict[str, Any] = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": subject_name, "digest": {"sha256": _bare_digest(subject_digest)}}],
        "predicateType": predicate_type,
        "predicate": dict(predicate),
    }
    return check_statement(statement)


def check_statement(statement: object) -> dict[str, Any]:
    """`statement` if it is an in-toto statement (v1, or cosign's v0.1): a
    ``_type``, a non-empty ``subject`` list of ``{name?, digest: {alg: hex}}``,
    a ``predicateType`` and an object ``predicate``. Raises `AttestError`."""
    where = "not an in-toto statement"
    if not isinstance(statement, dict):
        raise AttestError(f"{where}: not a JSON object")
    if statement.get("_type") not in _STATEMENT_TYPES:
        raise AttestError(f"{where}: _type is {statement.get('_type')!r}, not {STATEMENT_TYPE}")
    subjects = statement.get("subject")
    if not isinstance(subjects, list) or not subjects:
        raise AttestError(f"{where}: no subject")
    for subject in subjects:
        if not isinstance(subject, dict):
            raise AttestError(f"{where}: a subject is not an object")
        if "name" in subject and not isinstance(subject["name"], str):
            raise AttestError(f"{where}: a subject's name is not a string")
        digest = subject.get("digest")
        if (
            not isinstance(digest, dict)
            or not digest
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in digest.items())
        ):
            raise AttestError(f"{where}: a subject has no digest {{algorithm: hex}}")
        if "sha256" in digest and not _HEX.fullmatch(digest["sha256"]):
            raise AttestError(f"{where}: a subject's sha256 is not 64 lower-case hex digits")
    predicate_type = statement.get("predicateType")
    if not isinstance(predicate_type, str) or not predicate_type:
        raise AttestError(f"{where}: no predicateType")
    if not isinstance(statement.get("predicate"), dict):
        raise AttestError(f"{where}: the predicate is not an object")
    return statement


def statement_subject_matches(
    statement: Mapping[str, object], digest: str, name: str | None = None
) -> bool:
    """Whether one of the statement's subjects has sha256 `digest` (``sha256:<hex>``
    or the bare hex), and the name `name` when given."""
    hexdigest = _bare_digest(digest)
    subjects = statement.get("subject")
    if not isinstance(subjects, list):
        return False
    for subject in subjects:
        if not isinstance(subject, dict):
            continue
        found = subject.get("digest")
        if not isinstance(found, dict) or found.get("sha256") != hexdigest:
            continue
        if name is None or subject.get("name") == name:
            return True
    return False


# -- DSSE --------------------------------------------------------------------------


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is signed, not the payload alone."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64decode(text: object, what: str) -> bytes:
    # DSSE lets a signer use standard or URL-safe base64, padded or not.
    if not isinstance(text, str) or not re.fullmatch(r"[A-Za-z0-9+/_-]*={0,2}", text):
        raise AttestError(f"{what} is not base64")
    standard = text.replace("-", "+").replace("_", "/").rstrip("=")
    try:
        return base64.b64decode(standard + "=" * (-len(standard) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise AttestError(f"{what} is not base64") from None


def _envelope_parts(envelope: object) -> tuple[str, bytes, list[tuple[str, bytes]]]:
    """(payloadType, payload, [(keyid, signature)]) of a DSSE envelope's JSON."""
    if not isinstance(envelope, Mapping):
        raise AttestError("not a DSSE envelope: not a JSON object")
    payload_type = envelope.get("payloadType")
    if not isinstance(payload_type, str):
        raise AttestError("not a DSSE envelope: no payloadType")
    encoded = envelope.get("payload")
    if isinstance(encoded, str) and len(encoded) > MAX_ENVELOPE:
        raise AttestError(f"the envelope's payload exceeds {MAX_ENVELOPE} bytes")
    payload = _b64decode(encoded, "the envelope's payload")
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or not signatures:
        raise AttestError("not a DSSE envelope: no signatures")
    if len(signatures) > MAX_SIGNATURES:
        raise AttestError(f"the envelope has more than {MAX_SIGNATURES} signatures")
    parts = []
    for entry in signatures:
        if not isinstance(entry, dict):
            raise AttestError("not a DSSE envelope: a signature is not an object")
        keyid = entry.get("keyid", "")
        if not isinstance(keyid, str):
            raise AttestError("not a DSSE envelope: a keyid is not a string")
        parts.append((keyid, _b64decode(entry.get("sig"), "a signature")))
    return payload_type, payload, parts


def _statement_of(payload: bytes) -> dict[str, Any]:
    try:
        return check_statement(parse_untrusted_json(payload, _STATEMENT_LIMITS))
    except UntrustedJsonError as exc:
        raise AttestError(f"not an in-toto statement: {exc}") from None


def sign_statement(
    statement: Mapping[str, object], private_key_pem: bytes, password: bytes | None = None
) -> dict[str, Any]:
    """The DSSE envelope of `statement` (checked first), signed with the ECDSA
    P-256 key `private_key_pem` (see the module's docstring for the formats)."""
    _require_cryptography()
    payload = canonical_json(check_statement(dict(statement)))
    if len(payload) > MAX_STATEMENT:
        raise AttestError(f"the statement exceeds {MAX_STATEMENT} bytes")
    key = _private_key(private_key_pem, password)
    signature = key.sign(pae(PAYLOAD_TYPE, payload), ec.ECDSA(hashes.SHA256()))
    return {
        "payloadType": PAYLOAD_TYPE,
        "payload": _b64(payload),
        "signatures": [{"keyid": key_id(key.public_key()), "sig": _b64(signature)}],
    }


def verify_envelope(envelope: Mapping[str, object], public_key_pem: bytes) -> dict[str, Any]:
    """The statement in `envelope` when one of its signatures verifies with
    `public_key_pem` (a PEM ``PUBLIC KEY``, cosign.pub); raises `AttestError`
    for a bad signature, another payload type, or a payload that is no
    in-toto statement."""
    _require_cryptography()
    payload_type, payload, signatures = _envelope_parts(envelope)
    if payload_type != PAYLOAD_TYPE:
        raise AttestError(f"wrong payload type {payload_type!r}: expected {PAYLOAD_TYPE}")
    public = _public_key(public_key_pem)
    message = pae(payload_type, payload)
    for _keyid, signature in signatures:  # keyid is an unauthenticated hint: try each
        try:
            public.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, ValueError):
            continue
        return _statement_of(payload)
    raise AttestError("bad signature: no signature of the envelope verifies with this key")


# -- keys --------------------------------------------------------------------------


def _p256(key: object, what: str) -> None:
    curve = getattr(key, "curve", None)
    if not isinstance(curve, ec.SECP256R1):
        raise AttestError(f"{what} is not an ECDSA P-256 key (the only kind supported)")


def _private_key(pem: bytes, password: bytes | None) -> ec.EllipticCurvePrivateKey:
    if len(pem) > MAX_KEY:
        raise AttestError(f"the private key exceeds {MAX_KEY} bytes")
    block = _PEM.search(pem)
    if block is None:
        raise AttestError("the private key is not PEM (-----BEGIN ... PRIVATE KEY-----)")
    kind = block.group(1)
    try:
        if kind in _COSIGN_KEY_TYPES:
            body = _b64decode(b"".join(block.group(2).split()).decode("ascii"), "the cosign key")
            der = _open_cosign_key(body, password or b"")
            key = serialization.load_der_private_key(der, password=None)
        else:
            key = serialization.load_pem_private_key(block.group(0), password=password)
    except TypeError as exc:  # a password for a plain key, or none for an encrypted one
        raise AttestError(f"the private key ({kind.decode()}): {exc}") from None
    except (ValueError, UnsupportedAlgorithm):
        raise AttestError(
            f"the private key ({kind.decode()}) cannot be read: damaged, or a wrong password"
        ) from None
    _p256(key, "the private key")
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


def _public_key(pem: bytes) -> ec.EllipticCurvePublicKey:
    if len(pem) > MAX_KEY:
        raise AttestError(f"the public key exceeds {MAX_KEY} bytes")
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, UnsupportedAlgorithm):
        raise AttestError("the public key is not a PEM PUBLIC KEY") from None
    _p256(key, "the public key")
    assert isinstance(key, ec.EllipticCurvePublicKey)
    return key


def public_key_pem(private_key_pem: bytes, password: bytes | None = None) -> bytes:
    """The PEM ``PUBLIC KEY`` of a private key (what cosign.pub holds)."""
    _require_cryptography()
    public = _private_key(private_key_pem, password).public_key()
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def key_id(public_key: ec.EllipticCurvePublicKey) -> str:
    """``SHA256:<base64>``, the key's SSH fingerprint (go-securesystemslib's
    SHA256KeyID, ``ssh-keygen -l``)."""
    line = public_key.public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _open_cosign_key(body: bytes, password: bytes) -> bytes:
    """The PKCS#8 DER inside cosign's encrypted key (go-securesystemslib's
    ``encrypted.Decrypt``: scrypt, then NaCl secretbox)."""
    try:
        sealed = parse_untrusted_json(body, _KEY_LIMITS)
    except UntrustedJsonError as exc:
        raise AttestError(f"the cosign key is damaged: {exc}") from None
    kdf = sealed.get("kdf") if isinstance(sealed, dict) else None
    cipher = sealed.get("cipher") if isinstance(sealed, dict) else None
    if not isinstance(kdf, dict) or not isinstance(cipher, dict):
        raise AttestError("the cosign key is damaged: no kdf or cipher")
    params = kdf.get("params")
    if kdf.get("name") != "scrypt" or not isinstance(params, dict):
        raise AttestError(f"the cosign key uses an unknown kdf {kdf.get('name')!r}")
    n, r, p = params.get("N"), params.get("r"), params.get("p")
    if (n, r, p) not in _SCRYPT_PARAMS or not all(isinstance(v, int) for v in (n, r, p)):
        raise AttestError(f"the cosign key's scrypt parameters are not cosign's: {params}")
    assert isinstance(n, int) and isinstance(r, int) and isinstance(p, int)
    if cipher.get("name") != "nacl/secretbox":
        raise AttestError(f"the cosign key uses an unknown cipher {cipher.get('name')!r}")
    salt = _b64decode(kdf.get("salt"), "the cosign key's salt")
    nonce = _b64decode(cipher.get("nonce"), "the cosign key's nonce")
    box = _b64decode(sealed.get("ciphertext"), "the cosign key's ciphertext")
    if len(nonce) != 24:
        raise AttestError("the cosign key is damaged: its nonce is not 24 bytes")
    # OpenSSL counts 128*r*(N+2) bytes for V and 128*r*p for B against maxmem.
    maxmem = 128 * r * (n + 2) + 128 * r * p + 1024 * 1024
    secret = hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, maxmem=maxmem, dklen=32)
    return _secretbox_open(box, nonce, secret)


# NaCl's secretbox (XSalsa20-Poly1305), opening only. Salsa20 as in Bernstein's
# specification; HSalsa20 and XSalsa20 as in "Extending the Salsa20 nonce".
_MASK = 0xFFFFFFFF
_SIGMA = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)  # "expand 32-byte k"
_COLUMNS = ((0, 4, 8, 12), (5, 9, 13, 1), (10, 14, 2, 6), (15, 3, 7, 11))
_ROWS = ((0, 1, 2, 3), (5, 6, 7, 4), (10, 11, 8, 9), (15, 12, 13, 14))


def _rounds(state: Sequence[int]) -> list[int]:
    x = list(state)
    for _double_round in range(10):
        for a, b, c, d in (*_COLUMNS, *_ROWS):
            t = (x[a] + x[d]) & _MASK
            x[b] ^= ((t << 7) | (t >> 25)) & _MASK
            t = (x[b] + x[a]) & _MASK
            x[c] ^= ((t << 9) | (t >> 23)) & _MASK
            t = (x[c] + x[b]) & _MASK
            x[d] ^= ((t << 13) | (t >> 19)) & _MASK
            t = (x[d] + x[c]) & _MASK
            x[a] ^= ((t << 18) | (t >> 14)) & _MASK
    return x


def _initial(key: bytes, data: bytes) -> list[int]:
    k = struct.unpack("<8I", key)
    n = struct.unpack("<4I", data)
    return [_SIGMA[0], *k[:4], _SIGMA[1], *n, _SIGMA[2], *k[4:], _SIGMA[3]]


def _xsalsa20_stream(key: bytes, nonce: bytes, length: int) -> bytes:
    z = _rounds(_initial(key, nonce[:16]))  # HSalsa20: no feed-forward
    subkey = struct.pack("<8I", z[0], z[5], z[10], z[15], z[6], z[7], z[8], z[9])
    blocks = []
    for counter in range((length + 63) // 64):
        state = _initial(subkey, nonce[16:] + struct.pack("<Q", counter))
        mixed = _rounds(state)
        blocks.append(
            struct.pack("<16I", *((m + s) & _MASK for m, s in zip(mixed, state, strict=True)))
        )
    return b"".join(blocks)[:length]


def _secretbox_open(box: bytes, nonce: bytes, key: bytes) -> bytes:
    if len(box) < 16:
        raise AttestError("the cosign key is damaged: its ciphertext is too short")
    tag, ciphertext = box[:16], box[16:]
    stream = _xsalsa20_stream(key, nonce, 32 + len(ciphertext))
    try:
        Poly1305.verify_tag(stream[:32], ciphertext, tag)
    except InvalidSignature:
        raise AttestError("cannot decrypt the cosign key: wrong password, or damaged") from None
    return bytes(c ^ s for c, s in zip(ciphertext, stream[32:], strict=True))


# -- the registry ------------------------------------------------------------------


def attestation_tag(digest: str) -> str:
    """Where cosign keeps an artifact's attestations: ``sha256-<hex>.att``."""
    return f"sha256-{_bare_digest(digest)}{ATTESTATION_SUFFIX}"


def _layer_descriptor(envelope_json: bytes, predicate_type: str) -> dict[str, Any]:
    return {
        "mediaType": ATTESTATION_LAYER_TYPE,
        "size": len(envelope_json),
        "digest": ocipush.digest_of(envelope_json),
        "annotations": {SIGNATURE_ANNOTATION: "", PREDICATE_ANNOTATION: predicate_type},
    }


def cosign_config(layers: Sequence[Mapping[str, object]]) -> bytes:
    """The image configuration go-containerregistry writes for cosign's ``.att``
    image (its empty image with `layers` appended), byte for byte: fields in
    its struct's order, one empty history entry per layer."""
    config = {
        "architecture": "",
        "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"} for _ in layers],
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
        "config": {},
    }
    return json.dumps(config, separators=(",", ":")).encode()


def attestation_manifest(
    layers: Sequence[Mapping[str, object]],
    subject: tuple[str, str, int] | None,
    annotations: Mapping[str, str] | None = None,
) -> tuple[bytes, bytes]:
    """(manifest, config) of an ``.att`` image holding `layers`, with the OCI 1.1
    `subject` (mediaType, digest, size) when given."""
    config = cosign_config(layers)
    manifest: dict[str, object] = {
        "schemaVersion": 2,
        "mediaType": ocipush.MANIFEST_TYPE,
        "config": {
            "mediaType": CONFIG_TYPE,
            "size": len(config),
            "digest": ocipush.digest_of(config),
        },
        "layers": [dict(layer) for layer in layers],
    }
    if subject is not None:
        media_type, digest, size = subject
        manifest["subject"] = {"mediaType": media_type, "digest": digest, "size": size}
    if annotations:
        manifest["annotations"] = dict(annotations)
    return canonical_json(manifest), config


def _descriptor(value: object) -> dict[str, Any]:
    """A layer descriptor of an existing ``.att`` manifest, checked before we keep it."""
    if not isinstance(value, dict):
        raise AttestError("the existing attestation manifest has a layer that is not an object")
    media_type, digest, size = value.get("mediaType"), value.get("digest"), value.get("size")
    annotations = value.get("annotations", {})
    if (
        not isinstance(media_type, str)
        or not isinstance(digest, str)
        or not ocipush.DIGEST.fullmatch(digest)
        or not isinstance(size, int)
        or size < 0
        or not isinstance(annotations, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in annotations.items())
    ):
        raise AttestError(f"the existing attestation manifest has a malformed layer: {value}")
    return value


def _existing(found: tuple[str, bytes] | None) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The layers and annotations of the ``.att`` manifest already there (none: empty)."""
    if found is None:
        return [], {}
    media_type, body = found
    try:
        manifest = parse_untrusted_json(body, _MANIFEST_LIMITS)
    except UntrustedJsonError as exc:
        raise AttestError(f"the existing attestation manifest: {exc}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("layers"), list):
        raise AttestError(f"the existing attestation manifest ({media_type}) has no layers")
    annotations = manifest.get("annotations", {})
    if not isinstance(annotations, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()
    ):
        annotations = {}
    return [_descriptor(layer) for layer in manifest["layers"]], annotations


def push_attestation(
    subject_reference: str,
    envelope: Mapping[str, object],
    *,
    docker_config: str | None = None,
    plain_http: bool = False,
    replace: bool = False,
) -> str:
    """Add `envelope` to the attestations of `subject_reference`
    (``registry/repository@sha256:<hex>``) as cosign does; returns the digest of
    the ``.att`` manifest pushed.

    The envelope's statement must name the subject's digest (cosign checks that
    claim too); its signature is not checked here (no public key is needed to
    push). `docker_config` is a ``.dockerconfigjson`` path as for
    `driver.ocipush`; `plain_http` only to a loopback registry; with `replace`
    the attestations of the same predicate type already there are dropped.
    """
    registry, repository, digest = ocipush.parse_digest_reference(subject_reference)
    payload_type, payload, _signatures = _envelope_parts(envelope)
    if payload_type != PAYLOAD_TYPE:
        raise AttestError(f"wrong payload type {payload_type!r}: expected {PAYLOAD_TYPE}")
    statement = _statement_of(payload)
    if not statement_subject_matches(statement, digest):
        raise AttestError(f"the statement's subject is not {digest}: cosign would refuse it")
    body = canonical_json(dict(envelope))
    if len(body) > MAX_ENVELOPE:
        raise AttestError(f"the envelope exceeds {MAX_ENVELOPE} bytes")
    predicate_type = str(statement["predicateType"])
    ref = ocipush.Reference(registry, repository, attestation_tag(digest))
    client = ocipush.open_client(ref, docker_config=docker_config, plain_http=plain_http)
    subject = ocipush.describe_manifest(client, digest)
    layers, annotations = _existing(ocipush.get_manifest(client, ref.tag))
    if replace:
        layers = [
            layer
            for layer in layers
            if layer.get("annotations", {}).get(PREDICATE_ANNOTATION) != predicate_type
        ]
    ours = _layer_descriptor(body, predicate_type)
    if all(layer["digest"] != ours["digest"] for layer in layers):  # the same envelope: once
        layers.append(ours)
    if len(layers) > MAX_LAYERS:
        raise AttestError(
            f"{ref.tag} would hold {len(layers)} attestations; cosign reads at most "
            f"{MAX_LAYERS} (push with replace to drop those of the same predicate type)"
        )
    manifest, config = attestation_manifest(layers, subject, annotations)
    ocipush.push_blob(client, body)
    ocipush.push_blob(client, config)
    return ocipush.put_manifest(client, ref.tag, manifest, ocipush.MANIFEST_TYPE)


# -- the command -------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line and status 1, as any error
        raise AttestError(message)


def _read(path: str, limit: int, what: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise AttestError(f"{what} {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise AttestError(f"{what} {path} exceeds {limit} bytes")
    return data


def _credentials_file(path: str) -> str:
    """A ``.dockerconfigjson`` path: the file itself, or in a mounted directory
    ``config.json`` (Docker's name, the poller's mount) or ``.dockerconfigjson``."""
    if not os.path.isdir(path):
        return path
    for name in ("config.json", ".dockerconfigjson"):
        candidate = os.path.join(path, name)
        if os.path.isfile(candidate):
            return candidate
    raise AttestError(f"registry credentials {path}: no config.json or .dockerconfigjson in it")


def _parser() -> _Parser:
    parser = _Parser(
        prog="python -m driver.attest",
        description="Sign an in-toto statement as a DSSE envelope and optionally push it "
        "beside its subject as cosign does; prints one JSON line.",
    )
    parser.add_argument("--statement", required=True, help="the statement's JSON file")
    parser.add_argument(
        "--statement-sha256", metavar="HEX", help="sign only a statement file of this digest"
    )
    parser.add_argument("--key", required=True, help="the PEM private key (ECDSA P-256)")
    parser.add_argument("--password-file", help="the key's password (one trailing newline dropped)")
    parser.add_argument("--push", metavar="REF", help="registry/repository@sha256:<hex>")
    parser.add_argument(
        "--registry-credentials",
        metavar="PATH",
        help="a .dockerconfigjson, or a directory holding config.json",
    )
    parser.add_argument("--plain-http", action="store_true", help="HTTP, loopback only")
    parser.add_argument(
        "--replace", action="store_true", help="drop attestations of the same predicate type"
    )
    return parser


def _run(argv: Sequence[str] | None) -> dict[str, object]:
    args = _parser().parse_args(argv)
    text = _read(args.statement, MAX_STATEMENT, "the statement")
    if args.statement_sha256 is not None and (
        hashlib.sha256(text).hexdigest() != args.statement_sha256
    ):
        # The file is a ConfigMap of the namespace, which a co-tenant may replace;
        # the digest comes with the pod's command, which nobody changes after
        # admission: sign only the statement the poller wrote.
        raise AttestError(f"the statement {args.statement} is not the one this pod was made for")
    try:
        statement = parse_untrusted_json(text, _STATEMENT_LIMITS)
    except UntrustedJsonError as exc:
        raise AttestError(f"the statement {args.statement}: {exc}") from None
    key = _read(args.key, MAX_KEY, "the key")
    password = None
    if args.password_file is not None:
        password = _read(args.password_file, MAX_PASSWORD, "the password file")
        password = password.removesuffix(b"\n").removesuffix(b"\r")
    envelope = sign_statement(check_statement(statement), key, password)
    pushed = None
    if args.push is not None:
        credentials = args.registry_credentials
        pushed = push_attestation(
            args.push,
            envelope,
            docker_config=_credentials_file(credentials) if credentials else None,
            plain_http=args.plain_http,
            replace=args.replace,
        )
    elif args.registry_credentials or args.plain_http or args.replace:
        raise AttestError("--registry-credentials, --plain-http and --replace need --push")
    return {"envelope": envelope, "pushed": pushed}


def main(argv: Sequence[str] | None = None) -> int:
    """The command: one JSON line on stdout, or one error line on stderr and status 1."""
    try:
        result = _run(argv)
    except (AttestError, ocipush.OciError) as exc:
        print(f"driver.attest: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # one line even for a bug: the poller reads the log
        print(f"driver.attest: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, sort_keys=True, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
