"""Which pods the poller made: a keyed proof that no other user can forge.

Every user who may run LMEvalJobs may also create pods in their namespace
(the admission policy requires it), and pod names, labels, ownerReferences
and job UIDs are all visible to anyone who can read the namespace. So none
of them proves that a pod is the one the poller created for a job: a user
could create a pod that claims another user's job, beside the real one or
before the poller does, and make that job report invented scores.

The proof is an HMAC-SHA256, under a key that only the poller holds, of the
pod's namespace, its name, the job's UID and the *attempt*: the sequence
number of the pods the poller created for that job (1 for the first, 2 after
a resume, ...). It is written into the pod's annotation
`PROOF_ANNOTATION` when the poller creates the pod. Copying it onto another
pod does not help: the name, namespace and job are bound, and once the
poller has recorded the pod's UID in the job's status (`status.podUID`,
`status.podAttempt`) a different pod under the same name is refused even
with a copied proof. The attempt number makes a proof copied from an
earlier pod of the same job (before a suspend) worthless for the next one.

The key is 32 random bytes in the Secret `KEY_SECRET` of the poller's own
namespace, made by the first poller that finds none (two replicas racing:
AlreadyExists means read the winner's). Only the poller's ServiceAccount
and cluster administrators can read it. Losing or replacing the key makes
every running job's pod untrusted: those jobs then end Failed, naming the pod.

Upgrades: pods made by a poller from before proofs existed carry none. Such
a pod is still taken for its job's (as attempt 0) when it was created
*before the key was*: nobody can create a pod in the past, so this admits
exactly the pods an older poller could have made, and no pod made since.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from typing import Any

from poller.decisions.views import PROOF_ANNOTATION
from poller.kube.client import Conflict, Kube, NotFound
from poller.timefmt import now, parse_time

__all__ = [
    "KEY_BYTES",
    "KEY_SECRET",
    "PROOF_ANNOTATION",
    "PodProof",
    "load_pod_proof",
]

log = logging.getLogger(__name__)

KEY_SECRET = "lmeval-poller-identity"  # noqa: S105 (a name, not a password)
KEY_FIELD = "key"
KEY_BYTES = 32
_VERSION = "v1"
# A proof is "v1.<attempt>.<64 hex>"; anything longer is not one of ours.
_MAX_PROOF_CHARS = 100


@dataclass(frozen=True)
class PodProof:
    """Signs and verifies pod proofs under one key. Pure: no I/O."""

    key: bytes
    # When the key was made: pods without a proof created before it are an
    # older poller's (see the module docstring). None: no such pods.
    since: dt.datetime | None = None

    def _digest(self, namespace: str, name: str, job_uid: str, attempt: int) -> str:
        message = "\n".join((_VERSION, namespace, name, job_uid, str(attempt))).encode()
        return hmac.new(self.key, message, hashlib.sha256).hexdigest()

    def sign(self, namespace: str, name: str, job_uid: str, attempt: int) -> str:
        """The annotation value proving pod `namespace/name` is attempt `attempt` of the job."""
        return f"{_VERSION}.{attempt}.{self._digest(namespace, name, job_uid, attempt)}"

    def verify(self, value: str | None, namespace: str, name: str, job_uid: str) -> int | None:
        """The attempt that `value` proves for this pod and job, or None if it proves nothing."""
        if not value or len(value) > _MAX_PROOF_CHARS:
            return None
        parts = value.split(".")
        if len(parts) != 3 or parts[0] != _VERSION or not parts[1].isdigit():
            return None
        attempt = int(parts[1])
        if attempt < 1 or not job_uid:
            return None
        expected = self._digest(namespace, name, job_uid, attempt)
        return attempt if hmac.compare_digest(expected, parts[2]) else None

    def attempt_of(
        self, value: str | None, namespace: str, name: str, job_uid: str, created: str
    ) -> int | None:
        """`verify`, and 0 for a pod without any proof made before the key existed."""
        if value is None:
            made = parse_time(created)
            older = self.since is not None and made is not None and made < self.since
            return 0 if older and job_uid else None
        return self.verify(value, namespace, name, job_uid)

    def stamp(self, manifest: dict[str, Any], job_uid: str, attempt: int) -> dict[str, Any]:
        """`manifest` with its proof annotation set (whatever the job asked for)."""
        meta = manifest["metadata"]
        annotations = {
            **(meta.get("annotations") or {}),
            PROOF_ANNOTATION: self.sign(meta["namespace"], meta["name"], job_uid, attempt),
        }
        return {**manifest, "metadata": {**meta, "annotations": annotations}}


def _decode_key(data: dict[str, str]) -> bytes | None:
    text = data.get(KEY_FIELD)
    if not text:
        return None
    try:
        key = base64.b64decode(text, validate=True)
    except ValueError:
        return None
    return key if len(key) >= KEY_BYTES else None


def load_pod_proof(kube: Kube, namespace: str) -> PodProof:
    """The poller's key from Secret `KEY_SECRET` in `namespace`, made on first use.

    Raises ValueError when the Secret exists but holds no usable key (an
    administrator must repair or delete it: making a new key silently would
    turn every running job's pod untrusted).
    """
    for _ in range(2):
        try:
            secret: dict[str, Any] | None = kube.read_secret(namespace, KEY_SECRET)
        except NotFound:
            secret = None
        if secret is not None:
            key = _decode_key(secret.get("data") or {})
            if key is None:
                raise ValueError(
                    f"Secret {namespace}/{KEY_SECRET} holds no usable '{KEY_FIELD}' "
                    f"(base64 of at least {KEY_BYTES} bytes): repair it, or delete it to make "
                    "a new key (the pods of running jobs then stop being trusted)"
                )
            made = parse_time((secret.get("metadata") or {}).get("creationTimestamp"))
            return PodProof(key, made)
        key = secrets.token_bytes(KEY_BYTES)
        try:
            kube.create_secret(
                namespace,
                KEY_SECRET,
                {KEY_FIELD: base64.b64encode(key).decode()},
                labels={"app.kubernetes.io/name": "lmeval-poller"},
            )
        except Conflict:
            continue  # another replica made it first: read theirs
        log.info("created the pod-identity key in Secret %s/%s", namespace, KEY_SECRET)
        # The apiserver's creationTimestamp has whole seconds: round down like it.
        return PodProof(key, now().replace(microsecond=0))
    raise RuntimeError(f"Secret {namespace}/{KEY_SECRET} could neither be read nor created")
