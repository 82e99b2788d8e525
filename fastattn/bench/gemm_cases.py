"""The float32 GEMM engine's rows: GFLOP/s of one product on each Transformer-base shape (1024
rows: a batch of 8 sequences of 128 tokens) and on 2048^3, side by side in one run:

    fastattn     the weight as inference holds it (kinds.PackedFloat32Weight: its panels packed
                 once, when the model enters eval()), y = x @ w.T into a buffer
    torch        torch.nn.Linear(K, M, bias=False) on the same weight (MKL / oneDNN on Intel)
    numpy        np.matmul(x, w.T) into a buffer (NumPy's own BLAS)

    gemm_512_1536   the in-projection (q, k, v)   gemm_512_2048   the FFN's first product
    gemm_2048_512   the FFN's second product      gemm_512_512    the out-projection
    gemm_2048       2048^3, the classic roofline

Read the GFLOP/s against peak_fma, the register-only vfmadd231ps loop timed in the same run (the
targets in targets.py: >= 1.1x torch on the four model shapes, >= 80% of that peak on 2048^3 and
on the FFN's shapes).
"""
import numpy as np

from .. import kinds
from .base import Case, _normal, _torch_impl

GEMM_ROWS = 1024
GEMM_SHAPES = ((512, 1536), (512, 2048), (2048, 512), (512, 512))   # (K, M), in -> out


def _gemm_case(N, K, M, name):
    def build(rng):
        return {"x": _normal(rng, (N, K)), "w": _normal(rng, (M, K), K ** -0.5),
                "y": np.empty((N, M), np.float32), "yn": np.empty((N, M), np.float32)}

    def fast(i):
        product, x, y = kinds.PackedFloat32Weight(i["w"]).product(None, 0, N), i["x"], i["y"]
        return lambda: product(x, y)

    def numpy(i):
        x, wt, y = i["x"], i["w"].T, i["yn"]
        return lambda: np.matmul(x, wt, out=y)

    def torch_body(F, t):
        import torch
        lin = torch.nn.Linear(K, M, bias=False)
        lin.weight = torch.nn.Parameter(t["w"], requires_grad=False)
        x = t["x"]
        return lambda: lin(x)

    return Case(name, f"float32 GEMM ({N}, {K}) -> {M}, packed weight vs nn.Linear", build,
                {"fastattn": fast, "numpy": numpy, "torch": _torch_impl(torch_body)},
                flops=2 * N * K * M, slow=())


GEMM_CASES = tuple(_gemm_case(GEMM_ROWS, K, M, f"gemm_{K}_{M}") for K, M in GEMM_SHAPES) + (
    _gemm_case(2048, 2048, 2048, "gemm_2048"),)
