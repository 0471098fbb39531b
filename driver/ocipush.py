"""Push a run's results to an OCI registry as an artifact (``spec.outputs.oci``).

Why this module exists: the job pod has network to the registry but no API
rights, so the push happens there, after lm_eval wrote its results and
before the final marker, which reports the manifest digest (or why the push
failed: the evaluation is never lost to a failed push). The driver is
standard-library only and may run in any image, so this is a small client of
the distribution API of its own:

* blobs: ``HEAD /v2/<name>/blobs/<digest>`` (skip a blob the registry has),
  else ``POST /v2/<name>/blobs/uploads/`` then ``PUT <location>?digest=``;
* the manifest: ``PUT /v2/<name>/manifests/<tag>``, an OCI 1.1 image
  manifest with ``artifactType`` :data:`ARTIFACT_TYPE`, the OCI empty config,
  two layers (the full results JSON, the provenance JSON) and, optionally,
  a ``subject`` (a model artifact's manifest in the same repository);
* auth: anonymous first; on a 401, its ``WWW-Authenticate`` challenge:
  ``Basic`` (the credentials of the registry's host in a mounted
  ``.dockerconfigjson``) or ``Bearer`` (a token from the challenge's realm,
  asked with those credentials if any, for ``repository:<name>:pull,push``).

Plain HTTP is used only when asked, and only for a loopback registry.
HTTPS verifies the registry's certificate against the image's authorities,
the cluster's CA bundles (the poller setting ``trusted-ca-bundles``) and
the registry's own (``spec.outputs.oci.caBundle``), through
`driver.trust`; a failure names the field to fix. Verification is off only
when the job asked (``verifySSL: false``) and the poller allowed it.

The client (`Client`, `open_client`) and its blob and manifest requests are
public: ``driver.attest`` pushes signed verdicts to the same registries with
the same credentials, as cosign stores them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.message import Message

from driver import trust

__all__ = [
    "ARTIFACT_TYPE",
    "DIGEST",
    "EMPTY_CONFIG",
    "MANIFEST_TYPE",
    "MAX_MANIFEST",
    "Client",
    "OciError",
    "Reference",
    "basic_credentials",
    "build_manifest",
    "describe_manifest",
    "digest_of",
    "get_manifest",
    "open_client",
    "opener",
    "parse_challenge",
    "parse_digest_reference",
    "parse_reference",
    "push_blob",
    "push_results",
    "put_manifest",
]

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
ARTIFACT_TYPE = "application/vnd.lmeval.results.v1+json"
RESULTS_TYPE = "application/vnd.lmeval.results.v1+json"
PROVENANCE_TYPE = "application/vnd.lmeval.provenance.v1+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_CONFIG = b"{}"
TIMEOUT = 60.0
# What a registry's answers may weigh: distribution's own limit for a manifest,
# and the head of an error's body (only its first 300 characters are shown).
MAX_MANIFEST = 4 * 1024 * 1024
MAX_ERROR_BODY = 64 * 1024
MANIFEST_TYPES = (
    MANIFEST_TYPE,
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
# host[:port]/path[:tag]; the same grammar as the schema's (no scheme, no '-' first).
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}"
_REFERENCE = re.compile(rf"^({_HOST})/({_PATH})(?::({_TAG}))?$")
_AT_DIGEST = re.compile(rf"^({_HOST})/({_PATH})@(sha256:[a-f0-9]{{64}})$")
DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
# The spec field a push serves, and the one of the registry's own CAs.
WHERE = "spec.outputs.oci"
CA_FIELD = f"{WHERE}.caBundle"


class OciError(Exception):
    """The push failed; the message says where and why."""


@dataclass(frozen=True)
class Reference:
    registry: str  # host[:port]
    repository: str
    tag: str

    @property
    def host(self) -> str:
        return self.registry.rsplit(":", 1)[0] if ":" in self.registry else self.registry


def parse_reference(text: str) -> Reference:
    """``host[:port]/path:tag`` (the tag is required here: the poller always gives one)."""
    match = _REFERENCE.match(text)
    if match is None or match.group(3) is None:
        raise OciError(f"not a registry reference host[:port]/path:tag: {text!r}")
    return Reference(match.group(1), match.group(2), match.group(3))


def parse_digest_reference(text: str) -> tuple[str, str, str]:
    """``host[:port]/path@sha256:<hex>``: (registry, repository, digest)."""
    match = _AT_DIGEST.fullmatch(text)
    if match is None:
        raise OciError(f"not a registry reference host[:port]/path@sha256:<hex>: {text!r}")
    return match.group(1), match.group(2), match.group(3)


def digest_of(data: bytes) -> str:
    """The ``sha256:<hex>`` digest of a blob or manifest."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _descriptor(media_type: str, data: bytes, title: str | None = None) -> dict[str, object]:
    desc: dict[str, object] = {
        "mediaType": media_type,
        "digest": digest_of(data),
        "size": len(data),
    }
    if title is not None:
        desc["annotations"] = {"org.opencontainers.image.title": title}
    return desc


def build_manifest(
    results: bytes,
    provenance: bytes,
    subject: tuple[str, str, int] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> bytes:
    """The artifact's image manifest (canonical bytes: what is pushed is what is hashed).

    `subject` is (mediaType, digest, size) of the manifest the results attach to.
    """
    manifest: dict[str, object] = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": _descriptor(EMPTY_TYPE, EMPTY_CONFIG),
        "layers": [
            _descriptor(RESULTS_TYPE, results, "results.json"),
            _descriptor(PROVENANCE_TYPE, provenance, "provenance.json"),
        ],
    }
    if subject is not None:
        media_type, digest, size = subject
        manifest["subject"] = {"mediaType": media_type, "digest": digest, "size": size}
    if annotations:
        manifest["annotations"] = dict(annotations)
    return json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()


_PARAM = re.compile(r'([A-Za-z]+)="([^"]*)"')


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """A ``WWW-Authenticate`` header: its scheme (lower case) and parameters."""
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), {k.lower(): v for k, v in _PARAM.findall(rest)}


def basic_credentials(config: Mapping[str, object], registry: str) -> str | None:
    """The base64 ``user:password`` for `registry` in a parsed ``.dockerconfigjson``."""
    auths = config.get("auths")
    if not isinstance(auths, dict):
        return None
    for key in (registry, f"https://{registry}", f"http://{registry}", f"https://{registry}/v1/"):
        entry = auths.get(key)
        if not isinstance(entry, dict):
            continue
        auth = entry.get("auth")
        if isinstance(auth, str) and auth:
            return auth
        user, password = entry.get("username"), entry.get("password")
        if isinstance(user, str) and isinstance(password, str):
            return base64.b64encode(f"{user}:{password}".encode()).decode()
    return None


@dataclass
class Client:
    """A session with one repository of a registry: its scheme, the Basic
    credentials found for it, and the Authorization a 401 led to."""

    ref: Reference
    scheme: str
    basic: str | None  # base64 user:password, if the Secret had some
    authorization: str | None = None
    tried: set[str] = field(default_factory=set)
    # How requests are made (`opener`: the TLS context, no redirects), and the
    # spec field a certificate failure names (None: the error as it is, for
    # pushes that serve another field, as driver.attest's).
    transport: urllib.request.OpenerDirector = field(default_factory=lambda: _DEFAULT_OPENER)
    where: str | None = None

    def url(self, path: str) -> str:
        return f"{self.scheme}://{self.ref.registry}{path}"

    def request(
        self,
        method: str,
        url: str,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        limit: int | None = None,
    ) -> tuple[int, Message[str, str], bytes]:
        """One request, answering a 401's challenge once; a body longer than
        `limit` (when given) is refused, not read whole."""
        for _attempt in range(2):
            req = urllib.request.Request(url, data=data, method=method)  # noqa: S310 - http(s)
            for key, value in (headers or {}).items():
                req.add_header(key, value)
            if self.authorization is not None:
                req.add_header("Authorization", self.authorization)
            try:
                with self.transport.open(req, timeout=TIMEOUT) as resp:
                    if limit is None:
                        return resp.status, resp.headers, resp.read()
                    body = resp.read(limit + 1)
                    if len(body) > limit:
                        raise OciError(f"{method} {url}: the answer exceeds {limit} bytes")
                    return resp.status, resp.headers, body
            except urllib.error.HTTPError as exc:
                body = exc.read(MAX_ERROR_BODY)
                if exc.code != 401:
                    return exc.code, exc.headers, body
                if self._authenticate(exc.headers.get("WWW-Authenticate")):
                    continue
                if self.authorization is None:
                    raise OciError(
                        f"{method} {url}: HTTP 401, the registry asks for credentials "
                        "(spec.outputs.oci.credentialsSecret)"
                    ) from None
                break
            except (urllib.error.URLError, OSError) as exc:
                raise OciError(self._unreachable(method, url, exc)) from None
        raise OciError(f"{method} {url}: HTTP 401, the registry refused the credentials")

    def _untrusted(self, peer: str, exc: BaseException) -> str | None:
        return None if self.where is None else trust.untrusted_message(self.where, peer, exc)

    def _unreachable(self, method: str, url: str, exc: BaseException) -> str:
        return self._untrusted("the registry", exc) or f"{method} {url}: {exc}"

    def _authenticate(self, header: str | None) -> bool:
        """Answer a 401's challenge; False when there is nothing (new) to try."""
        if not header:
            return False
        scheme, params = parse_challenge(header)
        if scheme == "basic":
            if self.basic is None or "basic" in self.tried:
                return False
            self.tried.add("basic")
            self.authorization = f"Basic {self.basic}"
            return True
        if scheme == "bearer" and "bearer" not in self.tried:
            self.tried.add("bearer")
            self.authorization = f"Bearer {self._token(params)}"
            return True
        return False

    def _token(self, params: Mapping[str, str]) -> str:
        realm = params.get("realm", "")
        parts = urllib.parse.urlsplit(realm)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise OciError(f"the registry's token realm is not an http(s) URL: {realm!r}")
        if parts.scheme == "http" and parts.hostname not in LOOPBACK:
            raise OciError(f"refusing a plain-HTTP token realm off loopback: {realm!r}")
        query = {"scope": f"repository:{self.ref.repository}:pull,push"}
        if "service" in params:
            query["service"] = params["service"]
        req = urllib.request.Request(f"{realm}?{urllib.parse.urlencode(query)}")  # noqa: S310
        if self.basic is not None:
            req.add_header("Authorization", f"Basic {self.basic}")
        try:
            with self.transport.open(req, timeout=TIMEOUT) as resp:
                body = json.loads(resp.read(MAX_MANIFEST))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            untrusted = self._untrusted("the registry's token service", exc)
            raise OciError(untrusted or f"token from {realm}: {exc}") from None
        token = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise OciError(f"token from {realm}: no token in the answer")
        return token


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirect would carry the Authorization header elsewhere (or drop a PUT's body).
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def opener(context: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    """An opener that follows no redirect and verifies HTTPS with `context`
    (None: Python's default context)."""
    return urllib.request.build_opener(_NoRedirect(), urllib.request.HTTPSHandler(context=context))


_DEFAULT_OPENER: urllib.request.OpenerDirector = opener()


def push_blob(client: Client, data: bytes) -> None:
    """Upload `data` unless the repository has it already."""
    name = client.ref.repository
    digest = digest_of(data)
    head = client.url(f"/v2/{name}/blobs/{digest}")
    status, _h, _b = client.request("HEAD", head, limit=MAX_ERROR_BODY)
    if status == 200:
        return
    start = client.url(f"/v2/{name}/blobs/uploads/")
    status, headers, body = client.request("POST", start, b"", limit=MAX_ERROR_BODY)
    location = headers.get("Location") if status == 202 else None
    if not location:
        raise OciError(f"starting a blob upload: HTTP {status} {_brief(body)}")
    target = urllib.parse.urljoin(client.url("/"), location)
    if urllib.parse.urlsplit(target).netloc != client.ref.registry:
        raise OciError(f"the registry sent the upload elsewhere: {target}")
    sep = "&" if urllib.parse.urlsplit(target).query else "?"
    headers_out = {"Content-Type": "application/octet-stream"}
    url = f"{target}{sep}digest={urllib.parse.quote(digest)}"
    status, _h, body = client.request("PUT", url, data, headers_out, limit=MAX_ERROR_BODY)
    if status != 201:
        raise OciError(f"uploading blob {digest}: HTTP {status} {_brief(body)}")


def _brief(body: bytes) -> str:
    return body[:300].decode("utf-8", "replace").strip()


def get_manifest(client: Client, reference: str) -> tuple[str, bytes] | None:
    """The manifest at `reference` (a tag or digest) in the client's repository:
    its media type and bytes; None when the registry has none (404)."""
    url = client.url(f"/v2/{client.ref.repository}/manifests/{reference}")
    accept = ", ".join(MANIFEST_TYPES)
    status, headers, body = client.request(
        "GET", url, headers={"Accept": accept}, limit=MAX_MANIFEST
    )
    if status == 404:
        return None
    if status != 200:
        raise OciError(f"reading the manifest {reference}: HTTP {status} {_brief(body)}")
    return headers.get("Content-Type", MANIFEST_TYPE).split(";")[0].strip(), body


def put_manifest(client: Client, tag: str, manifest: bytes, media_type: str) -> str:
    """Store `manifest` under `tag`; returns its digest."""
    url = client.url(f"/v2/{client.ref.repository}/manifests/{tag}")
    headers = {"Content-Type": media_type}
    status, _h, body = client.request("PUT", url, manifest, headers, limit=MAX_ERROR_BODY)
    if status != 201:
        raise OciError(f"putting the manifest {tag}: HTTP {status} {_brief(body)}")
    return digest_of(manifest)


def describe_manifest(client: Client, digest: str) -> tuple[str, str, int]:
    """(mediaType, digest, size) of the manifest `digest`, checked to exist in the
    client's repository and to hash to `digest`: an OCI 1.1 ``subject``."""
    url = client.url(f"/v2/{client.ref.repository}/manifests/{digest}")
    accept = ", ".join(MANIFEST_TYPES)
    status, headers, body = client.request(
        "GET", url, headers={"Accept": accept}, limit=MAX_MANIFEST
    )
    if status != 200:
        raise OciError(f"subject {digest} not found in {client.ref.repository}: HTTP {status}")
    if digest_of(body) != digest:
        raise OciError(f"subject {digest}: the registry's manifest has another digest")
    media_type = headers.get("Content-Type", MANIFEST_TYPE).split(";")[0].strip()
    return media_type, digest, len(body)


def open_client(
    ref: Reference,
    *,
    docker_config: str | None,
    plain_http: bool,
    context: ssl.SSLContext | None = None,
) -> Client:
    """A client for `ref`'s repository: HTTPS (verified with `context`, else
    Python's default), or plain HTTP to a loopback registry only; the Basic
    credentials of `ref`'s registry in the ``.dockerconfigjson`` at
    `docker_config`, if given."""
    if plain_http and ref.host not in LOOPBACK:
        raise OciError(f"plain HTTP is allowed only to a loopback registry, not {ref.registry}")
    basic = None
    if docker_config is not None:
        try:
            with open(docker_config, "rb") as fh:
                config = json.loads(fh.read(MAX_MANIFEST))
        except (OSError, ValueError) as exc:
            raise OciError(f"registry credentials {docker_config}: {exc}") from None
        if not isinstance(config, dict):
            raise OciError(f"registry credentials {docker_config}: not a JSON object")
        basic = basic_credentials(config, ref.registry)
    client = Client(ref, "http" if plain_http else "https", basic)
    if context is not None:
        client.transport = opener(context)
    return client


def push_results(
    reference: str,
    results: bytes,
    provenance: bytes,
    *,
    subject: str | None = None,
    docker_config: str | None = None,
    plain_http: bool = False,
    ca_bundle: str | None = None,
    verify_tls: bool = True,
) -> str:
    """Push the artifact; returns ``<registry>/<repository>@sha256:...``.

    `docker_config` is the path of a ``.dockerconfigjson`` (optional);
    `ca_bundle` a PEM file of the registry's own CAs, trusted besides the
    image's and the cluster's; `verify_tls` False verifies no certificate.
    """
    ref = parse_reference(reference)
    if subject is not None and not DIGEST.match(subject):
        raise OciError(f"subject must be a sha256 digest: {subject!r}")
    context = None
    if not plain_http:
        try:
            context = trust.ssl_context(ca_bundle, CA_FIELD, verify=verify_tls)
        except trust.TrustError as exc:
            raise OciError(str(exc)) from None
    client = open_client(ref, docker_config=docker_config, plain_http=plain_http, context=context)
    client.where = WHERE
    described = describe_manifest(client, subject) if subject is not None else None
    for blob in (EMPTY_CONFIG, results, provenance):
        push_blob(client, blob)
    manifest = build_manifest(results, provenance, described)
    digest = put_manifest(client, ref.tag, manifest, MANIFEST_TYPE)
    return f"{ref.registry}/{ref.repository}@{digest}"
