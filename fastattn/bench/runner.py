"""``run()``: validate each case's implementations against each other, then time them
interleaved, and return one row (a dict) per case.

The implementations of a case are timed interleaved (fastattn, numpy, torch, fastattn, ...), so
that machine noise hits all of them alike, and reported as medians. Each timed call waits until
the previous implementation's thread pools have gone idle (``timing.settle``) and follows ~20 ms
of untimed calls of its own implementation, so each is timed in its steady state (threads awake,
allocations reused) rather than just after another one; the slow float64 twin is timed without
them. A row is flagged when other processes used a noticeable share of the CPUs meanwhile.
Before timing, one call of each implementation is checked against the NumPy twin (validate,
then benchmark): outputs within MISMATCH_ATOL, or, for generation, the same token ids.
"""
import statistics

import numpy as np

from . import ct2_models, dp_cases, learning, pretrained_cases, timing
from .cases import CASES, DEFAULT_CASES, IMPLEMENTATIONS, Unavailable, decode_metrics
from .report import fmt_ms

__all__ = ["DEFAULT_REPEAT", "DEFAULT_NUMPY_REPEAT", "QUICK_REPEAT", "QUICK_NUMPY_REPEAT",
           "run", "decode_probes"]

DEFAULT_REPEAT = 20        # timed calls of fastattn and torch per case
DEFAULT_NUMPY_REPEAT = 3   # timed calls of the (slow, float64) NumPy twin per case
QUICK_REPEAT = 5           # a rough look (``fastattn bench --quick``, pytest-benchmark's model
QUICK_NUMPY_REPEAT = 1     # cases): timed calls of fastattn and torch, and of the NumPy twin
MISMATCH_ATOL = 1e-3       # max |fastattn - numpy twin| above which a row is flagged
NOISY_SHARE = 0.10         # share of the CPUs used by other processes above which a row is flagged


def _as_numpy(out):
    return out.numpy() if hasattr(out, "numpy") else np.asarray(out)


def _max_abs_diff(a, b):
    return float(np.max(np.abs(_as_numpy(a).astype(np.float64) - _as_numpy(b))))


def empty_row(case, threads):
    """A row with no measurement yet: every implementation "ok" (or "skipped" when the case
    has none), no times."""
    row = {"case": case.name, "title": case.title, "kind": case.kind, "threads": threads,
           "flops": case.flops, "notes": []}
    for impl in IMPLEMENTATIONS:
        row.update({f"{impl}_ms": None, f"{impl}_runs": 0, f"{impl}_times_ms": [],
                    f"{impl}_gflops": None,
                    f"{impl}_status": "ok" if impl in case.implementations else "skipped"})
    return row


def _callables(case, row):
    fns = {}
    for impl in case.implementations:
        try:
            fns[impl] = case.callable(impl)
        except Unavailable as exc:
            row[f"{impl}_status"] = f"n/a: {exc}"
    return fns


def finish_row(case, row):
    """Medians, GFLOP/s, speedups, GB/s and tokens/s from the row's <impl>_times_ms."""
    for impl in IMPLEMENTATIONS:
        ms = row[f"{impl}_times_ms"]
        if ms:
            row[f"{impl}_ms"] = statistics.median(ms)
            row[f"{impl}_runs"] = len(ms)
            if case.flops:
                row[f"{impl}_gflops"] = case.flops / (row[f"{impl}_ms"] * 1e6)
    fast = row["fastattn_ms"]
    for other in ("torch", "numpy", "ctranslate2"):
        ms = row[f"{other}_ms"]
        row[f"speedup_vs_{other}"] = ms / fast if ms and fast else None
    if row.get("float32_torch_ms") and fast:
        row["speedup_vs_float32_torch"] = row["float32_torch_ms"] / fast
    if case.nbytes and fast:
        row["fastattn_gbps"] = case.nbytes / (fast * 1e6)
        row["notes"].append(f"{row['fastattn_gbps']:.1f} GB/s")
    if case.tokens:
        # tokens per call: each implementation's own count where the case counts them on the
        # outputs (count_tokens: rows that end at an end token), else case.tokens
        rates = {impl: row.get(f"{impl}_tokens", case.tokens) / (row[f"{impl}_ms"] / 1e3)
                 for impl in ("fastattn", "torch", "numpy", "ctranslate2")  # table order
                 if row[f"{impl}_ms"]}
        for impl, v in rates.items():
            row[f"{impl}_tokens_per_s"] = v
        for impl in ("fastattn", "torch"):   # the float32 runs of a mixed-precision case
            ms = row.get(f"float32_{impl}_ms")
            if ms:
                row[f"float32_{impl}_tokens_per_s"] = rates[f"float32 {impl}"] = \
                    case.tokens / (ms / 1e3)
        if rates:
            row["notes"].insert(0, "tokens/s: " + ", ".join(
                f"{impl} {fmt_ms(v)}" for impl, v in rates.items()))
        if getattr(case, "count_tokens", None) is not None and \
                "fastattn" in rates and "ctranslate2" in rates:
            # the calls' token counts may differ: the ratio of the rates, not of the times
            v = row["tokens_per_s_ratio_vs_ctranslate2"] = \
                rates["fastattn"] / rates["ctranslate2"]
            row["notes"].insert(1, f"tokens/s fastattn / ctranslate2 {v:.2f}x (tokens per "
                                   "call: " + ", ".join(
                                       f"{i} {row[f'{i}_tokens']}" for i in
                                       ("fastattn", "ctranslate2")) + ")")
    return row


def _counts(case, impls, repeat, numpy_repeat):
    """Timed calls per implementation: the run's counts, capped by case.repeats."""
    counts = {impl: numpy_repeat if impl in case.slow else repeat for impl in impls}
    return {impl: min(n, case.repeats.get(impl, n)) for impl, n in counts.items()}


def _check_calls(case, fns):
    """One call of each implementation, its output kept for validation; the calls of the
    implementations in case.timed_first are timed (timing.timed_call), in seconds."""
    outs, first = {}, {}
    for impl, fn in fns.items():
        if impl in case.timed_first:
            outs[impl], first[impl] = timing.timed_call(fn)
        else:
            outs[impl] = fn()
    return outs, first


def _compare_tokens(row, outs, exact=None, agreement=False):
    """Generation cases: token ids must agree exactly with the reference backend's (numpy),
    or with fastattn's where the reference backend does not run; implementations outside
    `exact` (None: all) compute another function, and their differing rows are noted only
    (agreement=True: as row["agreement"], {impl: share of the rows equal to the
    reference's}, and a note)."""
    ref = "numpy" if "numpy" in outs else "fastattn"
    want = np.asarray(outs[ref])
    differ = {}
    for impl, out in outs.items():
        if impl == ref:
            continue
        got = _as_numpy(out)
        differ[impl] = (len(want) if got.shape != want.shape
                        else int((got != want).any(axis=1).sum()))
    row["rows_differ"], row["rows_compared_with"] = differ, ref
    bad = {i: n for i, n in differ.items() if n and (exact is None or i in exact)}
    if bad:
        row["notes"].append(f"MISMATCH: tokens differ from {ref}'s in " + ", ".join(
            f"{i} {n} of {len(want)} rows" for i, n in bad.items()))
    other = {i: n for i, n in differ.items() if exact is not None and i not in exact}
    if other and agreement:
        row["agreement"] = {i: 1 - n / len(want) for i, n in other.items()}
        row["notes"].append(f"rows equal to {ref}'s (agreement, not required): " + ", ".join(
            f"{i} {len(want) - n} of {len(want)}" for i, n in other.items()))
    elif other:
        row["notes"].append(f"tokens differing from {ref}'s (another quantization or "
                            "rounding, not required to match): " + ", ".join(
                                f"{i} {n} of {len(want)} rows" for i, n in other.items()))


def _run_time_case(case, threads, repeat, numpy_repeat):
    row = empty_row(case, threads)
    fns = _callables(case, row)
    if not fns:                    # nothing runs here (each status says why): an empty row
        finish_row(case, row)
        return row
    outs, first = _check_calls(case, fns)  # warm-up call, kept for validation
    if not getattr(case, "check", True):
        pass                                    # outputs not comparable (training steps)
    elif case.tokens:
        _compare_tokens(row, outs, case.exact, getattr(case, "agreement", False))
    counter = getattr(case, "count_tokens", None)
    if counter is not None:                     # tokens per call, from the checking call
        for impl, out in outs.items():
            row[f"{impl}_tokens"] = counter(out)
    elif "numpy" in outs and case.name != "sgemm":
        row["max_abs_diff_vs_numpy"] = diffs = {
            impl: _max_abs_diff(out, outs["numpy"]) for impl, out in outs.items()
            if impl != "numpy"}
        # a case whose other implementations compute another function (torch's bf16 output)
        # names the ones the twin checks; the others' differences are kept, not flagged
        checked = getattr(case, "check_impls", None)
        atol = getattr(case, "mismatch_atol", MISMATCH_ATOL)
        bad = {i: d for i, d in diffs.items()
               if not d <= atol and (checked is None or i in checked)}
        if bad:
            row["notes"].append("MISMATCH vs numpy twin: " + ", ".join(
                f"{i} max|diff| {d:.2g}" for i, d in bad.items()))
    del outs
    counts = _counts(case, fns, repeat, numpy_repeat)
    left = {impl: n - (impl in first) for impl, n in counts.items()}
    warm = {impl: 0 if impl in case.slow or not case.warm else timing.WARM_SECONDS
            for impl in fns}
    timed = {i: fn for i, fn in fns.items() if left[i] > 0}
    timed_counts = {i: n for i, n in left.items() if n > 0}
    if case.float32_impl is not None and "fastattn" in timed:
        # the float32 model (quantized cases), interleaved with the implementations
        timed["float32"] = case.float32_impl(case.inputs())
        timed_counts["float32"], warm["float32"] = timed_counts["fastattn"], warm["fastattn"]
        timed["float32"]()                                       # weights packed, warm
    if case.float32_torch_impl is not None and "torch" in timed:
        # torch in float32 (mixed-precision cases, whose torch column is autocast bf16)
        timed["float32_torch"] = case.float32_torch_impl(case.inputs())
        timed_counts["float32_torch"] = timed_counts["torch"]
        warm["float32_torch"] = warm["torch"]
        timed["float32_torch"]()                                 # warm
    copy = None
    if getattr(case, "copy_probe", False) and "fastattn" in fns:
        # a memory copy on as many threads, timed interleaved with the implementations
        copy, copy_bytes = timing.memory_copy(threads=threads)
        copy()                                                   # pages touched
        timed["copy"], timed_counts["copy"] = copy, counts["fastattn"]
        warm["copy"] = timing.WARM_SECONDS
    try:
        times = timing.time_interleaved(timed, timed_counts, warm)
    finally:
        if copy is not None:
            copy.close()
    if copy is not None:
        _copy_metrics(row, times.pop("copy"), copy_bytes)
    if "float32" in times:
        f32 = times.pop("float32")
        row["float32_fastattn_ms"] = statistics.median(f32) * 1e3
        row["float32_times_ms"] = [t * 1e3 for t in f32]
        row["float32_ratio"] = paired_ratio(f32, times["fastattn"])
        row["notes"].append(f"float32 {fmt_ms(row['float32_fastattn_ms'])} ms (interleaved)")
    if "float32_torch" in times:
        f32 = times.pop("float32_torch")
        row["float32_torch_ms"] = statistics.median(f32) * 1e3
        row["float32_torch_times_ms"] = [t * 1e3 for t in f32]
        row["float32_torch_ratio"] = paired_ratio(f32, times["torch"])
        row["notes"].append(f"torch float32 {fmt_ms(row['float32_torch_ms'])} ms "
                            "(interleaved)")
    for impl in fns:
        ts = ([first[impl]] if impl in first else []) + times.get(impl, [])
        row[f"{impl}_times_ms"] = [t * 1e3 for t in ts]
    if case.tokens:
        row["notes"].append("runs: " + ", ".join(
            f"{impl} {len(row[f'{impl}_times_ms'])}"
            for impl in ("fastattn", "torch", "numpy", "ctranslate2") if impl in fns)
            + (f" (numpy = {case.numpy_label})" if "numpy" in fns else ""))
    elif "numpy" in fns and "numpy" in case.slow:
        n = counts["numpy"]
        row["notes"].append(f"numpy twin is float64: {n} run{'s' if n > 1 else ''}")
    if case.name == "sgemm":
        finish_row(case, row)
        row["notes"].append(f"np.matmul {row['numpy_gflops']:.0f} GFLOP/s (FFN roofline)")
        return row
    finish_row(case, row)
    if row.get("copy_gbps") and row.get("fastattn_gbps"):
        row["share_of_copy"] = row["fastattn_gbps"] / row["copy_gbps"]
        row["notes"].append(f"{100 * row['share_of_copy']:.0f}% of a {threads}-thread memory "
                            f"copy ({row['copy_gbps']:.1f} GB/s, {row['copy_runs']} runs)")
    return row


def _copy_metrics(row, seconds, copy_bytes):
    """The memory copy's median time and bandwidth, for a case measured against it."""
    ms = statistics.median(seconds) * 1e3
    row.update(copy_ms=ms, copy_gbps=copy_bytes / (ms * 1e6), copy_runs=len(seconds))


def decode_probes(case, threads=None, rounds=5):
    """The decode case's other timings: (prefill ms, memory copy ms, bytes one copy moves),
    medians of `rounds` interleaved calls.

    Args:
        case: the `DecodeCase`.
        threads: the threads (None, the default: fastattn's thread count).
        rounds: interleaved calls of each (default 5).

    Returns:
        `(prefill ms, memory copy ms, bytes one copy moves)`."""
    times, copy_bytes = _decode_times(case, threads, {"prefill": rounds, "copy": rounds})
    return (statistics.median(times["prefill"]) * 1e3, statistics.median(times["copy"]) * 1e3,
            copy_bytes)


def paired_ratio(slow, fast):
    """Median over i of slow[i] / fast[i]: two implementations' times taken one right after
    the other in each round (time_interleaved), so a machine that changes speed between rounds
    moves both of a pair alike; steadier than the ratio of the two medians."""
    return statistics.median(s / f for s, f in zip(slow, fast))


def _decode_times(case, threads, counts, twin=None):
    """Seconds per call of the decode case's generate, prefill and memory copy, and of the
    float32 twin case's generate and prefill ("generate_fp32", "prefill_fp32"), those named
    in counts, interleaved (the two generates one right after the other in each round);
    returns (times, bytes one copy moves)."""
    copy, copy_bytes = timing.memory_copy(threads=threads)
    fns = {"generate": case.callable("fastattn")}
    if twin is not None:
        fns.update(generate_fp32=twin.callable("fastattn"), prefill_fp32=twin.prefill())
    fns.update(prefill=case.prefill(), copy=copy)
    fns = {name: fn for name, fn in fns.items() if name in counts}
    try:
        for fn in fns.values():
            fn()                                   # weights packed, pages touched
        warm = {"prefill": timing.WARM_SECONDS, "copy": timing.WARM_SECONDS,
                "prefill_fp32": timing.WARM_SECONDS}
        return timing.time_interleaved(fns, counts, warm), copy_bytes
    finally:
        copy.close()


def _run_decode_case(case, threads, repeat):
    row = empty_row(case, threads)
    n = min(repeat, case.repeats.get("fastattn", repeat))
    counts = {"generate": n, "prefill": n, "copy": n}
    twin = case.float32_twin()
    if twin is not None:
        counts.update(generate_fp32=n, prefill_fp32=n)
    times, copy_bytes = _decode_times(case, threads, counts, twin)
    med = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
    steps = case.steps
    if "generate_fp32" in med:              # the float32 step, timed between this case's calls
        row["float32_step_ms"] = (med["generate_fp32"] - med["prefill_fp32"]) / steps
        row["float32_ratio"] = paired_ratio(
            [t * 1e3 - med["prefill_fp32"] for t in times["generate_fp32"]],
            [t * 1e3 - med["prefill"] for t in times["generate"]])
        row["notes"].append(f"float32 step {row['float32_step_ms']:.2f} ms (interleaved)")
    m = decode_metrics(med["generate"], med["prefill"], med["copy"], case.weight_bytes(),
                       copy_bytes, steps)
    row["fastattn_times_ms"] = [(t * 1e3 - med["prefill"]) / steps for t in times["generate"]]
    row.update(m, generate_ms=med["generate"], prefill_ms=med["prefill"], copy_ms=med["copy"],
               copy_threads=threads)
    finish_row(case, row)
    row["notes"].append(
        f"{m['weight_mb']:.0f} MB of weights per step: {m['weight_gbps']:.1f} GB/s = "
        f"{100 * m['share_of_copy']:.0f}% of a {threads}-thread memory copy "
        f"({m['copy_gbps']:.1f} GB/s); generate {med['generate']:.0f} ms = encoder + cross K/V "
        f"{med['prefill']:.1f} ms + {steps} steps; {n} runs")
    return row


def _run_memory_case(case, threads):
    row = empty_row(case, threads)
    fns = _callables(case, row)
    outs, method = {}, None
    for impl, fn in fns.items():
        outs[impl], mib, seconds, method = timing.peak_memory_growth(fn)
        row[f"{impl}_times_ms"] = [seconds * 1e3]
        row[f"{impl}_peak_mib"] = mib
    matrix_mib = getattr(case, "matrix_mib", None)
    if len(outs) > 1 and getattr(case, "check", True):
        row["max_abs_diff_fastattn_vs_torch"] = _max_abs_diff(outs["fastattn"], outs["torch"])
    out = outs.get("fastattn")
    row["output_mib"] = out.nbytes / 2 ** 20 if hasattr(out, "nbytes") else None
    row["matrix_mib"] = matrix_mib
    row["memory_method"] = method
    del outs
    finish_row(case, row)
    growth = ", ".join(f"{impl} {row[f'{impl}_peak_mib']:.0f} MiB" for impl in fns)
    if matrix_mib is None:
        row["notes"].append(f"peak RSS growth of one call: {growth}")
        return row
    row["notes"].append(f"peak RSS growth of one call: {growth} (output "
                        f"{row['output_mib']:.0f} MiB included); one L x L float32 matrix "
                        f"= {matrix_mib:.0f} MiB; numpy twin skipped")
    return row


def select(cases):
    """Case names (None: DEFAULT_CASES; a str: one name) -> the Case objects, in order, each
    once; ValueError naming unknown ones."""
    if cases is None:
        return [CASES[n] for n in DEFAULT_CASES]
    if isinstance(cases, str):
        cases = [cases]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise ValueError(f"unknown case(s) {', '.join(map(repr, unknown))}; "
                         f"known: {', '.join(CASES)}")
    return [CASES[n] for n in dict.fromkeys(cases)]


def run(cases=None, repeat=DEFAULT_REPEAT, threads=None, *, numpy_repeat=DEFAULT_NUMPY_REPEAT,
        progress=None):
    """Benchmark `cases` (names; None = DEFAULT_CASES) and return one dict per case.

    Args:
        cases: case names; None (the default) for DEFAULT_CASES.
        repeat: timed calls of fastattn and torch per case (medians are reported; default 20).
        threads: threads for fastattn, torch and NumPy's BLAS during the run (None, the
            default: fastattn's current count); every count is restored afterwards.
        numpy_repeat: timed calls of the float64 NumPy twin (slow), at most `repeat`
            (default 3).
        progress: an optional callable(str), told which case is starting.

    Returns:
        One row (a dict) per case, with the keys below.

    Row keys: case, title, kind, threads, flops, notes, and per implementation (fastattn, numpy,
    torch, ctranslate2) <impl>_ms (median), <impl>_runs, <impl>_times_ms, <impl>_gflops,
    <impl>_status ("ok", "skipped" or "n/a: why"); speedup_vs_torch, speedup_vs_numpy,
    speedup_vs_ctranslate2 (= their ms / fastattn ms); max_abs_diff_vs_numpy; others_cpu (share
    of the CPUs other processes used meanwhile, Linux); memory case: <impl>_peak_mib,
    output_mib, matrix_mib; generation cases: <impl>_tokens_per_s, rows_differ ({impl: rows
    whose tokens differ from those of rows_compared_with}); generation cases counting their
    tokens (count_tokens: the pretrained cases): <impl>_tokens (per call),
    tokens_per_s_ratio_vs_ctranslate2, and with agreement: agreement ({impl: share of rows equal
    to fastattn's}); the step breakdown (kind "breakdown", pretrained_cases): breakdown,
    copy_gbps; decode case: step_ms (also its fastattn_ms), weight_mb, weight_gbps, copy_gbps,
    share_of_copy, generate_ms, prefill_ms, copy_ms, copy_threads; a case with float32_impl:
    float32_fastattn_ms, float32_times_ms, float32_ratio (paired, float32 over fastattn); with
    float32_torch_impl: float32_torch_ms, float32_torch_times_ms, float32_torch_ratio (paired,
    over torch), speedup_vs_float32_torch; either with tokens: float32_<impl>_tokens_per_s; a
    case with copy_probe (adamw): copy_ms, copy_gbps, copy_runs and share_of_copy (fastattn GB/s
    over a memory copy's, timed interleaved with the implementations).
    """
    selected = select(cases)
    if repeat < 1 or numpy_repeat < 1:
        raise ValueError("repeat and numpy_repeat must be >= 1")
    numpy_repeat = min(numpy_repeat, repeat)
    rows = []
    with timing.same_threads(threads) as count:
        for case in selected:
            if progress is not None:
                progress(case.name)
            before = timing.machine_cpu()
            try:
                if case.kind == "memory":
                    row = _run_memory_case(case, count)
                elif case.kind == "decode":
                    row = _run_decode_case(case, count, repeat)
                elif case.kind == "dp":
                    row = finish_row(case, dp_cases.run_dp_case(case, empty_row(case, count)))
                elif case.kind == "breakdown":
                    row = finish_row(case, pretrained_cases.run_step_breakdown(
                        case, empty_row(case, count)))
                elif case.kind == "learning":
                    row = finish_row(case, learning.run_learning_case(case,
                                                                       empty_row(case, count)))
                else:
                    row = _run_time_case(case, count, repeat, numpy_repeat)
            finally:
                ct2_models.release_translators()   # their OpenMP teams slow fastattn's
            row["others_cpu"] = share = timing.others_share(before, timing.machine_cpu())
            if share is not None and share >= NOISY_SHARE:
                row["notes"].append(f"noisy: other processes used {100 * share:.0f}% of the "
                                    "CPUs")
            rows.append(row)
    return rows
