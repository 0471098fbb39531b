"""The fetch-storage init container's S3 copy (driver/s3fetch.py): its pure parts.

The copy itself runs against a real S3 server in tests/e2e/test_offline_s3.py.
Here: the request signature equals AWS's published Signature Version 4 example
("GET Bucket (List Objects)", AWS S3 API reference), keys are placed below
the destination relative to the prefix and never outside it, and the
environment is checked before any request (an endpoint must be a plain
http(s) URL of a host, a bucket a bucket name).
"""

from __future__ import annotations

import datetime

import pytest

from driver.s3fetch import S3Error, S3Source, local_path, sign

ENV = {
    "S3_ENDPOINT": "http://127.0.0.1:9000",
    "S3_BUCKET": "models",
    "AWS_ACCESS_KEY_ID": "AK",
    "AWS_SECRET_ACCESS_KEY": "SK",
}


def test_signature_is_awss_published_example() -> None:
    source = S3Source(
        "https://examplebucket.s3.amazonaws.com",
        "examplebucket",
        "us-east-1",
        "AKIAIOSFODNN7EXAMPLE",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    )
    when = datetime.datetime(2013, 5, 24, tzinfo=datetime.UTC)
    headers = sign(source, "/", {"max-keys": "2", "prefix": "J"}, when)
    assert headers["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;x-amz-content-sha256;x-amz-date, "
        "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
    )


def test_keys_land_below_the_destination_relative_to_the_prefix() -> None:
    assert local_path("/d", "store/", "store/hub/x.json") == "/d/hub/x.json"
    assert local_path("/d", "", "hub/x.json") == "/d/hub/x.json"
    assert local_path("/d", "store/", "store/hub/") is None  # a folder marker
    for key in ("store/../etc/passwd", "store//x", "store/./x", "other/x", "store/a/.."):
        with pytest.raises(S3Error):
            local_path("/d", "store/", key)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("S3_ENDPOINT", "file:///etc"),
        ("S3_ENDPOINT", "http://user:pw@host"),
        ("S3_ENDPOINT", "http://host/path"),
        ("S3_ENDPOINT", "http://host/?x=1"),
        ("S3_ENDPOINT", ""),
        ("S3_BUCKET", "../x"),
        ("S3_BUCKET", "a"),
        ("S3_REGION", "us east"),
        ("AWS_SECRET_ACCESS_KEY", ""),
    ],
)
def test_environment_is_checked_before_any_request(name: str, value: str) -> None:
    with pytest.raises(S3Error):
        S3Source.from_env({**ENV, name: value})


def test_a_good_environment() -> None:
    source = S3Source.from_env({**ENV, "S3_ENDPOINT": "https://s3.example:8443/"}, verify=False)
    assert (source.endpoint, source.bucket, source.region) == (
        "https://s3.example:8443",
        "models",
        "us-east-1",
    )
    assert source.verify is False
