"""Both twins check their arguments with the same functions (fastattn._checks): for every
public op, a bad argument raises the same exception with the same message in fastattn.ops and
fastattn.reference, so a prototype that runs on the reference runs on the kernels.
"""
import re

import numpy as np
import pytest

from fastattn import ops, reference


def arr(*shape, dtype=np.float32):
    return np.zeros(shape, dtype)


Q, K, V = arr(2, 3, 5, 4), arr(2, 3, 7, 4), arr(2, 3, 7, 6)      # B=2 H=3 Lq=5 Lk=7 D=4 Dv=6
OUT, LSE = arr(2, 3, 5, 6), arr(2, 3, 5)
X, W, B_ = arr(3, 4), arr(4), arr(4)


def qweight():
    return ops.QuantizedWeight.from_float(np.ones((3, 5), np.float32), "int8")


def adam_args(**change):
    args = dict(params=[arr(3)], grads=[arr(3)], exp_avg=[arr(3)], exp_avg_sq=[arr(3)], step=1,
                lr=1e-3)
    args.update(change)
    return args


# name -> call(F): each raises in both twins
BAD = {
    # attention: masks are bool or float only; data real only; shapes; options
    "attention int mask": lambda F: F.attention(Q, K, V, mask=np.zeros((5, 7), np.int64)),
    "attention uint8 mask": lambda F: F.attention(Q, K, V, mask=np.zeros((5, 7), np.uint8)),
    "attention complex mask": lambda F: F.attention(Q, K, V, mask=arr(5, 7, dtype=np.complex64)),
    "attention int key_padding_mask": lambda F: F.attention(
        Q, K, V, key_padding_mask=np.zeros((2, 7), np.int32)),
    "attention uint8 key_padding_mask": lambda F: F.attention(
        Q, K, V, key_padding_mask=np.zeros((2, 7), np.uint8)),
    "attention complex key_padding_mask": lambda F: F.attention(
        Q, K, V, key_padding_mask=arr(2, 7, dtype=np.complex128)),
    "attention bool q": lambda F: F.attention(arr(2, 3, 5, 4, dtype=bool), K, V),
    "attention complex k": lambda F: F.attention(Q, arr(2, 3, 7, 4, dtype=np.complex64), V),
    "attention object v": lambda F: F.attention(Q, K, arr(2, 3, 7, 6, dtype=object)),
    "attention 3-D q": lambda F: F.attention(arr(3, 5, 4), K, V),
    "attention k head dim": lambda F: F.attention(Q, arr(2, 3, 7, 8), V),
    "attention v length": lambda F: F.attention(Q, K, arr(2, 3, 6, 6)),
    "attention mask shape": lambda F: F.attention(Q, K, V, mask=arr(4, 7)),
    "attention mask rank": lambda F: F.attention(Q, K, V, mask=arr(1, 2, 3, 5, 7)),
    "attention key_padding_mask shape": lambda F: F.attention(
        Q, K, V, key_padding_mask=np.zeros((7,), bool)),
    "attention scale str": lambda F: F.attention(Q, K, V, scale="0.5"),
    "attention scale bool": lambda F: F.attention(Q, K, V, scale=True),
    "attention dropout 1": lambda F: F.attention(Q, K, V, dropout_p=1.0, seed=1),
    "attention dropout no seed": lambda F: F.attention(Q, K, V, dropout_p=0.1),
    "attention dropout bad seed": lambda F: F.attention(Q, K, V, dropout_p=0.1, seed=-1),
    "attention_forward int mask": lambda F: F.attention_forward(Q, K, V, mask=arr(5, 7, dtype=int)),
    "attention_forward complex q": lambda F: F.attention_forward(
        arr(2, 3, 5, 4, dtype=np.complex64), K, V),
    "attention_backward complex dout": lambda F: F.attention_backward(
        arr(2, 3, 5, 6, dtype=np.complex64), Q, K, V, OUT, LSE),
    "attention_backward lse shape": lambda F: F.attention_backward(OUT, Q, K, V, OUT, arr(2, 3, 4)),
    "attention_backward lse rank": lambda F: F.attention_backward(OUT, Q, K, V, OUT, arr(2, 3)),
    "attention_backward out shape": lambda F: F.attention_backward(OUT, Q, K, V, arr(2, 3, 5, 5),
                                                                   LSE),
    "attention_backward uint8 mask": lambda F: F.attention_backward(
        OUT, Q, K, V, OUT, LSE, mask=np.zeros((5, 7), np.uint8)),
    "attention_backward dropout": lambda F: F.attention_backward(OUT, Q, K, V, OUT, LSE,
                                                                 dropout_p=-0.5),
    # softmax
    "softmax bool": lambda F: F.softmax(arr(3, 4, dtype=bool)),
    "softmax complex": lambda F: F.softmax(arr(3, 4, dtype=np.complex64)),
    "softmax str": lambda F: F.softmax(np.full((3, 4), "a")),
    "softmax scalar": lambda F: F.softmax(np.float32(1.0)),
    "softmax axis": lambda F: F.softmax(arr(3, 4), axis=2),
    "softmax axis float": lambda F: F.softmax(arr(3, 4), axis=1.0),
    # layer norm
    "layer_norm eps 0": lambda F: F.layer_norm(X, W, B_, eps=0.0),
    "layer_norm eps negative": lambda F: F.layer_norm(X, W, B_, eps=-1e-5),
    "layer_norm eps nan": lambda F: F.layer_norm(X, W, B_, eps=float("nan")),
    "layer_norm eps inf": lambda F: F.layer_norm(X, W, B_, eps=float("inf")),
    "layer_norm eps underflows": lambda F: F.layer_norm(X, W, B_, eps=1e-50),
    "layer_norm eps str": lambda F: F.layer_norm(X, W, B_, eps="1e-5"),
    "layer_norm bool x": lambda F: F.layer_norm(arr(3, 4, dtype=bool), W, B_),
    "layer_norm complex x": lambda F: F.layer_norm(arr(3, 4, dtype=np.complex64), W, B_),
    "layer_norm complex residual": lambda F: F.layer_norm(X, W, B_,
                                                          residual=arr(3, 4, dtype=complex)),
    "layer_norm residual shape": lambda F: F.layer_norm(X, W, B_, residual=arr(3, 5)),
    "layer_norm weight shape": lambda F: F.layer_norm(X, arr(5), B_),
    "layer_norm bias bool": lambda F: F.layer_norm(X, W, arr(4, dtype=bool)),
    "layer_norm scalar": lambda F: F.layer_norm(np.float32(2.0), None, None),
    "layer_norm_forward eps 0": lambda F: F.layer_norm_forward(X, W, B_, eps=0),
    "layer_norm_forward bool x": lambda F: F.layer_norm_forward(arr(3, 4, dtype=bool), W, B_),
    "layer_norm_backward mean shape": lambda F: F.layer_norm_backward(X, X, arr(2), arr(3), W),
    "layer_norm_backward rstd shape": lambda F: F.layer_norm_backward(X, X, arr(3), arr(3, 1), W),
    "layer_norm_backward complex dy": lambda F: F.layer_norm_backward(
        arr(3, 4, dtype=np.complex64), X, arr(3), arr(3), W),
    "layer_norm_backward dy shape": lambda F: F.layer_norm_backward(arr(3, 5), X, arr(3), arr(3),
                                                                    W),
    "layer_norm_backward residual": lambda F: F.layer_norm_backward(X, X, arr(3), arr(3), W,
                                                                    residual=arr(2, 4)),
    # linear and ffn
    "linear activation": lambda F: F.linear(X, arr(5, 4), activation="tanh"),
    "linear activation list": lambda F: F.linear(X, arr(5, 4), activation=["relu"]),
    "linear bool x": lambda F: F.linear(arr(3, 4, dtype=bool), arr(5, 4)),
    "linear complex weight": lambda F: F.linear(X, arr(5, 4, dtype=np.complex64)),
    "linear weight rank": lambda F: F.linear(X, arr(5, 4, 1)),
    "linear in features": lambda F: F.linear(arr(3, 5), arr(5, 4)),
    "linear bias shape": lambda F: F.linear(X, arr(5, 4), arr(4)),
    "linear scalar": lambda F: F.linear(np.float32(1.0), arr(5, 1)),
    "linear quantized in features": lambda F: F.linear(X, qweight()),
    "linear quantized activation": lambda F: F.linear(arr(3, 5), qweight(), activation="elu"),
    "linear_forward quantized": lambda F: F.linear_forward(arr(3, 5), qweight()),
    "linear_forward activation": lambda F: F.linear_forward(X, arr(5, 4), activation="GELU"),
    "linear_backward no pre": lambda F: F.linear_backward(arr(3, 5), X, arr(5, 4),
                                                          activation="relu"),
    "linear_backward dy shape": lambda F: F.linear_backward(arr(3, 4), X, arr(5, 4)),
    "linear_backward pre shape": lambda F: F.linear_backward(arr(3, 5), X, arr(5, 4),
                                                             pre=arr(3, 4), activation="gelu"),
    "ffn w1": lambda F: F.ffn(X, arr(8, 5), None, arr(4, 8), None),
    "ffn w2": lambda F: F.ffn(X, arr(8, 4), None, arr(4, 9), None),
    "ffn b1": lambda F: F.ffn(X, arr(8, 4), arr(4), arr(4, 8), None),
    "ffn activation": lambda F: F.ffn(X, arr(8, 4), None, arr(4, 8), None, activation="swish"),
    "ffn bool x": lambda F: F.ffn(arr(3, 4, dtype=bool), arr(8, 4), None, arr(4, 8), None),
    "ffn quantized w2": lambda F: F.ffn(X, arr(8, 4), None, qweight(), None),
    "ffn_forward dropout": lambda F: F.ffn_forward(X, arr(8, 4), None, arr(4, 8), None,
                                                   dropout_p=1.5, seed=1),
    "ffn_forward seed": lambda F: F.ffn_forward(X, arr(8, 4), None, arr(4, 8), None,
                                                dropout_p=0.5),
    "ffn_forward quantized": lambda F: F.ffn_forward(arr(3, 5), qweight(), None, arr(5, 3), None),
    "ffn_backward pre": lambda F: F.ffn_backward(X, X, arr(8, 4), None, arr(4, 8), None,
                                                 arr(3, 7)),
    "ffn_backward dy": lambda F: F.ffn_backward(arr(2, 4), X, arr(8, 4), None, arr(4, 8), None,
                                                arr(3, 8)),
    # dropout, embedding, positional encoding
    "dropout p 1": lambda F: F.dropout(X, 1.0, seed=1),
    "dropout p bool": lambda F: F.dropout(X, True, seed=1),
    "dropout no seed": lambda F: F.dropout(X, 0.5),
    "dropout seed": lambda F: F.dropout(X, 0.5, seed=2**64),
    "dropout bool x": lambda F: F.dropout(arr(3, 4, dtype=bool), 0.5, seed=1),
    "dropout scalar": lambda F: F.dropout(np.float32(1.0), 0.5, seed=1),
    "dropout_backward p": lambda F: F.dropout_backward(X, -0.1, seed=1),
    "dropout_backward complex": lambda F: F.dropout_backward(arr(3, 4, dtype=complex), 0.1,
                                                             seed=1),
    "embedding_backward float ids": lambda F: F.embedding_backward(X, np.zeros(3), 5),
    "embedding_backward id range": lambda F: F.embedding_backward(X, np.array([0, 5, 1]), 5),
    "embedding_backward negative id": lambda F: F.embedding_backward(X, np.array([0, -1, 1]), 5),
    "embedding_backward V": lambda F: F.embedding_backward(X, np.zeros(3, int), -1),
    "embedding_backward V float": lambda F: F.embedding_backward(X, np.zeros(3, int), 5.0),
    "embedding_backward dout shape": lambda F: F.embedding_backward(X, np.zeros(4, int), 5),
    "positional_encoding length": lambda F: F.positional_encoding(-1, 4),
    "positional_encoding d_model": lambda F: F.positional_encoding(3, 2.5),
    "positional_encoding bool": lambda F: F.positional_encoding(True, 4),
    # loss
    "cross_entropy smoothing above 1": lambda F: F.cross_entropy(X, np.zeros(3, int),
                                                                 label_smoothing=1.5),
    "cross_entropy smoothing negative": lambda F: F.cross_entropy(X, np.zeros(3, int),
                                                                  label_smoothing=-0.1),
    "cross_entropy smoothing nan": lambda F: F.cross_entropy(X, np.zeros(3, int),
                                                             label_smoothing=float("nan")),
    "cross_entropy reduction": lambda F: F.cross_entropy(X, np.zeros(3, int), reduction="avg"),
    "cross_entropy float targets": lambda F: F.cross_entropy(X, np.zeros(3)),
    "cross_entropy target range": lambda F: F.cross_entropy(X, np.array([0, 4, 1])),
    "cross_entropy target shape": lambda F: F.cross_entropy(X, np.zeros(4, int)),
    "cross_entropy ignore_index": lambda F: F.cross_entropy(X, np.zeros(3, int),
                                                            ignore_index=1.0),
    "cross_entropy complex": lambda F: F.cross_entropy(arr(3, 4, dtype=complex), np.zeros(3, int)),
    # optimiser: in-place float32 arrays and checked hyper-parameters in both
    "adamw_step float64": lambda F: F.adamw_step(**adam_args(params=[np.zeros(3)])),
    "adamw_step step 0": lambda F: F.adamw_step(**adam_args(step=0)),
    "adamw_step lr": lambda F: F.adamw_step(**adam_args(lr=-1.0)),
    "adamw_step betas": lambda F: F.adamw_step(**adam_args(), betas=(1.0, 0.9)),
    "adamw_step counts": lambda F: F.adamw_step(**adam_args(grads=[])),
    "adamw_step shapes": lambda F: F.adamw_step(**adam_args(grads=[arr(4)])),
    "adamw_step read-only": lambda F: F.adamw_step(**adam_args(
        exp_avg=[np.broadcast_to(arr(1), (3,))])),
    "adam_step strided": lambda F: F.adam_step(**adam_args(params=[arr(6)[::2]])),
    "adam_step eps": lambda F: F.adam_step(**adam_args(), eps=float("inf")),
    "grad_norm str": lambda F: F.grad_norm("abc"),
    "grad_norm complex": lambda F: F.grad_norm([arr(3, dtype=complex)]),
    "clip_grads max_norm": lambda F: F.clip_grads([arr(3)], -1.0),
    "clip_grads float64": lambda F: F.clip_grads([np.zeros(3)], 1.0),
    # quantised weights
    "quantize_int8 complex": lambda F: F.quantize_int8(arr(3, 4, dtype=complex)),
    "quantize_int8 scalar": lambda F: F.quantize_int8(np.float32(1.0)),
    "quantize_int8 not finite": lambda F: F.quantize_int8(np.array([[1.0, np.inf]])),
    "dequantize_int8 float q": lambda F: F.dequantize_int8(arr(3, 4), arr(3)),
    "dequantize_int8 float64 scale": lambda F: F.dequantize_int8(arr(3, 4, dtype=np.int8),
                                                                 np.zeros(3)),
    "dequantize_int8 scale shape": lambda F: F.dequantize_int8(arr(3, 4, dtype=np.int8), arr(4)),
    "to_bfloat16 bool": lambda F: F.to_bfloat16(arr(3, dtype=bool)),
    "to_bfloat16 complex": lambda F: F.to_bfloat16(arr(3, dtype=complex)),
    "round_bfloat16 bool": lambda F: F.round_bfloat16(arr(3, dtype=bool)),
    "from_bfloat16 float": lambda F: F.from_bfloat16(arr(3)),
}


def raised(call, F):
    with pytest.raises(Exception) as info:
        call(F)
    return type(info.value), str(info.value)


@pytest.mark.parametrize("case", sorted(BAD))
def test_same_error_in_both_twins(case):
    fast = raised(BAD[case], ops)
    ref = raised(BAD[case], reference)
    assert fast[0] in (TypeError, ValueError), fast
    assert ref == fast, f"{case}: reference raised {ref}, ops raised {fast}"
    assert re.match(r"\w+: ", fast[1]), f"{case}: the message names no op: {fast[1]}"


def test_every_public_op_has_a_case():
    """Every function of the API (the twins share __all__) is exercised above."""
    assert sorted(ops.__all__) == sorted(reference.__all__)
    functions = {name for name in ops.__all__ if callable(getattr(ops, name))
                 and not isinstance(getattr(ops, name), type)}
    covered = {case.split()[0] for case in BAD}
    assert functions - covered == set(), functions - covered
