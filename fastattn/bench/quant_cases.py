"""Quantised-weight op cases: linear with int8 and bf16 weights (ops.QuantizedWeight) against
the fp32 linear on the same shapes, many rows (an encoder's GEMMs) and decode-sized rows.

    linear_fp32           ops.linear, N=1024 rows, K=512 -> M=2048 (the GEMMs' fp32 baseline:
                          the GEMM engine + fused epilogue); numpy twin, torch F.linear
    linear_int8           the same product with an int8 weight (per-row scales, activations
                          quantised per row, exact int32 sums): GOP/s in the GFLOP/s column
    linear_bf16           the same with a bf16 weight (widened to float32, then sgemm)
    linear_bfloat16       the same in the bfloat16 compute type (both operands rounded to bf16,
                          float32 sums): read its GFLOP/s against peak_vdpbf16ps / peak_fma
    peak_vdpbf16ps, peak_fma   register-only loops of vdpbf16ps / vfmadd231ps on every thread:
                          the machine's bf16 dot-product and float32 FMA peaks
    peak_amx_bf16, peak_amx_int8   register-only loops of TDPBF16PS / TDPBSSD on every thread
                          (CPUs with AMX where Linux grants the tiles; else an empty row): the
                          tiles' peaks, against which the rows that run on the tiles are read
                          (linear_bfloat16 on the amx path; linear_int8 on amx, whose int16
                          inputs take two TDP per product, so half that peak is its ceiling)
    decode_linear_<dt>_n<N>   fp32 / int8 / bf16, N = 1 and 8 rows (a decode step's beams), one
                          call = one product with each of DECODE_WEIGHTS distinct 2048 x 2048
                          weights, so the weights come from memory, not from the caches (the
                          int8 set alone is larger than a 32 MiB L3); GB/s of weight bytes
                          read, against a memory copy timed in the same run (% of copy)

The int8 and bf16 rows are checked against the twin (reference.linear with the same
QuantizedWeight: bit for bit for int8); their torch column is empty (torch has no product of
an fp32 activation with per-row int8 or bf16 weights with this math). Compare a row with its
fp32 row for the speedup over fp32. The packed copies the kernels read are built in the
inputs (before timing), as a model does on its first call.
"""
import numpy as np

from .. import _fast, _kernels, build_info, get_num_threads, kinds, ops, reference
from .base import Case, _normal, _torch_impl
from .torch_models import Unavailable

LINEAR = dict(N=1024, K=512, M=2048)
DECODE = dict(K=2048, M=2048)
DECODE_WEIGHTS = 12          # 12 x 2048 x 2048: int8 48 MiB, bf16 96 MiB, fp32 192 MiB
DTYPES = ("fp32", "int8", "bf16", "bfloat16")
WEIGHT_BYTES = {"fp32": 4, "int8": 1, "bf16": 2, "bfloat16": 2}
PEAK_ITERS = 200_000         # steps of 24 independent instructions per thread


def _weight(w, dtype):
    """The weight as the fast backend would hold it (a QuantizedWeight packs when made)."""
    if dtype == "fp32":
        return w
    return ops.QuantizedWeight.from_float(w, dtype)


class _Stored:
    """The twin's quantised weight as a prototype holds it: the stored arrays themselves
    (reference.linear reads dtype, data and scale; a QuantizedWeight would unpack its data
    from the packed copy on every call)."""

    _fastattn_quantized = True

    def __init__(self, w):
        self.dtype, self.data, self.scale, self.shape = w.dtype, w.data, w.scale, w.shape


def _unpacked(w):
    """The twin's weight: the same values, held unpacked (_Stored)."""
    return _Stored(w) if isinstance(w, ops.QuantizedWeight) else w


def _linear_case(dtype, N, K, M):
    def build(rng):
        w = _normal(rng, (M, K), K ** -0.5)
        return {"x": _normal(rng, (N, K)), "w": _weight(w, dtype),
                "b": _normal(rng, (M,), 0.1)}

    def impl(fn, weight=lambda w: w):
        def factory(i):
            w = weight(i["w"])
            return lambda: fn(i["x"], w, i["b"], activation="relu")
        return factory

    impls = {"fastattn": impl(ops.linear), "numpy": impl(reference.linear, _unpacked)}
    if dtype == "fp32":
        impls["torch"] = _torch_impl(lambda F, t: (lambda: F.relu(F.linear(t["x"], t["w"],
                                                                           t["b"]))))
    what = {"fp32": "fp32 weight (sgemm)", "int8": "int8 weight, per-row scales",
            "bf16": "bf16 weight", "bfloat16": "bfloat16 compute"}[dtype]
    if dtype == "bfloat16":
        what += f", {build_info()['bf16_path']} path"
    if dtype == "int8":
        what += f", {build_info()['int8_path']} path"
    return Case(f"linear_{dtype}", f"linear + relu, {what} ({N}, {K}) -> {M}", build, impls,
                flops=2 * N * K * M)


def _decode_linear_case(dtype, N, K, M, count=DECODE_WEIGHTS):
    def build(rng):
        ws = [_normal(rng, (M, K), K ** -0.5) for _ in range(count)]
        inputs = {"x": _normal(rng, (N, K)), "ws": [_weight(w, dtype) for w in ws]}
        if dtype == "fp32":
            inputs["packed"] = [kinds.pack_panels(w) for w in ws]
        return inputs

    def fast(i):
        x, y = i["x"], np.empty((count, N, M), np.float32)

        def run():
            for j in range(count):
                if dtype == "fp32":     # the fp32 decode kernel, as the fast backend calls it
                    _fast.linear_packed_into(y[j], x, i["packed"][j], None, 0)
                else:                   # the weight kind's product (any rows)
                    i["ws"][j].product(None, 0)(x, y[j])
            return y
        return run

    def twin(i):
        ws = [_unpacked(w) for w in i["ws"]]
        return lambda: np.stack([reference.linear(i["x"], w) for w in ws])

    case = Case(f"decode_linear_{dtype}_n{N}",
                f"decode linear, {dtype} weights, {N} row{'s' if N > 1 else ''} x {count} "
                f"weights ({K}, {M})", build, {"fastattn": fast, "numpy": twin},
                nbytes=count * M * K * WEIGHT_BYTES[dtype],
                flops=2 * count * N * K * M)
    case.copy_probe = True       # % of a memory copy timed in the same run
    return case


# kind (fastattn.h fa_peak) -> the instruction, and the steps of one timed call (a tile step
# is 4 TDP of 16 cycles, the vector steps 24 instructions of about one cycle)
PEAKS = {"vdpbf16ps": ("vdpbf16ps", PEAK_ITERS), "fma": ("vfmadd231ps", PEAK_ITERS),
         "amx_bf16": ("TDPBF16PS", PEAK_ITERS // 16), "amx_int8": ("TDPBSSD", PEAK_ITERS // 16)}


def _peak_case(kind):
    """The register-only loop of one instruction on every thread (fastattn.h fa_peak): the
    roofline a GEMM's GFLOP/s are read against."""
    insn, iters = PEAKS[kind]
    case = None

    def build(rng):
        threads = get_num_threads()
        flops = _kernels.peak(1, threads, kind)
        if flops < 0:
            raise Unavailable(f"this CPU or SIMD level has no {insn}"
                              + (" (or Linux refuses the tiles)" if "amx" in kind else ""))
        case.flops = int(flops) * iters               # the threads in use now
        return {"threads": threads}

    def fast(i):
        return lambda: _kernels.peak(iters, i["threads"], kind)
    case = Case(f"peak_{kind}", f"{insn} peak, register-only loop on every thread", build,
                {"fastattn": fast}, flops=1, slow=())
    return case


QUANT_CASES = tuple(_peak_case(kind) for kind in PEAKS) + tuple(
    [_linear_case(dt, **LINEAR) for dt in DTYPES]
    + [_decode_linear_case(dt, n, **DECODE) for n in (1, 8) for dt in DTYPES])
