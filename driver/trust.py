"""Whom the job pod's TLS clients trust: the image's authorities, the cluster's, the endpoint's.

Why this module exists: every client of the job pod that talks TLS (lm_eval
to the model endpoint, the S3 fetch, the OCI push, the Git clone, the MLflow
export) must trust three things at once, and *add* them rather than replace
the image's store, or every public endpoint would become untrusted:

1. the image's own authorities (the system bundle, and certifi's for
   ``requests``; a ``$SSL_CERT_FILE`` or ``$REQUESTS_CA_BUNDLE`` the image
   sets is kept too);
2. the cluster's bundles that the poller setting ``trusted-ca-bundles``
   picks up (OpenShift's ``odh-trusted-ca-bundle`` and
   ``openshift-service-ca.crt``, say): the pod mounts each ConfigMap key as
   an optional file and lists their paths in ``$LMEVAL_CLUSTER_CA_BUNDLES``.
   They are the admin's choice, each optional: an absent, empty or PEM-less
   file is skipped with a note, never fatal;
3. the endpoint's own ``caBundle`` (``spec.modelTLS.caBundle``,
   ``spec.offline.storage.s3.caBundle``, ``spec.outputs.oci.caBundle``,
   ``spec.customTasks[i].git.caBundle``, the MLflow output's): the job's
   choice, so one that holds no certificate is an error naming its field.
   It counts for that endpoint only.

Two shapes of the same union. The driver's own urllib clients (the S3
fetch, the OCI push) take an `ssl_context`: the default context plus the
extra files. The others take one file: lm_eval's ``aiohttp`` reads
OpenSSL's default file, overridden by ``$SSL_CERT_FILE``, ``requests``
(lm_eval's, MLflow's) certifi's bundle, overridden by
``$REQUESTS_CA_BUNDLE``, and git its ``http.sslCAInfo``. Each of these
*replaces* its client's store, so `write_combined` (`combined_bundle`)
writes one file with all three parts, `child_env` points both variables at
it, and `main` (``lmeval-driver ca-bundle``) writes git's.

When verification fails, `untrusted_message` says so with the field to fix,
e.g. "spec.outputs.oci: the registry's certificate is not trusted
(certificate verify failed: unable to get local issuer certificate): give
its CA in spec.outputs.oci.caBundle, or ask for it in the poller setting
trusted-ca-bundles".
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from driver.contract import ENV_CLUSTER_CA_BUNDLES

__all__ = [
    "CA_ENV",
    "FIELD",
    "SETTING",
    "ClusterBundles",
    "TrustError",
    "check_bundle",
    "child_env",
    "cluster_bundles",
    "combined_bundle",
    "main",
    "ssl_context",
    "untrusted_message",
    "verification_error",
    "write_combined",
]

# The model endpoint's field: what a failed check of $LMEVAL_CA_BUNDLE names.
FIELD = "spec.modelTLS.caBundle"
CA_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
SETTING = "trusted-ca-bundles"
PEM_BEGIN = b"-----BEGIN CERTIFICATE-----"
# OpenSSL's verify codes for a certificate that does not name the host dialled.
_NAME_MISMATCH = (62, 64)  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
Note = Callable[[str], None]


class TrustError(Exception):
    """A job's own CA bundle cannot be used; the message names its field."""


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def _system_bundles(environ: Mapping[str, str]) -> list[str]:
    """The files the image's clients trust: OpenSSL's default, certifi's, and
    whatever the image itself points the two variables at."""
    paths = ssl.get_default_verify_paths()
    found = [p for p in (paths.openssl_cafile, paths.cafile) if p]
    try:
        import certifi

        found.append(certifi.where())
    except ImportError:  # requests brings certifi; without it, nothing to add
        pass
    found += [environ[name] for name in CA_ENV if environ.get(name)]
    unique: list[str] = []
    for path in found:
        real = os.path.realpath(path)
        if os.path.isfile(real) and real not in unique:
            unique.append(real)
    return unique


def _pem_problem(path: str) -> str | None:
    """Why the file at `path` is no usable PEM bundle (without naming a field), or None."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    if not data.strip():
        return f"{path} is empty"
    if PEM_BEGIN not in data:
        return f"{path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
    try:
        ssl.create_default_context(cafile=path)
    except ssl.SSLError as exc:
        return f"{path} is not a usable PEM CA bundle: {exc}"
    return None


def check_bundle(path: str, field: str = FIELD) -> str | None:
    """Why the job's CA bundle at `path` (given by `field`) cannot be used, or None."""
    problem = _pem_problem(path)
    return None if problem is None else f"{field}: {problem}"


@dataclass(frozen=True)
class ClusterBundles:
    """The picked-up bundles that can be used, and a note for each one skipped."""

    files: tuple[str, ...]
    notes: tuple[str, ...]


def cluster_bundles(environ: Mapping[str, str] | None = None) -> ClusterBundles:
    """The bundles of the setting trusted-ca-bundles that this pod has.

    ``$LMEVAL_CLUSTER_CA_BUNDLES`` lists their paths (``:``-separated), each
    ``<dir>/<ConfigMap>/<key>``: a ConfigMap or key absent from the namespace
    leaves no file (the pod mounts them as optional).
    """
    files: list[str] = []
    notes: list[str] = []
    for path in _environ(environ).get(ENV_CLUSTER_CA_BUNDLES, "").split(":"):
        if not path:
            continue
        name = "/".join(path.rstrip("/").split("/")[-2:])
        if not os.path.exists(path):
            notes.append(
                f"{SETTING}: {name} is not in this namespace (no such ConfigMap or key): skipped"
            )
            continue
        problem = _pem_problem(path)
        if problem is not None:
            notes.append(f"{SETTING}: {name}: {problem}: skipped")
            continue
        if path not in files:
            files.append(path)
    return ClusterBundles(tuple(files), tuple(notes))


def _tell(notes: tuple[str, ...], note: Note | None) -> None:
    if note is not None:
        for text in notes:
            note(text)


def ssl_context(
    extra: str | None,
    field: str,
    *,
    verify: bool = True,
    note: Note | None = None,
    environ: Mapping[str, str] | None = None,
) -> ssl.SSLContext:
    """A client context trusting the image's authorities, the cluster's bundles and
    `extra` (the endpoint's own bundle, given by `field`); `verify` False verifies
    nothing (the poller allowed it). Raises TrustError when `extra` is unusable."""
    context = ssl.create_default_context()
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if extra:
        problem = check_bundle(extra, field)
        if problem is not None:
            raise TrustError(problem)
    cluster = cluster_bundles(environ)
    _tell(cluster.notes, note)
    for path in [*cluster.files, *([extra] if extra else [])]:
        context.load_verify_locations(cafile=path)
    return context


def write_combined(
    target: str,
    extra: str | None,
    field: str = FIELD,
    *,
    note: Note | None = None,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """Write one PEM file `target` with the image's authorities, the cluster's
    bundles and `extra` (None: the image's and the cluster's only); the
    problem, naming `field`, when `extra` is unusable or `target` unwritable.

    For a child process (see `child_env`) or a client that takes one file
    (git's http.sslCAInfo).
    """
    if extra:
        problem = check_bundle(extra, field)
        if problem is not None:
            return problem
    env = _environ(environ)
    cluster = cluster_bundles(env)
    _tell(cluster.notes, note)
    try:
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        with open(target, "wb") as out:
            for source in [*_system_bundles(env), *cluster.files, *([extra] if extra else [])]:
                if os.path.realpath(source) == os.path.realpath(target):
                    continue  # an earlier run's file, named by an inherited variable
                with open(source, "rb") as handle:
                    data = handle.read()
                out.write(data if data.endswith(b"\n") else data + b"\n")
    except OSError as exc:
        return f"{field}: cannot write the combined CA bundle {target}: {exc}"
    return None


def combined_bundle(
    extra: str | None,
    directory: str,
    stem: str,
    field: str = FIELD,
    *,
    note: Note | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[str | None, str | None]:
    """(the path of `write_combined`'s file, ``lmeval-ca-<stem>.pem`` in
    `directory`, None) or (None, the problem naming `field`)."""
    target = os.path.join(directory, f"lmeval-ca-{stem}.pem")
    problem = write_combined(target, extra, field, note=note, environ=environ)
    return (None, problem) if problem is not None else (target, None)


def child_env(bundle: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: `base` (this one by default), with both clients
    pointed at `bundle`."""
    return {**(os.environ if base is None else base), **dict.fromkeys(CA_ENV, bundle)}


def verification_error(error: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure behind `error` (urllib wraps it in a
    URLError's reason), or None when `error` is something else."""
    seen: BaseException | None = error
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        reason = getattr(seen, "reason", None)
        seen = reason if isinstance(reason, BaseException) else (seen.__cause__ or seen.__context__)
    return None


def untrusted_message(where: str, peer: str, error: BaseException) -> str | None:
    """What a job's status says when `peer` (e.g. "the registry"), configured at
    spec field `where`, failed certificate verification; None for other errors."""
    failed = verification_error(error)
    if failed is None:
        return None
    detail = (
        f"certificate verify failed: {failed.verify_message}"
        if failed.verify_message
        else str(failed)
    )
    if failed.verify_code in _NAME_MISMATCH:
        return (
            f"{where}: {peer}'s certificate does not name the host it was reached at "
            f"({detail}): use a host name the certificate is issued for"
        )
    return (
        f"{where}: {peer}'s certificate is not trusted ({detail}): give its CA in "
        f"{where}.caBundle, or ask for it in the poller setting {SETTING}"
    )


def main(argv: Sequence[str]) -> int:
    """``lmeval-driver ca-bundle --out FILE [--ca-bundle FILE --field FIELD]``: the
    init container that gives a client taking one file (git) every trusted CA."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="lmeval-driver ca-bundle",
        description="Write one PEM file with the image's authorities, the cluster's CA "
        f"bundles (${ENV_CLUSTER_CA_BUNDLES}) and the endpoint's own.",
    )
    parser.add_argument("--out", required=True, metavar="FILE")
    parser.add_argument("--ca-bundle", metavar="FILE", help="the endpoint's own CAs")
    parser.add_argument("--field", default="caBundle", help="the spec field of --ca-bundle")
    args = parser.parse_args(argv)

    def note(text: str) -> None:
        print(f"note: {text}")

    problem = write_combined(args.out, args.ca_bundle, args.field, note=note)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    # git reads it as another UID than this container's (gittasks.GIT_UID).
    os.chmod(args.out, 0o644)
    print(f"wrote {args.out}")
    return 0
