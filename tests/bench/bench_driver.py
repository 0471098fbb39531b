"""Benchmarks of the in-pod driver (a script, not a test): prints its figures.

Why this exists: the driver sits between lm_eval and the pod log for every
evaluation, so its cost must be known rather than assumed. Three figures:

1. start-up: ``python -m driver -- python -c pass`` against ``python -c pass``;
2. overhead on a real (tiny, offline, ``--model dummy``) lm_eval run, as
   paired runs in alternating order, with the per-pair ratio;
3. forwarding throughput in MB/s for a synthetic child that prints N MB,
   half plain lines on stdout and half tqdm-style ``\\r`` redraws on stderr,
   against the same child writing straight to /dev/null.

Run from the repository root::

    python tests/bench/bench_driver.py [--pairs 3] [--mb 100] [--startup 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

TASK_YAML = """\
task: bench_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""

# Writes about N MB: 100-byte lines on stdout, 100-byte "\r" redraws on stderr.
FLOOD_CHILD = r"""
import os, sys
mb = int(sys.argv[1])
line = b"x" * 99 + b"\n"
bar = b"Requesting API:  42%|####      | 420/1000 [00:04<00:06, 97.00it/s]".ljust(99) + b"\r"
out_block, err_block = line * 655, bar * 655   # ~64 KiB each
blocks = mb * 1024 * 1024 // (2 * len(out_block))
for _ in range(blocks):
    os.write(1, out_block)
    os.write(2, err_block)
"""


def env_for(hf_home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        HF_HOME=str(hf_home),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
    )
    return env


def timed(argv: Sequence[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed ({proc.returncode}): {' '.join(argv)}")
    return elapsed


def driver(root: Path, *child: str) -> list[str]:
    return [sys.executable, "-m", "driver", "--output-root", str(root), "--", *child]


def _child_start_delay(argv: Sequence[str], env: dict[str, str]) -> tuple[float, float]:
    """(seconds until the child's first statement ran, total wall time)."""
    launched = time.time()
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    total = time.perf_counter() - start
    stamp = next(line for line in proc.stdout.splitlines() if line.startswith("T="))
    return float(stamp[2:]) - launched, total


def bench_startup(work: Path, env: dict[str, str], runs: int) -> None:
    bare = [sys.executable, "-c", "import time; print(f'T={time.time()!r}', flush=True)"]
    # The child writes no results, so the driver exits 70: only timing matters.
    wrapped = driver(work / "startup", *bare)
    plain, through = [], []
    for _ in range(runs):
        plain.append(_child_start_delay(bare, env))
        through.append(_child_start_delay(wrapped, env))
    p_start = statistics.median(x[0] for x in plain)
    t_start = statistics.median(x[0] for x in through)
    p_total = statistics.median(x[1] for x in plain)
    t_total = statistics.median(x[1] for x in through)
    print(
        f"start-up (median of {runs}): the child's first statement runs "
        f"{(t_start - p_start) * 1000:.0f} ms later through the driver "
        f"({p_start * 1000:.0f} ms -> {t_start * 1000:.0f} ms after launch); "
        f"a no-op child's total wall time {p_total * 1000:.0f} ms -> {t_total * 1000:.0f} ms"
    )


def bench_lmeval(work: Path, env: dict[str, str], pairs: int) -> None:
    data = work / "data.jsonl"
    rows = [
        {"question": f"{i}+{i}?", "choices": [str(2 * i), str(i)], "answer": 0} for i in range(20)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "bench_mc.yaml").write_text(TASK_YAML.format(data=data))
    base = [
        "--model",
        "dummy",
        "--model_args",
        "pretrained=dummy",
        "--tasks",
        "bench_mc",
        "--include_path",
        str(work),
    ]
    lm_eval = [sys.executable, "-m", "lm_eval", *base]
    timed([*lm_eval, "--output_path", str(work / "warm")], env)  # warm the datasets cache
    ratios, alone_all, wrapped_all = [], [], []
    for i in range(pairs):
        order = ["alone", "driver"] if i % 2 == 0 else ["driver", "alone"]
        got: dict[str, float] = {}
        for which in order:
            if which == "alone":
                got[which] = timed([*lm_eval, "--output_path", str(work / f"alone-{i}")], env)
            else:
                got[which] = timed(driver(work / f"driven-{i}", *lm_eval), env)
        ratios.append(got["driver"] / got["alone"])
        alone_all.append(got["alone"])
        wrapped_all.append(got["driver"])
        print(
            f"  pair {i + 1} ({' then '.join(order)}): lm_eval alone {got['alone']:.2f} s, "
            f"driver+lm_eval {got['driver']:.2f} s, ratio {ratios[-1]:.3f}"
        )
    print(
        f"lm_eval dummy run: alone median {statistics.median(alone_all):.2f} s, "
        f"driver+lm_eval median {statistics.median(wrapped_all):.2f} s, "
        f"ratio median {statistics.median(ratios):.3f} "
        f"(min {min(ratios):.3f}, max {max(ratios):.3f})"
    )


def bench_throughput(work: Path, env: dict[str, str], mb: int) -> None:
    child = [sys.executable, "-c", FLOOD_CHILD, str(mb)]
    alone = timed(child, env)
    start = time.perf_counter()
    proc = subprocess.run(
        driver(work / "flood", *child),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    through = time.perf_counter() - start
    if proc.returncode != 70:  # the flood child writes no results file
        raise SystemExit(f"unexpected driver exit {proc.returncode}")
    print(
        f"forwarding {mb} MB (half stdout lines, half \\r redraws on stderr): "
        f"child alone {alone:.2f} s ({mb / alone:.0f} MB/s), "
        f"through the driver {through:.2f} s ({mb / through:.0f} MB/s)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=3, help="paired lm_eval runs (default 3)")
    parser.add_argument(
        "--mb", type=int, default=100, help="MB for the throughput run (default 100)"
    )
    parser.add_argument("--startup", type=int, default=10, help="start-up samples (default 10)")
    args = parser.parse_args()
    print(
        f"python {sys.version.split()[0]} on {os.cpu_count()} CPUs; load average "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    with tempfile.TemporaryDirectory(prefix="lmeval-bench-") as tmp:
        work = Path(tmp)
        env = env_for(work / "hf")
        bench_startup(work, env, args.startup)
        bench_throughput(work, env, args.mb)
        if args.pairs > 0:
            bench_lmeval(work, env, args.pairs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
