"""The results ConfigMap's packed form, read back by every reader within the results' limit.

Checks: results the poller packed into binaryData (RESULTS_GZ_KEY) read back
as the same JSON through `packed_results_text`, the one reader the gate and
`lmeval results` share; a packed value that inflates past the results' own
limit (protocol.MAX_RESULTS_BYTES) is refused before it is inflated further,
as is one that is not gzip or not text; and the controller of an object is
told by `ownership.controller_uid`, which the results, items and task
snapshot readers use alike.
"""

from __future__ import annotations

import json

import pytest

from driver.protocol import MAX_RESULTS_BYTES
from poller import ownership, results


def test_packed_results_read_back_as_written() -> None:
    written = {"results": {"arc_easy": {"acc,none": 0.5}}, "configs": {"arc_easy": {}}}
    manifest = results.results_configmap(
        namespace="ns",
        job_name="job",
        job_uid="uid-1",
        results=written,
        labels={},
        compress=True,
    )
    assert results.RESULTS_KEY not in (manifest.get("data") or {})
    packed = manifest["binaryData"][results.RESULTS_GZ_KEY]
    assert json.loads(results.packed_results_text(packed)) == written
    assert ownership.controller_uid(manifest) == "uid-1"


def test_a_packed_bomb_is_refused_at_the_results_limit() -> None:
    bomb = results.gzip_base64(b" " * (MAX_RESULTS_BYTES + 1))
    with pytest.raises(ValueError, match=f"more than {MAX_RESULTS_BYTES} bytes"):
        results.packed_results_text(bomb)


@pytest.mark.parametrize(
    ("encoded", "what"),
    [
        ("not base64!", "is not base64"),
        (results.gzip_base64(b"\xff\xfe results"), "is not UTF-8"),
        ("aGVsbG8=", "is not gzip"),
    ],
)
def test_packed_results_that_are_not_gzip_text_are_refused(encoded: str, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        results.packed_results_text(encoded)


def test_controller_uid_is_the_controlling_reference_only() -> None:
    refs = [
        {"uid": "a", "controller": False},
        {"uid": "b"},
        "junk",
        {"uid": "c", "controller": True},
    ]
    assert ownership.controller_uid({"metadata": {"ownerReferences": refs}}) == "c"
    assert ownership.controller_uid({"metadata": {"ownerReferences": refs[:2]}}) is None
    assert ownership.controller_uid({"metadata": {}}) is None
    assert ownership.controller_uid({}) is None
