"""``lmeval rerun``: a new job with a finished job's spec, linked back to it.

Why this module exists: a finished LMEvalJob is a record (the spec that ran,
its status, results ConfigMap and scores), so it is never run again in
place: editing its spec starts nothing (the admission policy refuses such an
edit, saying to rerun). Running it again is a new job. This module builds
that job from the original, purely: the same spec without the lifecycle
switches that ended it (``cancel``, ``suspend``), the original's labels
without those by which GitOps tools claim objects (a copy claimed by Argo CD
or Flux would be pruned as foreign to the repository), a name chosen by the
server (``generateName``) unless one is given, and annotations naming the
original (`RERUN_OF`, `RERUN_OF_UID`). The copy is created with the
requester's rights and judged by the admission policy like any new job.
"""

from __future__ import annotations

from typing import Any

from poller.cliapi import api

__all__ = ["DROPPED_SPEC_KEYS", "RERUN_OF", "RERUN_OF_UID", "rerun_body"]

RERUN_OF = f"{api.API_GROUP}/rerun-of"
RERUN_OF_UID = f"{api.API_GROUP}/rerun-of-uid"
# What ended the original, not what it evaluated.
DROPPED_SPEC_KEYS = frozenset({"cancel", "suspend"})
_GITOPS_LABELS = frozenset({"app.kubernetes.io/instance"})
_GITOPS_PREFIXES = (
    "argocd.argoproj.io/",
    "kustomize.toolkit.fluxcd.io/",
    "helm.toolkit.fluxcd.io/",
)
# generateName: the server appends 5 characters; a job name is a DNS
# subdomain, but its pod's name takes at most 56 of it, so the stem stays short.
_STEM_CHARS = 50


def _kept_label(key: str) -> bool:
    return key not in _GITOPS_LABELS and not key.startswith(_GITOPS_PREFIXES)


def rerun_body(job: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """The LMEvalJob to create to run `job` again (`name`, or a generated one)."""
    meta = job.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = {k: v for k, v in (job.get("spec") or {}).items() if k not in DROPPED_SPEC_KEYS}
    metadata: dict[str, Any] = {}
    if name:
        metadata["name"] = name
    else:
        # A rerun of a rerun is named after the first job, not name-suffix-suffix.
        stem = str(annotations.get(RERUN_OF) or meta.get("name") or "lmeval")
        metadata["generateName"] = stem[:_STEM_CHARS].rstrip("-.") + "-"
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if _kept_label(k)}
    if labels:
        metadata["labels"] = labels
    metadata["annotations"] = {
        RERUN_OF: str(meta.get("name") or ""),
        RERUN_OF_UID: str(meta.get("uid") or ""),
    }
    return {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.KIND,
        "metadata": metadata,
        "spec": spec,
    }
