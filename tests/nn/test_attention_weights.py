"""attention_weights() of Transformer and Seq2SeqTransformer: the weights of every layer.

Against torch: each torch MultiheadAttention's inputs and masks are captured by a forward
pre-hook while the torch model runs its forward (fast path off, so every layer goes through its
MultiheadAttention module), then that module is called again on them with need_weights=True,
average_attn_weights=False: torch's own weights for the same layer input.
"""
import contextlib

import numpy as np
import pytest

from conftest import assert_close, requires_torch
from fastattn import nn as fnn
from fastattn.nn.transformer import recording_workspace
from nn_util import *  # noqa: F401,F403  (helpers and constants)
from nn_util import TORCH_WARNINGS
from tolerances import TOL, max_rel, scaled

pytestmark = TORCH_WARNINGS

KINDS = ("encoder", "decoder", "cross")


# ----------------------------------------------------------------------------------------------
# helpers


@contextlib.contextmanager
def torch_weights(torch, transformer):
    """Collects {"encoder": [...], "decoder": [...], "cross": [...]} (B, H, Lq, Lk) arrays of
    torch.nn.Transformer `transformer` while the block runs one forward (fast path off)."""
    calls = {}

    def hook(mha):
        def pre(module, args, kwargs):
            calls[mha] = (args, kwargs)
        return pre

    mhas = {"encoder": [layer.self_attn for layer in transformer.encoder.layers],
            "decoder": [layer.self_attn for layer in transformer.decoder.layers],
            "cross": [layer.multihead_attn for layer in transformer.decoder.layers]}
    handles = [m.register_forward_pre_hook(hook(m), with_kwargs=True)
               for ms in mhas.values() for m in ms]
    out = {}
    old = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.inference_mode():
            yield out
            for kind, ms in mhas.items():
                out[kind] = []
                for m in ms:
                    args, kwargs = calls[m]
                    kwargs = {**kwargs, "need_weights": True, "average_attn_weights": False}
                    out[kind].append(m(*args, **kwargs)[1].numpy())
    finally:
        torch.backends.mha.set_fastpath_enabled(old)
        for h in handles:
            h.remove()


def check_shapes(w, layers, B, S, T):
    assert set(w) == set(KINDS)
    shapes = {"encoder": (B, H, S, S), "decoder": (B, H, T, T), "cross": (B, H, T, S)}
    for kind in KINDS:
        assert len(w[kind]) == layers[kind], kind
        for a in w[kind]:
            assert a.shape == shapes[kind] and a.dtype == np.float32, (kind, a.shape, a.dtype)


def seq2seq(backend="fast", **kw):
    kw = {"dropout": 0.0, "seed": 3, **kw}
    return fnn.Seq2SeqTransformer(2, 2, C, H, V_SRC, V_TGT, F, pad_id=PAD, backend=backend, **kw)


# ----------------------------------------------------------------------------------------------
# against torch


def test_seq2seq_weights_vs_torch(rng):
    torch = requires_torch()
    tm, fm = seq2seq_pair(torch)
    batch = tutorial_batch(rng)
    src, tgt = batch[:2]
    with torch_weights(torch, tm.transformer) as ref:
        tm(*tutorial_args(torch, *batch))
    w = fm.attention_weights(src, tgt)                          # masks from pad_id, causal
    check_shapes(w, dict(encoder=2, decoder=2, cross=2), B, S, T)
    for kind in KINDS:
        for i, (a, r) in enumerate(zip(w[kind], ref[kind])):
            assert r.shape == a.shape
            assert_close(a, r, **max_rel(r), name=f"{kind} layer {i}")


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_weights_vs_torch(rng, norm_first):
    torch = requires_torch()
    tm = torch_transformer(torch, norm_first=norm_first)
    fm = fast_transformer(tm, norm_first=norm_first)
    src, tgt = features(rng, B, S), features(rng, B, T)
    kw = dict(tgt_mask=fnn.generate_square_subsequent_mask(T),
              src_key_padding_mask=padding(B, S, [S, 4, 6]),
              tgt_key_padding_mask=padding(B, T, [T, 2, 4]),
              memory_key_padding_mask=padding(B, S, [S, 4, 6]))
    with torch_weights(torch, tm) as ref:
        tm(t(torch, src), t(torch, tgt), **{k: t(torch, v) for k, v in kw.items()})
    w = fm.attention_weights(src, tgt, **kw)
    check_shapes(w, dict(encoder=2, decoder=2, cross=2), B, S, T)
    for kind in KINDS:
        for i, (a, r) in enumerate(zip(w[kind], ref[kind])):
            assert_close(a, r, **max_rel(r), name=f"{kind} layer {i}")


# ----------------------------------------------------------------------------------------------
# what the weights must be, without torch


@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_rows_causal_and_padding(rng, backend):
    m = seq2seq(backend)
    src = token_batch(rng, V_SRC, [S, 4, 6], S)
    tgt = token_batch(rng, V_TGT, [T, 2, 4], T)
    w = m.attention_weights(src, tgt)
    src_pad, tgt_pad = src == PAD, tgt == PAD
    for kind in KINDS:
        for a in w[kind]:
            assert np.all(a >= 0)
            sums = a.sum(-1)                                   # key 0 is never masked
            assert_close(sums, np.ones_like(sums), **TOL["nn_weight_row_sums"], name=kind)
    upper = np.triu(np.ones((T, T), dtype=bool), k=1)
    for a in w["decoder"]:
        assert np.all(a[:, :, upper] == 0.0)                         # causal: exactly 0
        assert np.all(a[np.broadcast_to(tgt_pad[:, None, None, :], a.shape)] == 0.0)
    for kind in ("encoder", "cross"):                                # padded source keys
        for a in w[kind]:
            assert np.all(a[np.broadcast_to(src_pad[:, None, None, :], a.shape)] == 0.0)


def test_rows_with_no_allowed_key_are_zero(rng):
    m = fast_transformer()
    src, tgt = features(rng, 2, S), features(rng, 2, T)
    memory_mask = np.zeros((T, S), dtype=bool)
    memory_mask[1] = True                                # query 1 of the cross-attention: no key
    w = m.attention_weights(src, tgt, memory_mask=memory_mask)
    for a in w["cross"]:
        assert np.all(a[:, :, 1] == 0.0)
        rows = np.delete(a, 1, axis=2)
        sums = rows.sum(-1)
        assert_close(sums, np.ones_like(sums), **TOL["nn_weight_row_sums"], name="cross rows")
    for a in w["encoder"] + w["decoder"]:                # no mask, no causal: full rows
        sums = a.sum(-1)
        assert_close(sums, np.ones_like(sums), **TOL["nn_weight_row_sums"], name="full rows")
        assert np.all(a > 0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_fast_vs_reference(rng, norm_first):
    fast = seq2seq("fast", norm_first=norm_first)
    ref = seq2seq("reference", norm_first=norm_first)
    src = token_batch(rng, V_SRC, [S, 4, 6], S)
    tgt = token_batch(rng, V_TGT, [T, 2, 4], T)
    wf, wr = fast.attention_weights(src, tgt), ref.attention_weights(src, tgt)
    for kind in KINDS:
        for i, (a, r) in enumerate(zip(wf[kind], wr[kind])):
            # nn_backends' atol unscaled: the weights are at most 1
            assert_close(a, r, rtol=TOL["nn_backends"]["rtol"], atol=TOL["nn_backends"]["atol"],
                         name=f"{kind} layer {i}")


def test_forward_unchanged_by_asking(rng):
    m = seq2seq()
    src = token_batch(rng, V_SRC, [S, 4, 6], S)
    tgt = token_batch(rng, V_TGT, [T, 2, 4], T)
    before = m(src, tgt)
    m.attention_weights(src, tgt)
    after = m(src, tgt)
    assert np.array_equal(before, after)
    # the recording pass computes the forward's output through the weight-returning attention
    recorded, _ = m._forward(src, tgt, ws=recording_workspace(m, "test"))
    assert_close(recorded, before, **scaled(TOL["nn_backends"], before),
                 name="logits of the recording pass")


def test_given_masks_equal_pad_id_masks(rng):
    m = seq2seq()
    src = token_batch(rng, V_SRC, [S, 4, 6], S)
    tgt = token_batch(rng, V_TGT, [T, 2, 4], T)
    implicit = m.attention_weights(src, tgt)
    m.pad_id = None
    explicit = m.attention_weights(src, tgt, src_key_padding_mask=src == PAD,
                                   tgt_key_padding_mask=tgt == PAD)
    for kind in KINDS:
        for a, b in zip(implicit[kind], explicit[kind]):
            assert np.array_equal(a, b)


def test_lengths_and_layer_counts(rng):
    m = fnn.Seq2SeqTransformer(3, 1, C, H, V_SRC, V_TGT, F, dropout=0.0, pad_id=PAD, seed=0)
    src = token_batch(rng, V_SRC, [9, 9], 9)
    tgt = token_batch(rng, V_TGT, [1, 1], 1)
    check_shapes(m.attention_weights(src, tgt), dict(encoder=3, decoder=1, cross=1), 2, 9, 1)


def test_empty_batch():
    m = seq2seq()
    src, tgt = np.zeros((0, S), np.int64), np.zeros((0, T), np.int64)
    assert m(src, tgt).shape == (0, T, V_TGT)
    w = m.attention_weights(src, tgt)
    check_shapes(w, dict(encoder=2, decoder=2, cross=2), 0, S, T)


def test_train_mode_is_refused(rng):
    m = seq2seq().train()
    src = token_batch(rng, V_SRC, [S], S)
    with pytest.raises(RuntimeError, match="eval"):
        m.attention_weights(src, src[:, :T])
    tr = fast_transformer().train()
    with pytest.raises(RuntimeError, match="eval"):
        tr.attention_weights(features(rng, 1, S), features(rng, 1, T))
