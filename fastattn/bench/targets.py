"""The performance targets, checked on the rows of one ``run()``.

TARGETS holds (case, target text, measure(rows) -> (value or None, detail), passes(value));
``check_targets(rows)`` gives PASS, MISS, or SKIP where the case (or a case it needs, as the FFN
needs sgemm) was not run.
"""
from .report import fmt_ms

__all__ = ["TARGETS", "check_targets", "format_targets"]


def _row(rows, name):
    return next((r for r in rows if r["case"] == name), None)


def _speedup_target(case, other, threshold, field="ms", unit="ms", label=None):
    """fastattn at least `threshold` times faster than `other` (times in ms, or tokens/s);
    label: what the text calls `other`'s column (the mixed-precision cases' "torch autocast
    bf16"), `other` by default."""
    label = label or other

    def measure(rows):
        r = _row(rows, case)
        if r is None:
            return None, "not run"
        v = r.get(f"speedup_vs_{other}")
        if v is None:
            return None, f"{label} not measured ({r[f'{other}_status']})"
        return v, f"{v:.2f}x {label} (fastattn {fmt_ms(r[f'fastattn_{field}'])} {unit}, " \
                  f"{label} {fmt_ms(r[f'{other}_{field}'])} {unit})"
    text = f"speedup vs {label} >= {threshold}x" if field == "ms" else \
        f"{unit} >= {threshold}x {label}"
    return (case, text, measure, lambda v: v >= threshold)


def _train_memory_target(case, label="torch"):
    """The peak memory growth of fastattn's training step over torch's (label: what the
    detail calls torch's column)."""
    def measure(rows):
        r = _row(rows, case)
        if r is None:
            return None, "not run"
        if r.get("torch_peak_mib") is None:
            return None, f"{label} not measured ({r['torch_status']})"
        ours, theirs = r["fastattn_peak_mib"], r["torch_peak_mib"]
        return ours / max(theirs, 1e-9), f"fastattn {ours:.0f} MiB, {label} {theirs:.0f} MiB"
    return measure


def _memory_target(rows):
    r = _row(rows, "attention_memory")
    if r is None:
        return None, "not run"
    v = r.get("fastattn_peak_mib")
    return v, f"peak RSS growth {v:.1f} MiB (one L x L float32 matrix: {r['matrix_mib']:.0f} MiB)"


def _backward_memory_target(rows):
    r = _row(rows, "attention_backward_memory")
    if r is None:
        return None, "not run"
    v = r.get("fastattn_peak_mib")
    return v, f"peak RSS growth {v:.1f} MiB (out, lse, dq, dk, dv: 64 MiB; one L x L float32 " \
              f"matrix: {r['matrix_mib']:.0f} MiB)"


def _sgemm_share(case):
    """fastattn's GFLOP/s in `case` as a share of the sgemm roofline measured in the same run."""
    def measure(rows):
        f, s = _row(rows, case), _row(rows, "sgemm")
        if f is None:
            return None, "not run"
        if s is None or not s.get("numpy_gflops"):
            return None, "needs the sgemm case in the same run"
        v = f["fastattn_gflops"] / s["numpy_gflops"]
        detail = f"{100 * v:.1f}% of sgemm ({f['fastattn_gflops']:.0f} vs " \
                 f"{s['numpy_gflops']:.0f} GFLOP/s"
        if f.get("torch_gflops"):
            detail += f"; torch {f['torch_gflops']:.0f}"
        return v, detail + ")"
    return measure


_ffn_target = _sgemm_share("ffn")


def _bandwidth_vs_torch(case, threshold):
    """A memory-bound case: speedup vs torch, with both sides' GB/s (bytes the op must move)."""
    def measure(rows):
        r = _row(rows, case)
        if r is None:
            return None, "not run"
        v = r.get("speedup_vs_torch")
        if v is None:
            return None, f"torch not measured ({r['torch_status']})"
        gbps = r.get("fastattn_gbps") or 0.0
        return v, f"{v:.2f}x torch (fastattn {gbps:.1f} GB/s, torch {gbps / v:.1f} GB/s)"
    return (case, f"speedup vs torch >= {threshold}x", measure, lambda v: v >= threshold)


def _decode_target(rows):
    r = _row(rows, "decode_step")
    if r is None:
        return None, "not run"
    v = r.get("share_of_copy")
    if v is None:
        return None, "not measured"
    return v, f"{100 * v:.0f}% of the copy ({r['weight_gbps']:.1f} vs {r['copy_gbps']:.1f} " \
              f"GB/s; {r['step_ms']:.2f} ms per step)"


TARGETS = (
    _speedup_target("attention_causal", "torch", 1.8),
    _speedup_target("attention_causal", "numpy", 10),
    _speedup_target("attention_full", "torch", 1.3),
    ("attention_memory", "peak memory growth < 64 MiB", _memory_target, lambda v: v < 64),
    _speedup_target("attention_backward_causal", "torch", 1.5),
    ("attention_backward_memory", "peak memory growth < 128 MiB", _backward_memory_target,
     lambda v: v < 128),
    ("ffn", "GFLOP/s >= 90% of sgemm GFLOP/s", _ffn_target, lambda v: v >= 0.9),
    _speedup_target("layer_norm", "torch", 1.5),
    ("ffn_backward", "GFLOP/s >= 80% of sgemm GFLOP/s", _sgemm_share("ffn_backward"),
     lambda v: v >= 0.8),
    _speedup_target("ffn_backward", "torch", 1.0),
    _bandwidth_vs_torch("layer_norm_backward", 1.3),
    _speedup_target("encoder", "torch", 1.1),
    _speedup_target("transformer", "torch", 1.2),
    _speedup_target("transformer", "numpy", 2),
    _speedup_target("generate_greedy_b8", "torch", 10, field="tokens_per_s", unit="tokens/s"),
    ("decode_step", "decode weight GB/s >= 85% of memory copy GB/s", _decode_target,
     lambda v: v >= 0.85),
    _speedup_target("train_small", "torch", 1.3, field="tokens_per_s", unit="tokens/s"),
    _speedup_target("train_base", "torch", 1.3, field="tokens_per_s", unit="tokens/s"),
    ("train_memory_base", "peak memory growth of a step < torch's",
     _train_memory_target("train_memory_base"), lambda v: v < 1.0),
    # bf16 mixed precision: the torch column is torch under autocast bf16
    _speedup_target("train_small_bf16", "torch", 1.3, field="tokens_per_s", unit="tokens/s",
                    label="torch autocast bf16"),
    _speedup_target("train_base_bf16", "torch", 1.3, field="tokens_per_s", unit="tokens/s",
                    label="torch autocast bf16"),
    ("train_memory_base_bf16", "peak memory growth of a step < torch autocast bf16's",
     _train_memory_target("train_memory_base_bf16", "torch autocast bf16"),
     lambda v: v < 1.0),
)


# ---- training: loss and optimiser -----------------------------------------------------------

def _copy_share_target(case):
    """fastattn's GB/s over a memory copy's, both timed in the same run (Case.copy_probe)."""
    def measure(rows):
        r = _row(rows, case)
        if r is None:
            return None, "not run"
        v = r.get("share_of_copy")
        if v is None:
            return None, "not measured"
        return v, f"{100 * v:.0f}% of the copy ({r['fastattn_gbps']:.1f} vs " \
                  f"{r['copy_gbps']:.1f} GB/s; {fmt_ms(r['fastattn_ms'])} ms per step)"
    return measure


TARGETS += (
    _speedup_target("cross_entropy", "torch", 2),
    ("adamw", "GB/s >= 80% of memory copy GB/s", _copy_share_target("adamw"),
     lambda v: v >= 0.8),
)

# ---- corpus runners (runner_cases.py) -------------------------------------------------------
from .runner_cases import RUNNER_TARGETS  # noqa: E402

TARGETS += RUNNER_TARGETS

# ---- pretrained model against CTranslate2 (pretrained_cases.py) ------------------------------
from .pretrained_cases import PRETRAINED_TARGETS  # noqa: E402

TARGETS += PRETRAINED_TARGETS

# ---- learning (learning.py) -----------------------------------------------------------------
from .learning import LEARNING_TARGETS  # noqa: E402

TARGETS += LEARNING_TARGETS

# ---- data-parallel training (dp_cases.py) -----------------------------------------------------
from .dp_cases import DP_TARGETS  # noqa: E402

TARGETS += DP_TARGETS


# ---- quantized weights: against the float32 rows of the same run, and CTranslate2 ------------

def _faster_than_float32(case, base, field="fastattn_ms", what="ms"):
    """fastattn with quantized weights (row `case`) against float32: the median ratio of the
    float32 calls the case's row timed each right after one of its own ("float32_ratio"),
    else the ratio of the medians (its "float32_<field>"), else its float32 row `base` of the
    same run; base's time over case's."""
    def measure(rows):
        q, f = _row(rows, case), _row(rows, base)
        if q is None:
            return None, "not run"
        own = q.get(f"float32_{field}")
        if q.get("float32_ratio") and own and q.get(field):
            v = q["float32_ratio"]
            return v, (f"{v:.2f}x float32 (median of paired calls; medians {fmt_ms(q[field])} "
                       f"vs {fmt_ms(own)} {what}, interleaved)")
        if own and q.get(field):
            v = own / q[field]
            return v, (f"{v:.2f}x float32 ({fmt_ms(q[field])} vs {fmt_ms(own)} {what}, "
                       "interleaved)")
        if f is None or not f.get(field) or not q.get(field):
            return None, f"needs the {base} case in the same run"
        v = f[field] / q[field]
        return v, f"{v:.2f}x float32 ({fmt_ms(q[field])} vs {fmt_ms(f[field])} {what})"
    return measure


TARGETS += (
    ("encoder_int8", "speedup vs float32 encoder >= 1.5x",
     _faster_than_float32("encoder_int8", "encoder"), lambda v: v >= 1.5),
    ("decode_step_int8", "speedup vs float32 decode step >= 3x",
     _faster_than_float32("decode_step_int8", "decode_step", "step_ms", "ms per step"),
     lambda v: v >= 3.0),
    ("decode_step_bf16", "speedup vs float32 decode step >= 1.8x",
     _faster_than_float32("decode_step_bf16", "decode_step", "step_ms", "ms per step"),
     lambda v: v >= 1.8),
    _speedup_target("generate_greedy_b8_int8", "ctranslate2", 1.2, field="tokens_per_s",
                    unit="tokens/s"),
    _speedup_target("encoder_bfloat16", "torch", 1.15),
    _speedup_target("transformer_bfloat16", "torch", 1.15),
    # torch's model in bf16 decoding with a KV cache of its own (TorchCachedDecoder)
    _speedup_target("generate_greedy_b8_bfloat16", "torch", 1.3, field="tokens_per_s",
                    unit="tokens/s", label="torch bf16"),
    ("linear_bfloat16", "GFLOP/s >= 85% of the vdpbf16ps peak (same run)",
     lambda rows: _peak_share(rows, path="avx512bf16"), lambda v: v >= 0.85),
    # the tiles (an AMX CPU): the share of the register-only TDP loop's rate; int8's int16
    # inputs take two TDPBSSD per product (hi and lo bytes), so its GOP/s count twice
    ("linear_bfloat16", "GFLOP/s >= 50% of the TDPBF16PS peak (same run)",
     lambda rows: _peak_share(rows, peak="peak_amx_bf16", path="amx"), lambda v: v >= 0.5),
    ("linear_int8", "tiles busy >= 50% (2 x GOP/s over the TDPBSSD peak, same run)",
     lambda rows: _peak_share(rows, "linear_int8", "peak_amx_int8", path="amx", ops=2),
     lambda v: v >= 0.5),
    # the float32 GEMM engine (gemm_cases.py): nn.Linear's shapes, and the FMA roofline
    *(_speedup_target(f"gemm_{s}", "torch", 1.1) for s in ("512_1536", "512_2048", "2048_512",
                                                         "512_512")),
    *((f"gemm_{s}", "GFLOP/s >= 80% of the vfmadd231ps peak (same run)",
       (lambda case: lambda rows: _peak_share(rows, case, "peak_fma"))(f"gemm_{s}"),
       lambda v: v >= 0.8) for s in ("2048", "512_2048", "2048_512")),
)


def _peak_share(rows, case="linear_bfloat16", peak="peak_vdpbf16ps", path=None, ops=1):
    """case's GFLOP/s (times ops: the peak's instructions per product) over the peak row's,
    both rows of the same run; path: only where the case's title says it ran that path."""
    r, p = _row(rows, case), _row(rows, peak)
    if r is None or p is None:
        return None, f"needs {case} and {peak} in the same run"
    if path and f", {path} path" not in r.get("title", ""):
        return None, f"runs another path ({r.get('title', '')})"
    got, peak = r.get("fastattn_gflops"), p.get("fastattn_gflops")
    if not got or not peak:
        return None, "not measured"
    v = ops * got / peak
    twice = f"{ops} x " if ops != 1 else ""
    return v, f"{twice}{got:.0f} of {peak:.0f} GFLOP/s ({v:.0%})"


def check_targets(rows):
    """Check the performance targets against a run's rows.

    Args:
        rows: `run`'s rows.

    Returns:
        One dict per target: case, target, value, detail, status ("PASS", "MISS" or "SKIP")."""
    results = []
    for case, text, measure, passes in TARGETS:
        value, detail = measure(rows)
        status = "SKIP" if value is None else "PASS" if passes(value) else "MISS"
        results.append({"case": case, "target": text, "value": value, "detail": detail,
                        "status": status})
    return results


def format_targets(results, *, include_skipped=False):
    """One line per target: PASS/MISS, case, target, what was measured.

    Args:
        results: `check_targets`' dicts.
        include_skipped: also list the skipped targets (default False).

    Returns:
        The lines, as one str."""
    shown = [r for r in results if include_skipped or r["status"] != "SKIP"]
    if not shown:
        return ""
    wc = max(len(r["case"]) for r in shown)
    wt = max(len(r["target"]) for r in shown)
    return "\n".join(f"{r['status']:4}  {r['case']:{wc}}  {r['target']:{wt}}  {r['detail']}"
                     for r in shown)
