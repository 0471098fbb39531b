"""Copy an S3 prefix into a directory: the job pod's ``fetch-storage`` init container.

Why this module exists: ``spec.offline.storage.s3`` names models and datasets
in S3-compatible object storage; before the evaluation starts, an init
container (the job's image, the job's restricted profile, no API rights)
copies the prefix into an emptyDir that the evaluation then mounts
read-only, exactly where a claim would be (``/cache/storage``). The driver is
standard-library only, so this is a small S3 client of its own: path-style
requests signed with AWS Signature Version 4 (``ListObjectsV2`` pages, then
one ``GetObject`` per key), which every S3-compatible server understands.

Where to fetch from comes from the environment, as the pod takes it from
Secrets: ``S3_ENDPOINT`` (an ``http://`` or ``https://`` URL, nothing else),
``S3_BUCKET``, ``S3_REGION`` (default ``us-east-1``), ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``. The prefix and the destination are arguments.
Keys are copied below the destination relative to the prefix; a key that
would leave the destination (``..``, empty segments) is refused, and so is
a bucket name that is not one.

An ``https://`` endpoint's certificate is verified against the image's
authorities, the cluster's CA bundles (the poller setting
``trusted-ca-bundles``) and the endpoint's own (``--ca-bundle``, from
``spec.offline.storage.s3.caBundle``), all through `driver.trust`; a
failure names the field to fix. ``--no-verify-ssl`` (``verifySSL: false``,
which the poller allows only when its setting
``allow-insecure-storage-endpoints`` does) verifies nothing.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import re
import ssl
import sys
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from driver import trust

__all__ = ["S3Error", "S3Source", "fetch_prefix", "list_keys", "local_path", "main", "sign"]

# The spec field this copy serves, named by every message about trust.
FIELD = "spec.offline.storage.s3"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_REGION = re.compile(r"^[a-z0-9-]{1,64}$")
_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
TIMEOUT = 60.0
CHUNK = 1 << 20


class S3Error(Exception):
    """The copy cannot be done; the message says why."""


@dataclass(frozen=True)
class S3Source:
    endpoint: str
    bucket: str
    region: str
    access_key: str
    secret_key: str
    verify: bool = True
    # The client's context (`driver.trust.ssl_context`); None: the default one,
    # or none at all when `verify` is False.
    context: ssl.SSLContext | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], verify: bool = True, context: ssl.SSLContext | None = None
    ) -> S3Source:
        missing = [
            name
            for name in ("S3_ENDPOINT", "S3_BUCKET", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
            if not env.get(name)
        ]
        if missing:
            raise S3Error(f"missing {', '.join(missing)} in the environment")
        endpoint = env["S3_ENDPOINT"].strip().rstrip("/")
        parts = urllib.parse.urlsplit(endpoint)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.username
            or parts.password
            or parts.query
            or parts.fragment
            or parts.path not in ("", "/")
        ):
            raise S3Error("S3_ENDPOINT must be an http:// or https:// URL of a host (and port)")
        bucket = env["S3_BUCKET"].strip()
        if not _BUCKET.match(bucket) or ".." in bucket:
            raise S3Error(f"S3_BUCKET {bucket!r} is not a bucket name")
        region = (env.get("S3_REGION") or "us-east-1").strip()
        if not _REGION.match(region):
            raise S3Error(f"S3_REGION {region!r} is not a region name")
        return cls(
            endpoint,
            bucket,
            region,
            env["AWS_ACCESS_KEY_ID"].strip(),
            env["AWS_SECRET_ACCESS_KEY"].strip(),
            verify,
            context,
        )


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def sign(
    source: S3Source, path: str, query: Mapping[str, str], now: datetime.datetime
) -> dict[str, str]:
    """The headers of a signed GET (AWS Signature Version 4, unsigned-body form)."""
    host = urllib.parse.urlsplit(source.endpoint).netloc
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    canonical_query = "&".join(
        f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
        for k, v in sorted(query.items())
    )
    headers = {"host": host, "x-amz-content-sha256": EMPTY_SHA256, "x-amz-date": amz_date}
    signed = ";".join(sorted(headers))
    canonical = "\n".join(
        [
            "GET",
            path,
            canonical_query,
            "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)),
            signed,
            EMPTY_SHA256,
        ]
    )
    scope = f"{day}/{source.region}/s3/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = _hmac(f"AWS4{source.secret_key}".encode(), day)
    for part in (source.region, "s3", "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return {
        "x-amz-content-sha256": EMPTY_SHA256,
        "x-amz-date": amz_date,
        "Authorization": f"AWS4-HMAC-SHA256 Credential={source.access_key}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}",
    }


def _get(source: S3Source, key: str | None, query: Mapping[str, str]) -> object:
    path = "/" + urllib.parse.quote(source.bucket, safe="")
    if key is not None:
        path += "/" + urllib.parse.quote(key, safe="/-_.~")
    url = source.endpoint + path
    if query:
        url += "?" + urllib.parse.urlencode(sorted(query.items()), quote_via=urllib.parse.quote)
    headers = sign(source, path, query, datetime.datetime.now(datetime.UTC))
    context = source.context
    if context is None:
        context = ssl.create_default_context()
        if not source.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(url, headers=headers, method="GET")  # noqa: S310 - checked
    try:
        return urllib.request.urlopen(request, timeout=TIMEOUT, context=context)  # noqa: S310
    except urllib.error.HTTPError as error:
        body = error.read(2048).decode("utf-8", "replace")
        code = re.search(r"<Code>([^<]{1,100})</Code>", body)
        what = f"s3://{source.bucket}/{key or ''}"
        raise S3Error(
            f"{what}: HTTP {error.code} {code.group(1) if code else body[:200]}"
        ) from None
    except OSError as error:
        untrusted = trust.untrusted_message(FIELD, "the S3 endpoint", error)
        raise S3Error(untrusted or f"{source.endpoint}: {error}") from None


def list_keys(source: S3Source, prefix: str) -> Iterator[tuple[str, int]]:
    """(key, size) of every object under `prefix`, in the server's order."""
    token: str | None = None
    while True:
        query = {"list-type": "2", "prefix": prefix}
        if token:
            query["continuation-token"] = token
        with _get(source, None, query) as response:  # type: ignore[attr-defined]
            root = ET.fromstring(response.read())  # noqa: S314
        for item in root.iter(f"{_NS}Contents"):
            key = item.findtext(f"{_NS}Key") or ""
            size = int(item.findtext(f"{_NS}Size") or "0")
            yield key, size
        if (root.findtext(f"{_NS}IsTruncated") or "false").lower() != "true":
            return
        token = root.findtext(f"{_NS}NextContinuationToken")
        if not token:
            raise S3Error("the listing is truncated but has no continuation token")


def local_path(dest: str, prefix: str, key: str) -> str | None:
    """Where `key` goes below `dest` (None: a directory marker); S3Error if it would leave."""
    base = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    if key == prefix.rstrip("/") or key.endswith("/"):
        return None
    if not key.startswith(base):
        raise S3Error(f"key {key!r} is not under {base!r}")
    parts = key[len(base) :].split("/")
    if any(p in ("", ".", "..") for p in parts) or any("\0" in p for p in parts):
        raise S3Error(f"key {key!r} does not name a file below the destination")
    return os.path.join(dest, *parts)


def fetch_prefix(source: S3Source, prefix: str, dest: str) -> tuple[int, int]:
    """Copy every object under `prefix` into `dest`; return (objects, bytes)."""
    prefix = prefix.strip("/")
    listing_prefix = f"{prefix}/" if prefix else ""
    count = total = 0
    for key, _size in list_keys(source, listing_prefix):
        target = local_path(dest, listing_prefix, key)
        if target is None:
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        partial = target + ".part"
        with _get(source, key, {}) as response, open(partial, "wb") as out:  # type: ignore[attr-defined]
            while chunk := response.read(CHUNK):
                out.write(chunk)
                total += len(chunk)
        os.replace(partial, target)
        count += 1
    return count, total


def main(argv: Sequence[str]) -> int:
    """``lmeval-driver fetch-s3 --dest DIR [--path PREFIX] [--ca-bundle FILE]
    [--no-verify-ssl]``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="lmeval-driver fetch-s3",
        description="Copy an S3 prefix into a directory (S3_ENDPOINT, S3_BUCKET, S3_REGION, "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY from the environment).",
    )
    parser.add_argument("--dest", required=True, metavar="DIR")
    parser.add_argument("--path", default="", metavar="PREFIX")
    parser.add_argument("--ca-bundle", metavar="FILE", help="the endpoint's own CAs (PEM)")
    parser.add_argument("--no-verify-ssl", action="store_true")
    args = parser.parse_args(argv)
    verify = not args.no_verify_ssl
    try:
        context = trust.ssl_context(
            args.ca_bundle,
            f"{FIELD}.caBundle",
            verify=verify,
            note=lambda text: print(f"note: {text}", flush=True),
        )
        source = S3Source.from_env(os.environ, verify=verify, context=context)
        count, total = fetch_prefix(source, args.path, args.dest)
    except (S3Error, trust.TrustError, OSError, ET.ParseError) as error:
        print(f"lmeval-driver fetch-s3: {error}", file=sys.stderr)
        return 1
    where = f"s3://{source.bucket}/{args.path.strip('/')}"
    print(f"fetched {count} object(s), {total} bytes, from {where} into {args.dest}")
    if count == 0:
        print(f"lmeval-driver fetch-s3: nothing under {where}", file=sys.stderr)
        return 1
    return 0
