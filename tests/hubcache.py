"""A small Hugging Face hub cache made by the tests, laid out as huggingface_hub lays it out.

``snapshot_download(repo_id="allenai/ai2_arc", repo_type="dataset")`` leaves
``<hub>/datasets--allenai--ai2_arc/`` with ``refs/main`` (the commit),
``blobs/<etag>`` (the files' contents: the SHA-256 of an LFS file such as a
parquet file, the git blob SHA-1 of a small text file such as README.md) and
``snapshots/<commit>/<path>`` symlinks into ``../../blobs`` (relative, one
``..`` more per directory level). This module writes the same tree for the
ARC-Easy configuration of ``allenai/ai2_arc``, the dataset of lm_eval's
``arc_easy`` task, from a few rows written here with pyarrow: the Hub's
own dataset card (its ``configs:`` and ``dataset_info:`` for ARC-Easy) and one
parquet file per split, named as on the Hub. Nothing is fetched.
`static_claim_manifests` puts such a cache behind a claim, the way a cluster
administrator pre-provisions storage (the local runner's and the real node's
tests alike).
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

__all__ = [
    "ARC_COMMIT",
    "ARC_REPO",
    "ARC_ROWS",
    "static_claim_manifests",
    "tree_state",
    "write_arc_easy",
]

ARC_REPO = "datasets--allenai--ai2_arc"
ARC_COMMIT = "210d026faf9955653af8916fad021475a3f00453"

_CARD = """---
annotations_creators:
- found
language:
- en
license: cc-by-sa-4.0
task_categories:
- question-answering
pretty_name: Ai2Arc
dataset_info:
- config_name: ARC-Easy
  features:
  - name: id
    dtype: string
  - name: question
    dtype: string
  - name: choices
    sequence:
    - name: text
      dtype: string
    - name: label
      dtype: string
  - name: answerKey
    dtype: string
configs:
- config_name: ARC-Easy
  data_files:
  - split: train
    path: ARC-Easy/train-*
  - split: test
    path: ARC-Easy/test-*
  - split: validation
    path: ARC-Easy/validation-*
---

# Dataset Card for "ai2_arc" (a few rows written by the project's tests)
"""

# (id, question, choice texts, choice labels, answerKey) per split.
ARC_ROWS: dict[str, list[tuple[str, str, list[str], list[str], str]]] = {
    "train": [
        ("train-1", "Which of these is a liquid?", ["rock", "water", "wood"], ["A", "B", "C"], "B"),
    ],
    "validation": [
        ("val-1", "What gives off light?", ["the Sun", "a stone"], ["A", "B"], "A"),
    ],
    "test": [
        ("test-1", "What color is a clear sky?", ["blue", "green"], ["A", "B"], "A"),
        ("test-2", "How many legs has a cat?", ["two", "four", "six"], ["1", "2", "3"], "2"),
        ("test-3", "Which melts in the sun?", ["ice", "iron", "glass"], ["A", "B", "C"], "A"),
    ],
}


def _parquet(split: str) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = ARC_ROWS[split]
    table = pa.table(
        {
            "id": [r[0] for r in rows],
            "question": [r[1] for r in rows],
            "choices": [{"text": r[2], "label": r[3]} for r in rows],
            "answerKey": [r[4] for r in rows],
        }
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def _put(repo: Path, path: str, data: bytes, lfs: bool) -> None:
    if lfs:
        etag = hashlib.sha256(data).hexdigest()
    else:
        etag = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git blob id
    blob = repo / "blobs" / etag
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    link = repo / "snapshots" / ARC_COMMIT / path
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))


def write_arc_easy(hub: Path) -> Path:
    """Write allenai/ai2_arc (ARC-Easy) into hub cache `hub`; return the repository's folder."""
    repo = hub / ARC_REPO
    _put(repo, "README.md", _CARD.encode(), lfs=False)
    for split in ARC_ROWS:
        _put(repo, f"ARC-Easy/{split}-00000-of-00001.parquet", _parquet(split), lfs=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(ARC_COMMIT)
    return repo


def tree_state(root: Path) -> dict[str, tuple[str, int, float]]:
    """Every entry under `root` (kind, size, mtime), to show that nothing wrote there."""
    state: dict[str, tuple[str, int, float]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file"
        state[str(path.relative_to(root))] = (kind, info.st_size, info.st_mtime)
    return state


def static_claim_manifests(namespace: str, name: str, path: Path) -> list[dict[str, Any]]:
    """A hostPath PV at `path`, pre-bound to claim `namespace/name`, and the claim
    (ReadOnlyMany, no storage class: the controller-manager's binder binds them)."""
    volume = f"{namespace}-{name}"
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadOnlyMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(path), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": name},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ]
