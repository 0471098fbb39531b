"""LIST pages: parsed in one pass into what the views read, the next one prefetched.

`poller.kube.reads` requests the pages (the reads of `poller.kube.client.Kube`, the
one class that talks to the API); this module is what it does with them,
kept apart because it is the part that decides a cycle's memory: a page is
parsed straight into the shape the views read (`poller.decisions.views.JobObject`,
`PodObject`), skipping what no view reads (managedFields, most of a pod's spec), and
dropped before the next is used. As soon as a page's continue token is known, the next page is
requested on a helper thread, so the apiserver prepares it while this one is
parsed; the pages of one LIST are still requested one after the other.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import TypeAdapter
from typing_extensions import TypedDict

from poller.decisions.kueueadmission import WorkloadObject
from poller.decisions.views import JobObject, PodObject

__all__ = [
    "JOB_PAGE",
    "METADATA_ONLY",
    "METADATA_PAGE",
    "POD",
    "POD_PAGE",
    "WORKLOAD_PAGE",
    "ObjectMetadata",
    "Unchanged",
    "paged",
]


class _JobPage(TypedDict, total=False):
    metadata: Any
    items: list[JobObject] | None


class _PodPage(TypedDict, total=False):
    metadata: Any
    items: list[PodObject] | None


class _WorkloadPage(TypedDict, total=False):
    metadata: Any
    items: list[WorkloadObject] | None


class _MetadataOnly(TypedDict, total=False):
    metadata: Any


class ObjectMetadata(TypedDict, total=False):
    """What the sweep of finished jobs reads of each one (`poller.cycle.sweep`)."""

    namespace: str
    name: str
    uid: str
    resourceVersion: str


class _MetadataItem(TypedDict, total=False):
    metadata: ObjectMetadata


class _MetadataPage(TypedDict, total=False):
    metadata: Any
    items: list[_MetadataItem] | None


# A LIST page parsed in one pass into only the fields the views read; and
# only its metadata (a list's continue token, an object's uid), which a quick
# pass finds.
JOB_PAGE: TypeAdapter[Any] = TypeAdapter(_JobPage)
POD_PAGE: TypeAdapter[Any] = TypeAdapter(_PodPage)
POD: TypeAdapter[Any] = TypeAdapter(PodObject)
WORKLOAD_PAGE: TypeAdapter[Any] = TypeAdapter(_WorkloadPage)
METADATA_ONLY: TypeAdapter[Any] = TypeAdapter(_MetadataOnly)
# A PartialObjectMetadataList page: each item's identity and resourceVersion only.
METADATA_PAGE: TypeAdapter[Any] = TypeAdapter(_MetadataPage)


class _Prefetch:
    """One request running on a helper thread while the caller works."""

    def __init__(self, fetch: Callable[[str], bytes], token: str) -> None:
        self._fetch = fetch
        self._token = token
        self._data: bytes | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kube-list-page", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._data = self._fetch(self._token)
        except BaseException as error:  # handed to the caller by result()
            self._error = error

    def result(self) -> bytes:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._data is not None
        return self._data


# Whether the caller already holds a view of the object with this metadata
# (uid, resourceVersion): see `paged`.
Unchanged = Callable[[ObjectMetadata], bool]


def paged(
    fetch: Callable[[str | None], bytes],
    page: TypeAdapter[Any],
    unchanged: Unchanged | None = None,
) -> Iterator[dict[str, Any]]:
    """Every item of a LIST, one page at a time; `fetch(token)` gets one page's bytes.

    With `unchanged`, a page whose every item it accepts (an idle cycle's:
    the caller holds a view of each at that resourceVersion) is parsed for
    its items' metadata only, and they come as ``{"metadata": ...}``; any
    other page is parsed whole. An idle hot listing of 1,000 jobs then holds
    their uids and versions instead of 12 MiB of parsed objects at once.
    """
    raw = fetch(None)
    while True:
        # The quick pass: the list's metadata (its continue token), and with
        # `unchanged` each item's metadata too, in the same parse.
        # A metadata LIST's page is all metadata: the quick pass is the whole one.
        slim_page = unchanged is not None or page is METADATA_PAGE
        quick = (METADATA_PAGE if slim_page else METADATA_ONLY).validate_json(raw)
        token = (quick.get("metadata") or {}).get("continue")
        following = _Prefetch(fetch, token) if token else None
        items: list[dict[str, Any]] | None = None
        if page is METADATA_PAGE:
            items = quick.get("items") or []
        elif unchanged is not None:
            slim: list[dict[str, Any]] = quick.get("items") or []
            if all(unchanged(item.get("metadata") or ObjectMetadata()) for item in slim):
                items = slim
        del quick
        if items is None:
            items = page.validate_json(raw).get("items") or []
        del raw
        yield from items
        del items
        if following is None:
            return
        raw = following.result()
