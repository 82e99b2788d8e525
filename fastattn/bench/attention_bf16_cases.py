"""bf16 attention (ops.attention's compute_type="bfloat16"), op level, against float32 and
torch's bf16 scaled_dot_product_attention on the same inputs.

    attention_bf16         B=8 H=8 L=128 D=64, not causal (an encoder's self-attention):
                           fastattn bf16 (ops.attention), numpy twin (bf16 rounding, float64
                           sums), torch SDPA on bf16 tensors; fastattn float32 interleaved
                           (the row's float32 column)
    attention_bf16_backward  the backward of attention_bf16 (bf16 training's, compute_type=
                           "bfloat16": q, k, v, dout, P' and dS rounded, float32 sums; on the
                           AMX tiles where the attention path is amx) from the forward's out and
                           lse, against the twin and torch's SDPA backward on bf16 tensors
                           (autograd.grad, its forward run once, untimed)
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
from .base import Case, _normal, _torch_backward, _torch_impl

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


def _backward_case(B, H, L, D):
    def build(rng):
        inputs = {n: _normal(rng, (B, H, L, D)) for n in ("q", "k", "v", "dout")}
        out, cache = ops.attention_forward(inputs["q"], inputs["k"], inputs["v"],
                                           compute_type="bfloat16")
        inputs.update(out=out, lse=cache["lse"])
        return inputs

    def impl(fn, compute_type):
        return lambda i: (lambda: fn(i["dout"], i["q"], i["k"], i["v"], i["out"], i["lse"],
                                     compute_type=compute_type))

    case = Case("attention_bf16_backward", f"attention bf16 backward (B={B} H={H} L={L} D={D})",
                build, {"fastattn": impl(ops.attention_backward, "bfloat16"),
                        "numpy": impl(reference.attention_backward, "bfloat16"),
                        "torch": _torch_backward(False, bf16=True)},
                flops=10 * B * H * L * L * D,            # five products of the forward's size
                float32_impl=impl(ops.attention_backward, "float32"))
    case.check_impls = ("fastattn",)
    # P' and dS are rounded to bf16 from scores summed in another order than the twin's: where
    # one lands on the other side of a rounding boundary it moves by 2^-8 of itself, and the
    # gradients (of size ~10 here) by ~1e-3 (tests/test_ops_bf16_training.py bounds the norm)
    case.mismatch_atol = 1e-2
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


BF16_ATTENTION_CASES = (_attention_case(**ATTENTION), _backward_case(**ATTENTION),
                        _decode_case(**DECODE))
