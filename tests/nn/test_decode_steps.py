"""Decode steps through the layers: init_cache() / step() of a decoder layer, a decoder stack
and a Seq2SeqTransformer, one position at a time, equal the forward under a causal target mask
at every position (same block, both backends); beams, reorder, and bad use of a cache."""
import numpy as np
import pytest

from conftest import assert_close
from fastattn import nn as fnn
from nn_util import *  # noqa: F401,F403  (helpers and constants)
from nn_util import TORCH_WARNINGS
from tolerances import TOL, max_rel, scaled

pytestmark = TORCH_WARNINGS

BACKENDS = ["fast", "reference"]


def stepped(module, tgt, memory, kpm, beams=1):
    """Run module.step over tgt (B, T, C) one position at a time -> (B, T, C)."""
    Bn, Tn, _ = tgt.shape
    cache = module.init_cache(memory, kpm, beams=beams, max_len=Tn)
    outs = []
    for t in range(Tn):
        x = np.repeat(tgt[:, t], beams, axis=0)                # every beam the same input
        y = module.step(x, cache).reshape(Bn, beams, -1)
        assert np.array_equal(y[:, 0:1].repeat(beams, 1), y)   # beams of a source agree
        outs.append(y[:, 0])
    assert cache.t == Tn
    return np.stack(outs, axis=1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("beams", [1, 3])
def test_decoder_layer_and_stack_steps_equal_the_causal_forward(rng, backend, norm_first,
                                                               beams):
    layer = fnn.TransformerDecoderLayer(C, H, F, norm_first=norm_first, backend=backend, seed=3)
    layer.norm1.bias[...] = rng.standard_normal(C)            # off-init norms and biases
    layer.multihead_attn.in_proj_bias[...] = rng.standard_normal(3 * C)
    stack = fnn.TransformerDecoder(layer, 2, fnn.LayerNorm(C, backend=backend))
    tgt, mem = features(rng, B, T), features(rng, B, S)
    kpm = padding(B, S, [S, 3, 5])
    for m in (layer, stack):
        want = m(tgt, mem, tgt_is_causal=True, memory_key_padding_mask=kpm)
        assert_close(stepped(m, tgt, mem, kpm, beams), want, **scaled(TOL["nn_backends"], want),
                     name=type(m).__name__)


@pytest.mark.parametrize("backend", BACKENDS)
def test_seq2seq_step_logits_equal_the_forward(rng, backend):
    m = fnn.Seq2SeqTransformer(2, 2, C, H, V_SRC, V_TGT, F, pad_id=PAD, backend=backend, seed=5)
    src = token_batch(rng, V_SRC, [S, 3, 5], S)
    tgt = token_batch(rng, V_TGT, [T, T, T], T)
    want = m(src, tgt, tgt_key_padding_mask=np.zeros(tgt.shape, bool))
    cache = m.init_cache(src, beams=1, max_len=T)
    got = np.stack([m.step(tgt[:, t], cache) for t in range(T)], axis=1)
    assert_close(got, want, **scaled(TOL["nn_backends"], want), name="logits")


@pytest.mark.parametrize("backend", BACKENDS)
def test_reorder_continues_the_moved_rows(rng, backend):
    """Rows swapped, then a source dropped: each surviving row continues its own prefix."""
    m = fnn.Seq2SeqTransformer(1, 2, C, H, V_SRC, V_TGT, F, backend=backend, seed=6)
    src = token_batch(rng, V_SRC, [S, S, S], S)
    tgt = rng.integers(2, V_TGT, size=(3, 2, 4))                # (source, beam, T)
    cache = m.init_cache(src, beams=2, max_len=4)
    m.step(tgt[:, :, 0].reshape(-1), cache)
    m.step(tgt[:, :, 1].reshape(-1), cache)
    perm = np.array([1, 0, 2, 3, 5, 4])                         # swap the beams of 0 and 2
    tgt = tgt.reshape(6, 4)[perm]
    cache.reorder(perm)
    m.step(tgt[:, 2], cache)
    keep_src = np.array([0, 2])                                  # drop source 1
    rows = np.array([0, 1, 4, 5])
    cache.reorder(rows, keep_src)
    assert cache.rows == 4 and cache.sources == 2
    got = m.step(tgt[rows, 3], cache)                            # (4, V)
    full = m(np.repeat(src, 2, axis=0)[perm][rows], tgt[rows])   # the forward on each row
    assert_close(got, full[:, 3], **scaled(TOL["nn_backends"], full[:, 3]),
                 name="logits after reorder")


def test_bad_use_of_a_cache_is_a_clear_error(rng):
    m = fnn.Seq2SeqTransformer(1, 1, C, H, V_SRC, V_TGT, F, max_len=8, seed=7)
    src = token_batch(rng, V_SRC, [S, S], S)
    cache = m.init_cache(src, beams=2, max_len=2)
    with pytest.raises(ValueError, match=r"x has 3 rows but the cache holds 4"):
        m.step(np.ones(3, np.int64), cache)
    with pytest.raises(ValueError, match=r"tokens must be \(R,\)"):
        m.step(np.ones((4, 1), np.int64), cache)
    with pytest.raises(ValueError, match=r"token id 99 is out of range"):
        m.step(np.full(4, 99), cache)
    m.step(np.ones(4, np.int64), cache)
    m.step(np.ones(4, np.int64), cache)
    with pytest.raises(ValueError, match=r"max_len=2 positions, all written"):
        m.step(np.ones(4, np.int64), cache)
    with pytest.raises(ValueError, match=r"beams must be a positive int"):
        m.init_cache(src, beams=0, max_len=2)
    with pytest.raises(ValueError, match=r"max_len=9 exceeds the model's max_len=8"):
        m.init_cache(src, max_len=9)
    layer = m.transformer.decoder.layers[0]
    lc = layer.init_cache(features(rng, 2, S), max_len=1)
    with pytest.raises(ValueError, match=r"x must be \(rows, d_model\)"):
        layer.step(features(rng, 2, 1), lc)


# ---- a decode step's plan, made once per cache (DecoderCache.plan) ----------------------------

def _logits(m, src, tokens, beams, edit=None):
    """Logits of init_cache + one step per column of tokens (R, n); edit(m, t), if given, runs
    before step t. -> ((n, R, V) logits, the cache)."""
    cache = m.init_cache(src, beams=beams, max_len=tokens.shape[1])
    out = []
    for t in range(tokens.shape[1]):
        if edit is not None:
            edit(m, t)
        out.append(m.step(tokens[:, t], cache))
    return np.stack(out), cache


@pytest.mark.parametrize("compute_type", ["float32", "int8", "bf16"])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("sources,beams", [(1, 1), (3, 2), (9, 4)])   # 36 rows: past the packed
def test_planned_steps_give_the_reference_backends_steps(rng, compute_type, norm_first,
                                                         sources, beams):  # products' 32
    m = fnn.Seq2SeqTransformer(2, 2, C, H, V_SRC, V_TGT, F, pad_id=PAD, norm_first=norm_first,
                               activation="gelu", seed=11).quantize(compute_type)
    src = token_batch(rng, V_SRC, [S] + [3] * (sources - 1), S)       # padded memory rows
    tokens = rng.integers(2, V_TGT, size=(sources * beams, 4))
    got, cache = _logits(m, src, tokens, beams)
    layers, generator = cache._plan                       # one plan for every layer
    assert len(layers) == len(m.transformer.decoder.layers) and callable(generator)
    again, _ = _logits(m, src, tokens, beams)
    np.testing.assert_array_equal(again, got)               # a plan repeats bit for bit
    want, _ = _logits(m.to_backend("reference"), src, tokens, beams)
    if compute_type == "float32":
        assert_close(got, want, **scaled(TOL["nn_backends"], want), name="logits")
    else:
        assert_close(got, want, **max_rel(want, TOL["quantized_same_math"][compute_type]),
                     name="logits")


def _new(a):
    return a + np.float32(0.25)


class _Doubled(fnn.Linear):
    """A Linear whose inference output is doubled: a subclass overriding _apply."""

    def _apply(self, x, ws, key=None, activation=None):
        return 2 * super()._apply(x, ws, key, activation)


def _doubled(old):
    new = _Doubled(old.in_features, old.out_features, seed=0)
    new.weight, new.bias = old.weight, old.bias
    return new


EDITS = {   # a change to the weights between steps of one cache
    "in_proj_weight assigned": lambda l: setattr(l.self_attn, "in_proj_weight",
                                                 _new(l.self_attn.in_proj_weight)),
    "out_proj bias assigned": lambda l: setattr(l.multihead_attn.out_proj, "bias",
                                                _new(l.multihead_attn.out_proj.bias)),
    "linear2 weight assigned": lambda l: setattr(l.linear2, "weight", _new(l.linear2.weight)),
    "activation changed": lambda l: setattr(l, "activation", "gelu"),
    "edited in place": lambda l: (l.linear1.weight.__iadd__(np.float32(0.25)),
                                  l.multihead_attn.in_proj_weight.__iadd__(np.float32(0.25))),
    "out_proj alone on the reference backend": lambda l: l.self_attn.out_proj.to_backend(
        "reference"),
    "out_proj replaced by a Linear subclass": lambda l: setattr(
        l.multihead_attn, "out_proj", _doubled(l.multihead_attn.out_proj)),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_steps_follow_changed_weights(rng, edit):
    """A weight replaced or edited in place between two steps of one cache: the next steps use
    the new weight, on the fast backend as on the reference one (whose steps compute with
    the arrays as they are)."""
    src = token_batch(rng, V_SRC, [S, 4], S)
    tokens = rng.integers(2, V_TGT, size=(2, 4))
    runs = []
    for backend in ("fast", "reference"):
        m = fnn.Seq2SeqTransformer(1, 2, C, H, V_SRC, V_TGT, F, seed=12, backend=backend)
        change = lambda m, t: EDITS[edit](m.transformer.decoder.layers[1]) if t == 2 else None
        runs.append(_logits(m, src, tokens, 1, change)[0])
    assert_close(runs[0], runs[1], **scaled(TOL["nn_backends"], runs[1]), name="logits")
    assert not np.array_equal(runs[0][2:], _logits(
        fnn.Seq2SeqTransformer(1, 2, C, H, V_SRC, V_TGT, F, seed=12), src, tokens,
        1)[0][2:])                                              # the edit did change them


def test_steps_follow_a_backend_switch(rng):
    """A cache made on the fast backend, stepped after to_backend("reference") and back: each
    step runs on the backend the model is on then."""
    m = fnn.Seq2SeqTransformer(1, 1, C, H, V_SRC, V_TGT, F, seed=13)
    src = token_batch(rng, V_SRC, [S, S], S)
    tokens = rng.integers(2, V_TGT, size=(2, 4))
    switch = {1: "reference", 3: "fast"}
    got, _ = _logits(m, src, tokens, 1,
                     lambda m, t: m.to_backend(switch[t]) if t in switch else None)
    fast, _ = _logits(m.to_backend("fast"), src, tokens, 1)
    reference, _ = _logits(m.to_backend("reference"), src, tokens, 1)
    np.testing.assert_array_equal(got[0], fast[0])
    assert_close(got, reference, **scaled(TOL["nn_backends"], reference), name="logits")


@pytest.mark.parametrize("norm_first", [False, True])
def test_steps_add_a_finite_memory_padding_mask(rng, norm_first):
    """A float memory_key_padding_mask of torch.finfo(float32).min (Hugging Face's padding
    value) is added to the cross-attention scores, not read as -inf: a source padded
    throughout averages its memory rows. The decode steps (one query row at a time, a key
    bias) and the forward (tiled) agree, on both backends."""
    mem = features(rng, B, S)
    tgt = features(rng, B, T)
    kpm = np.zeros((B, S), np.float32)
    kpm[0] = np.finfo(np.float32).min                        # padded throughout
    kpm[1, 4:] = np.finfo(np.float32).min
    kpm[2, 3:] = -np.inf
    outs = {}
    for backend in BACKENDS:
        layer = fnn.TransformerDecoderLayer(C, H, F, norm_first=norm_first, backend=backend,
                                            seed=8)
        want = layer(tgt, mem, tgt_is_causal=True, memory_key_padding_mask=kpm)
        got = stepped(layer, tgt, mem, kpm)
        assert np.isfinite(got).all()
        assert_close(got, want, **scaled(TOL["nn_backends"], want),
                     name=f"{backend} steps vs forward")
        outs[backend] = got
    assert_close(outs["fast"], outs["reference"], **scaled(TOL["nn_backends"], outs["reference"]),
                 name="fast vs reference")
