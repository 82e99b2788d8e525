"""bf16 attention (ops.attention's compute_type="bfloat16"), op level, against float32 and
torch's bf16 scaled_dot_product_attention on the same inputs.

    attention_bf16         B=8 H=8 L=128 D=64, not causal (an encoder's self-attention):
                           fastattn bf16 (ops.attention), numpy twin (bf16 rounding, float64
                           sums), torch SDPA on bf16 tensors; fastattn float32 interleaved
                           (the row's float32 column)
    attention_bf16_decode  one decode step: B=8 H=8, one query against a 128-key cache, D=64,
                           through the model layer's entry (_fast.attention_fn, bf16=True); the
                           same columns

The fastattn column is checked against the twin (the bound of tests/test_ops_attention_bf16.py
stays far below the runner's flag); torch computes another function (its output is bf16), so
its difference from the twin is noted, not flagged.
"""
import math

import numpy as np

from .. import _fast, ops, reference
from .base import Case, _normal, _torch_impl

ATTENTION = dict(B=8, H=8, L=128, D=64)
DECODE = dict(B=8, H=8, Lk=128, D=64)


def _torch_bf16(F, t):
    q, k, v = (t[n].to(dtype=_bf16()) for n in ("q", "k", "v"))
    return lambda: F.scaled_dot_product_attention(q, k, v).float()


def _bf16():
    import torch
    return torch.bfloat16


def _attention_case(B, H, L, D):
    def build(rng):
        return {n: _normal(rng, (B, H, L, D)) for n in ("q", "k", "v")}

    def impl(fn, compute_type):
        return lambda i: (lambda: fn(i["q"], i["k"], i["v"], compute_type=compute_type))

    case = Case("attention_bf16", f"attention bf16 (B={B} H={H} L={L} D={D})", build, {
        "fastattn": impl(ops.attention, "bfloat16"),
        "numpy": impl(reference.attention, "bfloat16"),
        "torch": _torch_impl(_torch_bf16),
    }, flops=4 * B * H * L * L * D, float32_impl=impl(ops.attention, "float32"))
    case.check_impls = ("fastattn",)
    return case


def _decode_case(B, H, Lk, D):
    scale = 1.0 / math.sqrt(D)

    def build(rng):
        return {"q": _normal(rng, (B, H, 1, D)), "k": _normal(rng, (B, H, Lk, D)),
                "v": _normal(rng, (B, H, Lk, D))}

    def fast(bf16):
        def factory(i):
            attend, out = _fast.attention_fn(scale, bf16=bf16), np.empty((B, H, 1, D), np.float32)
            return lambda: attend(i["q"], i["k"], i["v"], None, out)
        return factory

    case = Case("attention_bf16_decode",
                f"attention bf16 decode step (B={B} H={H} Lq=1 Lk={Lk} D={D})", build, {
                    "fastattn": fast(True),
                    "numpy": lambda i: (lambda: reference.attention(
                        i["q"], i["k"], i["v"], compute_type="bfloat16")),
                    "torch": _torch_impl(_torch_bf16),
                }, flops=4 * B * H * Lk * D, float32_impl=fast(False))
    case.check_impls = ("fastattn",)
    return case


BF16_ATTENTION_CASES = (_attention_case(**ATTENTION), _decode_case(**DECODE))
