"""Results pushed to an OCI registry: the job pod's share of ``spec.outputs.oci``.

A pure module (no I/O), called by ``podspec.build_pod``. The push itself is
the driver's (``driver.ocipush``, in the pod, after lm_eval wrote its
results): this module gives it the reference (``repository:tag``, the tag
defaulting to the job's name and 8 hex digits of its UID, unique per job and
stable across its pods), the subject, plain HTTP for a loopback registry, and
the credentials Secret's ``.dockerconfigjson``, mounted read-only under
``/opt`` (where no fileSecret may be mounted), and the registry's own CAs
(``caBundle``, mounted beside it; the driver adds them to the image's and
the cluster's, `poller.jobpod.trust`), or ``--oci-tls=insecure`` for
``verifySSL: false``, which the poller allowed before the pod was made
(`trust.insecure_storage_problem`).
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

from poller import api
from poller.jobpod import trust

__all__ = [
    "CREDENTIALS_DIR",
    "CREDENTIALS_FILE",
    "CREDENTIALS_KEY",
    "driver_options",
    "oci_volumes",
]

CREDENTIALS_DIR = "/opt/lmeval/oci-credentials"
CREDENTIALS_KEY = ".dockerconfigjson"
CREDENTIALS_FILE = f"{CREDENTIALS_DIR}/config.json"
VOLUME = "oci-credentials"
CA_DIR = "/opt/lmeval/oci-ca"
CA_VOLUME = "oci-ca"
# A tag is at most 128 characters: the name's head, '-', 8 hex digits.
TAG_NAME_CHARS = 128 - 9


def _oci(spec: api.LMEvalJobSpec) -> api.OciOutput | None:
    return spec.outputs.oci if spec.outputs is not None else None


def default_tag(name: str, uid: str) -> str:
    """The tag of a job's artifact when spec.outputs.oci.tag is not given."""
    # A job name is a DNS subdomain: lower-case letters, digits, '-' and '.',
    # starting and ending with a letter or digit, so a valid tag head.
    digest = hashlib.sha256(uid.encode()).hexdigest()[:8]
    return f"{name[:TAG_NAME_CHARS].rstrip('.-')}-{digest}"


class PushOptions(NamedTuple):
    """The driver's --oci-* options (``protocol.run_argv``'s oci_* arguments)."""

    push: str | None = None
    subject: str | None = None
    auth: str | None = None
    scheme: str | None = None
    ca_bundle: str | None = None
    tls: str | None = None


def driver_options(spec: api.LMEvalJobSpec, name: str, uid: str) -> PushOptions:
    """What the driver needs for the push (all None without spec.outputs.oci)."""
    oci = _oci(spec)
    if oci is None:
        return PushOptions()
    return PushOptions(
        push=f"{oci.repository}:{oci.tag or default_tag(name, uid)}",
        subject=oci.subject,
        auth=CREDENTIALS_FILE if oci.credentials_secret is not None else None,
        scheme="http" if oci.plain_http else None,
        ca_bundle=f"{CA_DIR}/{trust.CA_FILE}" if oci.ca_bundle is not None else None,
        tls="insecure" if oci.verify_ssl is False else None,
    )


def oci_volumes(spec: api.LMEvalJobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The credentials Secret's and the registry's CAs' volumes and their read-only
    mounts (none without them)."""
    oci = _oci(spec)
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if oci is not None and oci.credentials_secret is not None:
        volumes.append(
            {
                "name": VOLUME,
                "secret": {
                    "secretName": oci.credentials_secret,
                    "items": [{"key": CREDENTIALS_KEY, "path": "config.json"}],
                    "defaultMode": 0o444,
                },
            }
        )
        mounts.append({"name": VOLUME, "mountPath": CREDENTIALS_DIR, "readOnly": True})
    if oci is not None and oci.ca_bundle is not None:
        volumes.append(trust.ca_volume(CA_VOLUME, oci.ca_bundle))
        mounts.append({"name": CA_VOLUME, "mountPath": CA_DIR, "readOnly": True})
    return volumes, mounts
