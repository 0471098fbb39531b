"""Extra certificate authorities for the model endpoint, added to the image's own.

Why this module exists: a job may name a CA bundle (``spec.modelTLS.caBundle``)
for a model endpoint whose certificate comes from an internal CA. The pod
mounts it and names it in ``$LMEVAL_CA_BUNDLE``. lm_eval's API models talk
HTTP through two clients that find their trust store differently:

* ``aiohttp`` (every batched request) builds ``ssl.create_default_context()``,
  which reads OpenSSL's default file, overridden by ``$SSL_CERT_FILE``;
* ``requests`` (``model_call``, and the remote tokenizer's ``/tokenizer_info``,
  ``/tokenize`` calls) uses certifi's bundle, overridden by
  ``$REQUESTS_CA_BUNDLE``.

Either variable *replaces* its client's store. Pointing both at the job's
bundle alone would make every public endpoint (a hub download in an
``allowOnline`` job, a hosted API) untrusted. So the driver writes one
combined file, the image's system bundle, certifi's bundle, then the job's,
and points both variables at it for the child only. The job's file is
checked first: a bundle with no certificate in it is a driver error that
names the field, not a TLS failure later.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# What a failed check says first; the poller shows it as the job's message.
FIELD = "spec.modelTLS.caBundle"
CA_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")


def _system_bundles() -> list[str]:
    import ssl

    paths = ssl.get_default_verify_paths()
    found = [p for p in (paths.openssl_cafile, paths.cafile) if p]
    try:
        import certifi

        found.append(certifi.where())
    except ImportError:  # requests brings certifi; without it, nothing to add
        pass
    unique: list[str] = []
    for path in found:
        real = os.path.realpath(path)
        if os.path.isfile(real) and real not in unique:
            unique.append(real)
    return unique


def check_bundle(path: str) -> str | None:
    """Why the job's CA bundle at `path` cannot be used, or None."""
    import ssl

    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        return f"{FIELD}: cannot read {path}: {exc.strerror or exc}"
    if b"-----BEGIN CERTIFICATE-----" not in data:
        return f"{FIELD}: {path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
    try:
        ssl.create_default_context(cafile=path)
    except ssl.SSLError as exc:
        return f"{FIELD}: {path} is not a usable PEM CA bundle: {exc}"
    return None


def combined_bundle(extra: str, directory: str, stem: str) -> tuple[str | None, str | None]:
    """(path of the combined bundle written in `directory`, None) or (None, the problem)."""
    problem = check_bundle(extra)
    if problem is not None:
        return None, problem
    target = os.path.join(directory, f"lmeval-ca-{stem}.pem")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(target, "wb") as out:
            for source in [*_system_bundles(), extra]:
                with open(source, "rb") as handle:
                    data = handle.read()
                out.write(data if data.endswith(b"\n") else data + b"\n")
    except OSError as exc:
        return None, f"{FIELD}: cannot write the combined CA bundle {target}: {exc}"
    return target, None


def child_env(bundle: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: `base` (this one by default), with both clients
    pointed at `bundle`."""
    return {**(os.environ if base is None else base), **dict.fromkeys(CA_ENV, bundle)}
