"""Benchmark of per-item scores (a script, not a test): prints its figures.

Why this exists: every run with ``--log_samples`` now has its samples read
by the driver and its per-item scores sent through the pod log, whose room
is fixed (protocol.MAX_COMPRESSED_ITEMS_BYTES). How long the extraction
takes and how many items fit must be measured, not assumed. Figures:

1. a synthetic but realistic 10,000-document samples file (an arc_easy-like
   document with 4 choices, 4 loglikelihood requests and their answers,
   ``acc`` and ``acc_norm`` 0/1): its size, the extraction time, the encoded
   JSON size, the compressed size and the number of ``items`` markers;
2. the same with a non-binary metric (``f1``, any value in [0, 1]) instead
   of ``acc_norm``;
3. where the log's limit falls: the most documents of one 0/1 metric, and of
   one non-binary metric, whose items still fit.

Run from the repository root (seconds)::

    python tests/bench/bench_items.py [--docs 10000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from driver import protocol, samples  # noqa: E402
from driver.itemscores import (  # noqa: E402
    ItemScores,
    TaskItems,
    encode_item_scores,
    metric_items,
)

DATE = "2026-12-01T12-00-00.000000"
WORDS = [
    "the",
    "of",
    "a",
    "light",
    "energy",
    "plant",
    "water",
    "heat",
    "which",
    "cell",
    "earth",
    "sun",
    "moon",
    "rock",
]


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize()


def sample_line(rng: random.Random, doc_id: int, second: str) -> str:
    """One samples line as lm_eval 0.4 writes it for an arc_easy-like task."""
    question = sentence(rng, 18) + "?"
    choices = [sentence(rng, 4) for _ in range(4)]
    doc = {
        "id": f"Mercury_{rng.randrange(10**7)}",
        "question": question,
        "choices": {"text": choices, "label": ["A", "B", "C", "D"]},
        "answerKey": rng.choice("ABCD"),
    }
    prompt = f"Question: {question}\nAnswer:"
    answers = [[[f"{-rng.uniform(1, 30):.6f}", "False"]] for _ in choices]
    acc = 1.0 if rng.random() < 0.7 else 0.0
    second_value = (1.0 if rng.random() < 0.72 else 0.0) if second == "acc_norm" else rng.random()
    sample = {
        "doc_id": doc_id,
        "doc": doc,
        "target": "1",
        "arguments": {
            f"gen_args_{i}": {"arg_0": prompt, "arg_1": f" {c}"} for i, c in enumerate(choices)
        },
        "resps": answers,
        "filtered_resps": [a[0] for a in answers],
        "filter": "none",
        "metrics": ["acc", second],
        "doc_hash": hashlib.sha256(json.dumps(doc, indent=2).encode()).hexdigest(),
        "prompt_hash": hashlib.sha256(prompt.encode()).hexdigest(),
        "target_hash": hashlib.sha256(b"1").hexdigest(),
        "acc": acc,
        second: second_value,
    }
    return json.dumps(sample, ensure_ascii=False)


def measure(directory: Path, docs: int, second: str) -> None:
    rng = random.Random(7)
    path = directory / f"samples_arc_like_{DATE}.jsonl"
    with open(path, "w", encoding="utf-8") as out:
        for doc_id in range(docs):
            out.write(sample_line(rng, doc_id, second) + "\n")
    results = directory / f"results_{DATE}.json"
    results.write_text("{}", encoding="utf-8")
    start = time.perf_counter()
    scores = samples.extract_items(samples.samples_files(str(results)), {"models": "m"})
    extract_s = time.perf_counter() - start
    start = time.perf_counter()
    raw = encode_item_scores(scores)
    encode_s = time.perf_counter() - start
    compressed = len(zlib.compress(raw, 6))
    try:
        markers = len(protocol.encode_items(raw, "bench"))
    except ValueError as exc:
        markers = 0
        print(f"    not in the log: {exc}")
    kinds = {k: m.kind for k, m in scores.tasks["arc_like"].metrics.items()}
    print(f"  acc + {second} ({kinds}), {docs} documents:")
    print(f"    samples file        {path.stat().st_size / 1e6:8.2f} MB")
    print(f"    extraction          {extract_s * 1000:8.0f} ms ({docs / extract_s:,.0f} lines/s)")
    print(f"    encoding            {encode_s * 1000:8.1f} ms")
    print(f"    encoded JSON        {len(raw):8,d} bytes")
    print(f"    compressed (zlib 6) {compressed:8,d} bytes")
    print(f"    items markers       {markers:8d}")
    path.unlink()


def fits(n: int, binary: bool) -> bool:
    rng = random.Random(n)
    values = [float(rng.random() < 0.7) if binary else rng.random() for _ in range(n)]
    task = TaskItems(tuple(range(n)), "0" * 64, {"m,none": metric_items(values)})
    raw = encode_item_scores(ItemScores({"t": task}))
    try:
        protocol.encode_items(raw, "bench")
    except ValueError:
        return False
    return True


def largest(binary: bool) -> int:
    """The most documents of one metric whose items fit the log (to 1%)."""
    low, high = 1000, 4_000_000
    while high - low > low // 100:
        middle = (low + high) // 2
        if fits(middle, binary):
            low = middle
        else:
            high = middle
    return low


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=10_000)
    args = parser.parse_args()
    print(f"MAX_COMPRESSED_ITEMS_BYTES = {protocol.MAX_COMPRESSED_ITEMS_BYTES:,d}")
    with tempfile.TemporaryDirectory() as tmp:
        measure(Path(tmp), args.docs, "acc_norm")
        measure(Path(tmp), args.docs, "f1")
    start = time.perf_counter()
    binary, fixed = largest(True), largest(False)
    print(f"  the limit (one metric, random values; {time.perf_counter() - start:.1f} s):")
    print(f"    0/1 items that fit          {binary:10,d}")
    print(f"    fixed-point items that fit  {fixed:10,d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
