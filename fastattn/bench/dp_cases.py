"""The ``train_dp`` case: data-parallel fit() over MPI on the "small" preset.

Each configuration is one ``mpiexec -n RANKS python -m fastattn.bench.dp_worker`` run with
OMP_NUM_THREADS=THREADS (fastattn.bench.dp_worker: a few timed fit() steps of 4096-token
global batches, dropout 0.1, label smoothing 0.1, AdamW, clipping). Two series, over RANKS
in 1, 2, 4, 8, ... up to the cores the benchmark may use (C, the run's thread count):

- the same cores split into ranks: RANKS x C / RANKS threads (on 2 cores: 1 x 2 against
  2 x 1): what MPI ranks cost or gain against OpenMP threads on one machine;
- scaling out: RANKS x 1 thread, with the efficiency against linear, tokens/s(N) /
  (N x tokens/s(1 x 1)).

Each configuration runs ROUNDS times, the configurations interleaved (a busy spell of a shared
machine then falls on all of them); the run of median tokens/s is reported, with the range.
Reported per configuration: target tokens/s, the median step, the median time a step spent
in its gradient all-reduce (waiting for the slowest rank included) and the all-reduce alone,
the flat gradient buffer's MiB and rank 0's peak resident memory. Skipped (n/a) without
mpi4py or mpiexec. The figures are what one machine measured, not a test.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from .base import Case
from .report import fmt_ms

__all__ = ["DP_CASES", "DP_TARGETS", "run_dp_case", "dp_configs"]

RANKS = (1, 2, 4, 8, 16, 32, 64)
ROUNDS = 3                     # runs of each configuration, interleaved
TIMEOUT = 900                  # seconds one configuration may take


def dp_configs(cores):
    """The configurations: the same cores split into ranks, then 1 thread per rank.

    Args:
        cores: the cores to use.

    Returns:
        [(ranks, threads)]."""
    counts = [n for n in RANKS if n <= cores]
    out = [(n, cores // n) for n in counts]
    return out + [(n, 1) for n in counts if (n, 1) not in out]


def _unavailable():
    """Why the case cannot run here, or None."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return 'mpi4py is not installed (pip install "fastattn[mpi]")'
    if shutil.which("mpiexec") is None:
        return "no mpiexec on PATH (pip install mpich, or the cluster's MPI)"
    return None


def _run_one(ranks, threads, steps):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = [shutil.which("mpiexec"), "-n", str(ranks), sys.executable, "-m",
           "fastattn.bench.dp_worker", "--steps", str(steps)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{ranks} x {threads}: exit status {done.returncode}: "
                           + " | ".join(tail))
    return json.loads(lines[-1])


def run_dp_case(case, row, steps=3):
    """Fill `row` (runner.empty_row) for train_dp: ``dp`` (one dict per configuration, as
    the worker prints it, plus ``efficiency`` for the 1-thread series), fastattn_times_ms (the
    median step of each configuration) and the notes.

    Args:
        case: the train_dp case.
        row: the row to fill (runner.empty_row).
        steps: timed training steps per configuration (default 3)."""
    why = _unavailable()
    if why is not None:
        row["fastattn_status"] = f"n/a: {why}"
        return row
    cores = row["threads"] or 1
    configs = dp_configs(cores)
    runs = {c: [] for c in configs}
    for _ in range(ROUNDS):              # interleaved: a busy spell of the machine is shared
        for ranks, threads in configs:
            runs[ranks, threads].append(_run_one(ranks, threads, steps))
    results = []
    for c in configs:                    # the run of median tokens/s, with the others' range
        rs = sorted(runs[c], key=lambda r: r["tokens_per_s"])
        r = dict(rs[len(rs) // 2])
        r["tokens_per_s_range"] = (rs[0]["tokens_per_s"], rs[-1]["tokens_per_s"])
        results.append(r)
    base = next((r for r in results if r["ranks"] == 1 and r["threads"] == 1), None)
    for r in results:
        if base is not None and r["threads"] == 1:
            r["efficiency"] = r["tokens_per_s"] / (r["ranks"] * base["tokens_per_s"])
    row["dp"] = results
    row["fastattn_times_ms"] = [r["step_ms"] for r in results]
    row["notes"].append(f"tokens/s by ranks x threads (median of {ROUNDS} interleaved runs, "
                        "range): " + ", ".join(
                            f"{r['ranks']}x{r['threads']} {fmt_ms(r['tokens_per_s'])} "
                            f"({fmt_ms(r['tokens_per_s_range'][0])}-"
                            f"{fmt_ms(r['tokens_per_s_range'][1])})"
                            + (f", {100 * r['efficiency']:.0f}% of linear"
                               if "efficiency" in r and r["ranks"] > 1 else "")
                            for r in results))
    row["notes"].append("gradient all-reduce per step, ms (alone / in the step, waiting "
                        "included): " + ", ".join(
                            f"{r['ranks']}x{r['threads']} {fmt_ms(r['allreduce_ms'])} / "
                            f"{fmt_ms(r['wait_ms'])}" for r in results if r["ranks"] > 1))
    first = results[0]
    row["notes"].append(f"flat gradient {first['grad_bytes'] / 2 ** 20:.0f} MiB, AdamW moments "
                        f"{first['moment_bytes'] / 2 ** 20:.0f} MiB per rank; peak RSS of rank "
                        "0: " + ", ".join(f"{r['ranks']}x{r['threads']} "
                                           f"{r['rss_mib']:.0f} MiB" for r in results))
    return row


def _same_cores_target(rows):
    r = next((r for r in rows if r["case"] == "train_dp"), None)
    if r is None or not r.get("dp"):
        return None, "not run" if r is None else r["fastattn_status"]
    one = next((x for x in r["dp"] if x["ranks"] == 1 and x["threads"] == r["threads"]), None)
    two = next((x for x in r["dp"] if x["ranks"] == 2 and
                x["threads"] == max(1, r["threads"] // 2)), None)
    if one is None or two is None:
        return None, "needs 2 cores or more"
    v = two["tokens_per_s"] / one["tokens_per_s"]
    return v, (f"2 x {two['threads']}: {fmt_ms(two['tokens_per_s'])} tokens/s, 1 x "
               f"{one['threads']}: {fmt_ms(one['tokens_per_s'])}")


def _case():
    return Case("train_dp", "data-parallel fit() over MPI, small preset d256 3+3 V4000, "
                "4096-token global batches: tokens/s by ranks x threads",
                lambda rng: {}, {"fastattn": lambda inputs: (lambda: None)}, kind="dp",
                slow=(), repeats={"fastattn": 1}, warm=False)


DP_CASES = (_case(),)
DP_TARGETS = (
    ("train_dp", "2 ranks reach >= 0.8x the tokens/s of 1 rank on the same cores",
     _same_cores_target, lambda v: v >= 0.8),
)
