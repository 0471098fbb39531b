"""`poller.kube.pages.paged`: LIST pages parsed whole, or for their metadata only.

Checks: every item of every page comes once, in order, the next page fetched
with the continue token; with `unchanged`, a page whose every item it
accepts comes as metadata only (the idle hot listing keeps uids and
resourceVersions, not whole objects), while a page with one changed or
unknown item, or an item without a resourceVersion, is parsed whole, page by
page.
"""

from __future__ import annotations

import json
from typing import Any

from poller.kube.pages import JOB_PAGE, ObjectMetadata, paged


def _job(name: str, version: str | None = "7") -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ns", "name": name, "uid": f"uid-{name}"}
    if version is not None:
        meta["resourceVersion"] = version
    return {"metadata": meta, "spec": {"model": "hf"}, "status": {"state": "Running"}}


def _pages(*pages: list[dict[str, Any]]) -> dict[str | None, bytes]:
    """Page bodies by the continue token that asks for them."""
    served: dict[str | None, bytes] = {}
    for k, items in enumerate(pages):
        token = f"t{k + 1}" if k + 1 < len(pages) else None
        served[f"t{k}" if k else None] = json.dumps(
            {"metadata": {"continue": token} if token else {}, "items": items}
        ).encode()
    return served


def test_every_item_once_in_order_whole_without_a_predicate() -> None:
    served = _pages([_job("a"), _job("b")], [_job("c")])
    asked: list[str | None] = []

    def fetch(token: str | None) -> bytes:
        asked.append(token)
        return served[token]

    items = list(paged(fetch, JOB_PAGE))
    assert [i["metadata"]["name"] for i in items] == ["a", "b", "c"]
    assert asked == [None, "t1"]
    assert all(i["spec"] == {"model": "hf"} for i in items)


def test_a_page_of_unchanged_objects_is_read_for_its_metadata_only() -> None:
    served = _pages([_job("a"), _job("b")], [_job("c", "8"), _job("d")], [_job("e", None)])
    held = {"uid-a": "7", "uid-b": "7", "uid-c": "7", "uid-d": "7", "uid-e": "7"}

    def unchanged(meta: ObjectMetadata) -> bool:
        version = meta.get("resourceVersion")
        return bool(version) and held.get(meta.get("uid", "")) == version

    items = list(paged(served.__getitem__, JOB_PAGE, unchanged))
    assert [i["metadata"]["name"] for i in items] == ["a", "b", "c", "d", "e"]
    # Page 1: all held at their versions, metadata only; page 2: c changed, so
    # the page is whole (d too); page 3: e has no version, whole.
    assert [set(i) for i in items] == [
        {"metadata"},
        {"metadata"},
        {"metadata", "spec", "status"},
        {"metadata", "spec", "status"},
        {"metadata", "spec", "status"},
    ]
    assert items[0]["metadata"] == {
        "namespace": "ns",
        "name": "a",
        "uid": "uid-a",
        "resourceVersion": "7",
    }
