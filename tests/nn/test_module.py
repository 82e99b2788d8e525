"""The module base: state_dict keys and load_state_dict, bad input, buffer reuse.
"""

import numpy as np
import pytest

from conftest import assert_close, requires_torch
from fastattn import nn as fnn
from nn_util import *  # noqa: F401,F403  (helpers and constants)
from nn_util import TORCH_WARNINGS
from tolerances import TOL, scaled

pytestmark = TORCH_WARNINGS


# ----------------------------------------------------------------------------------------------
# state_dict keys and load_state_dict


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_state_dict_keys_match_torch(norm_first, bias):
    torch = requires_torch()
    tm = torch_transformer(torch, norm_first=norm_first, bias=bias)
    fm = fast_transformer(norm_first=norm_first, bias=bias)
    tsd, fsd = tm.state_dict(), fm.state_dict()
    assert list(fsd) == list(tsd)
    for k in tsd:
        assert fsd[k].shape == tuple(tsd[k].shape), k
        assert fsd[k].dtype == np.float32 and fsd[k].flags.c_contiguous, k


def test_bias_false_has_no_bias_parameters():
    """torch.nn.Transformer(bias=False) has no bias at all: Linear, MultiheadAttention and
    LayerNorm (LayerNorm(bias=False)) alike, so neither may this one."""
    keys = list(fast_transformer(bias=False).state_dict())
    assert [k for k in keys if k.endswith("bias")] == []
    assert "encoder.layers.0.norm1.weight" in keys


def test_load_state_dict_copies_values():
    torch = requires_torch()
    tm = torch_transformer(torch, seed=21)
    fm = fast_transformer()
    assert fm.load_state_dict(tm.state_dict()) == ([], [])
    for k, v in tm.state_dict().items():
        assert np.array_equal(fm.state_dict()[k], v.numpy()), k


def test_load_state_dict_numpy_round_trip(rng):
    a, b = fast_transformer(seed=1), fast_transformer(seed=2)
    sd = {k: v.astype(np.float64) * 1.0 for k, v in a.state_dict().items()}   # float64 too
    b.load_state_dict(sd)
    for k, v in a.state_dict().items():
        assert b.state_dict()[k].dtype == np.float32
        assert np.array_equal(b.state_dict()[k], v), k
    src, tgt = features(rng, 2, S), features(rng, 2, T)
    assert np.array_equal(a(src, tgt), b(src, tgt))
    sd["decoder.norm.bias"][...] = 99.0           # b holds a copy, not the caller's arrays
    assert not np.any(b.decoder.norm.bias == 99.0)


def test_load_state_dict_strict_errors_name_every_key():
    m = fast_transformer()
    sd = dict(m.state_dict())
    del sd["encoder.layers.1.linear2.bias"]
    del sd["decoder.norm.weight"]
    sd["decoder.layers.0.extra.weight"] = np.zeros(3, np.float32)
    sd["encoder.layers.0.norm1.weight"] = np.zeros(C + 1, np.float32)
    with pytest.raises(ValueError) as exc:
        m.load_state_dict(sd)
    msg = str(exc.value)
    for needle in ("encoder.layers.1.linear2.bias", "decoder.norm.weight",
                   "decoder.layers.0.extra.weight", "encoder.layers.0.norm1.weight",
                   f"({C},)", f"({C + 1},)", "missing", "unexpected", "shape"):
        assert needle in msg, (needle, msg)


@pytest.mark.parametrize("problem", ["missing", "unexpected", "shape"])
def test_load_state_dict_strict_each_problem(problem):
    m = fast_transformer()
    before = {k: v.copy() for k, v in m.state_dict().items()}
    sd = {k: v + 1.0 for k, v in m.state_dict().items()}
    key = "decoder.layers.1.multihead_attn.in_proj_weight"
    if problem == "missing":
        del sd[key]
    elif problem == "unexpected":
        key = "decoder.layers.1.multihead_attn.bias_k"
        sd[key] = np.zeros((1, 1, C), np.float32)
    else:
        sd[key] = np.zeros((3 * C, C + 4), np.float32)
    with pytest.raises(ValueError, match=problem) as exc:
        m.load_state_dict(sd)
    assert key in str(exc.value)
    if problem == "shape":
        assert str((3 * C, C)) in str(exc.value) and str((3 * C, C + 4)) in str(exc.value)
    for k, v in m.state_dict().items():          # a failed strict load changes nothing
        assert np.array_equal(v, before[k]), k


def test_load_state_dict_non_strict_returns_missing_and_unexpected():
    m = fast_transformer()
    sd = {k: v + 1.0 for k, v in m.state_dict().items()}
    del sd["encoder.norm.bias"]
    sd["generator.weight"] = np.zeros((3, C), np.float32)
    old_bias = m.encoder.norm.bias.copy()
    missing, unexpected = m.load_state_dict(sd, strict=False)
    assert list(missing) == ["encoder.norm.bias"]
    assert list(unexpected) == ["generator.weight"]
    assert np.array_equal(m.encoder.norm.bias, old_bias)
    assert np.array_equal(m.decoder.norm.bias, sd["decoder.norm.bias"])
    sd["decoder.norm.bias"] = np.zeros(C + 1, np.float32)
    with pytest.raises(ValueError, match=r"decoder\.norm\.bias"):   # shapes still checked
        m.load_state_dict(sd, strict=False)


def test_load_state_dict_other_config_names_shapes():
    small = fast_transformer()
    big = fast_transformer(d_model=2 * C, nhead=H)
    with pytest.raises(ValueError) as exc:
        small.load_state_dict(big.state_dict())
    msg = str(exc.value)
    assert "encoder.layers.0.self_attn.in_proj_weight" in msg
    assert str((3 * C, C)) in msg and str((6 * C, 2 * C)) in msg


def test_load_state_dict_rejects_non_mapping_and_non_numeric():
    m = fast_transformer()
    with pytest.raises(TypeError):
        m.load_state_dict(list(m.state_dict().items()))
    sd = dict(m.state_dict())
    sd["decoder.norm.bias"] = np.array(["a"] * C)
    with pytest.raises(TypeError, match=r"decoder\.norm\.bias"):
        m.load_state_dict(sd)


# ----------------------------------------------------------------------------------------------
# bad input


@pytest.fixture(scope="module")
def s2s():
    return fnn.Seq2SeqTransformer(1, 1, C, H, 11, 13, F, pad_id=0, max_len=16, seed=5)


@pytest.mark.parametrize("which,bad,vocab", [
    ("src", 11, 11), ("src", -1, 11), ("tgt", 13, 13), ("tgt", -3, 13), ("src", 10**6, 11),
])
def test_token_ids_out_of_range(s2s, which, bad, vocab):
    src, tgt = np.array([[1, 2, 3]]), np.array([[1, 2]])
    (src if which == "src" else tgt)[0, 1] = bad
    named = rf"(?<![\w-]){bad}\b"                 # the id itself, not a longer number
    with pytest.raises(ValueError, match=rf"(?s){named}.*vocabulary of {vocab}\b"):
        s2s(src, tgt)
    if which == "src":
        with pytest.raises(ValueError, match=named):
            s2s.encode(src)
    else:
        with pytest.raises(ValueError, match=named):
            s2s.decode(tgt, np.zeros((1, 3, C), np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, bool])
def test_token_ids_must_be_integers(s2s, dtype):
    ids = np.array([[1, 0, 1]]).astype(dtype)
    with pytest.raises(TypeError, match="integer"):
        s2s(ids, np.array([[1, 2]]))
    with pytest.raises(TypeError, match="integer"):
        s2s(np.array([[1, 2]]), ids)


def test_token_ids_must_be_2d_and_within_max_len(s2s):
    with pytest.raises(ValueError, match=r"src_ids.*\(3,\)"):
        s2s.encode(np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="max_len"):
        s2s.encode(np.ones((1, 17), np.int64))


def test_wrong_d_model_input():
    m = fast_transformer()
    good_src, good_tgt = np.zeros((2, S, C), np.float32), np.zeros((2, T, C), np.float32)
    with pytest.raises(ValueError, match=rf"src.*{C}.*\(2, {S}, {C + 1}\)"):
        m(np.zeros((2, S, C + 1), np.float32), good_tgt)
    with pytest.raises(ValueError, match=rf"tgt.*\(2, {T}, {C - 1}\)"):
        m(good_src, np.zeros((2, T, C - 1), np.float32))
    with pytest.raises(ValueError, match=rf"tgt must be unbatched.*\(2, {T}, {C}\)"):
        m(np.zeros((2, C), np.float32), good_tgt)       # an unbatched src needs a (T, C) tgt
    with pytest.raises(ValueError, match=rf"src.*\(2, 3, 4, {C}\)"):
        m(np.zeros((2, 3, 4, C), np.float32), good_tgt)
    with pytest.raises(ValueError, match="batch"):
        m(good_src, np.zeros((3, T, C), np.float32))
    with pytest.raises(ValueError, match="memory"):
        m.decoder(good_tgt, np.zeros((2, S, C + 1), np.float32))
    with pytest.raises(ValueError):
        fnn.MultiheadAttention(C, H)(good_src, np.zeros((2, S, 8), np.float32),
                                     np.zeros((2, S, 8), np.float32))
    with pytest.raises(ValueError, match=rf"\(\.\.\., {C}\)"):
        fnn.Linear(C, 8)(np.zeros((2, C + 1), np.float32))


@pytest.mark.parametrize("name,value,pattern", [
    ("src_key_padding_mask", np.zeros((2, S + 1), bool),
     rf"src_key_padding_mask.*\(2, {S + 1}\)"),
    ("tgt_key_padding_mask", np.zeros((2, T - 1), bool),
     rf"tgt_key_padding_mask.*\(2, {T - 1}\)"),
    ("memory_key_padding_mask", np.zeros((3, S), bool),
     rf"memory_key_padding_mask.*\(3, {S}\)"),
    ("tgt_mask", np.zeros((T, T + 1), np.float32), rf"tgt_mask.*\({T}, {T + 1}\)"),
    ("src_mask", np.zeros((S,), bool), rf"src_mask.*\({S},\)"),
    ("memory_mask", np.zeros((S, T), bool), rf"memory_mask.*\({S}, {T}\)"),
    ("tgt_mask", np.zeros((2 * H + 1, T, T), bool), rf"tgt_mask.*\({2 * H + 1}, {T}, {T}\)"),
])
def test_mask_wrong_shape(rng, name, value, pattern):
    m = fast_transformer()
    with pytest.raises(ValueError, match=pattern):
        m(features(rng, 2, S), features(rng, 2, T), **{name: value})


@pytest.mark.parametrize("name,shape", [
    ("src_key_padding_mask", (2, S)), ("tgt_mask", (T, T)), ("memory_mask", (T, S)),
    ("src_mask", (S, S)),
])
def test_integer_mask_is_type_error(rng, name, shape):
    m = fast_transformer()
    with pytest.raises(TypeError, match=name):
        m(features(rng, 2, S), features(rng, 2, T), **{name: np.zeros(shape, np.int64)})


def test_features_must_be_numeric(rng):
    m = fast_transformer()
    with pytest.raises(TypeError):
        m(np.zeros((2, S, C), bool), features(rng, 2, T))


@pytest.mark.parametrize("make", [
    lambda: fnn.Transformer(30, 4, 1, 1, F),
    lambda: fnn.MultiheadAttention(30, 4),
    lambda: fnn.TransformerEncoderLayer(30, 4, F),
    lambda: fnn.TransformerDecoderLayer(30, 4, F),
    lambda: fnn.Seq2SeqTransformer(1, 1, 30, 4, 11, 13, F),
])
def test_d_model_not_divisible_by_nhead(make):
    with pytest.raises(ValueError, match=r"30.*divisible.*4"):
        make()


@pytest.mark.parametrize("make", [
    lambda a: fnn.Transformer(C, H, 1, 1, F, activation=a),
    lambda a: fnn.TransformerEncoderLayer(C, H, F, activation=a),
    lambda a: fnn.TransformerDecoderLayer(C, H, F, activation=a),
    lambda a: fnn.Seq2SeqTransformer(1, 1, C, H, 11, 13, F, activation=a),
])
@pytest.mark.parametrize("activation", ["tanh", "RELU", None])
def test_unknown_activation(make, activation):
    with pytest.raises(ValueError, match="activation"):
        make(activation)


@pytest.mark.parametrize("make", [
    lambda b: fnn.Transformer(C, H, 1, 1, F, backend=b),
    lambda b: fnn.MultiheadAttention(C, H, backend=b),
    lambda b: fnn.Linear(C, C, backend=b),
    lambda b: fnn.Seq2SeqTransformer(1, 1, C, H, 11, 13, F, backend=b),
    lambda b: fnn.Transformer(C, H, 1, 1, F).to_backend(b),
])
def test_unknown_backend(make):
    with pytest.raises(ValueError, match=r"backend.*'cuda'"):
        make("cuda")


@pytest.mark.parametrize("kw", [dict(num_encoder_layers=0), dict(d_model=0),
                                dict(dim_feedforward=-1), dict(nhead=0)])
def test_non_positive_sizes(kw):
    with pytest.raises(ValueError):
        fast_transformer(**kw)


# ----------------------------------------------------------------------------------------------
# buffer reuse: inputs untouched, repeated calls identical, results never alias the buffers


def test_forward_leaves_inputs_and_weights_unchanged(rng):
    m = fast_transformer(seed=40)
    weights = {k: v.copy() for k, v in m.state_dict().items()}
    src, tgt = features(rng, B, S), features(rng, B, T)
    kpm, tmask = padding(B, S, [S, 3, 5]), fnn.generate_square_subsequent_mask(T)
    copies = [a.copy() for a in (src, tgt, kpm, tmask)]
    out1 = m(src, tgt, tgt_mask=tmask, src_key_padding_mask=kpm, memory_key_padding_mask=kpm)
    for a, c in zip((src, tgt, kpm, tmask), copies):
        assert np.array_equal(a, c)
    for k, v in m.state_dict().items():
        assert np.array_equal(v, weights[k]), k
    out2 = m(src, tgt, tgt_mask=tmask, src_key_padding_mask=kpm, memory_key_padding_mask=kpm)
    assert np.array_equal(out1, out2)
    assert not np.shares_memory(out1, out2)


def test_layers_and_mha_leave_inputs_unchanged(rng):
    x, mem = features(rng, B, S), features(rng, B, T)
    xc, mc = x.copy(), mem.copy()
    enc = fnn.TransformerEncoderLayer(C, H, F, seed=41)
    dec = fnn.TransformerDecoderLayer(C, H, F, norm_first=True, seed=42)
    mha = fnn.MultiheadAttention(C, H, seed=43)
    a = enc(x)
    b = dec(x, mem)
    c, _ = mha(x, x, x, need_weights=False)
    d, _ = mha(x, mem, mem, need_weights=False)
    assert np.array_equal(x, xc) and np.array_equal(mem, mc)
    assert np.array_equal(enc(x), a) and np.array_equal(dec(x, mem), b)
    assert np.array_equal(mha(x, x, x, need_weights=False)[0], c)
    assert np.array_equal(mha(x, mem, mem, need_weights=False)[0], d)


def test_results_survive_later_calls_of_other_shapes(rng):
    m = fast_transformer(seed=44)
    src, tgt = features(rng, B, S), features(rng, B, T)
    out = m(src, tgt, tgt_is_causal=True)
    keep = out.copy()
    m(features(rng, 1, 2 * S), features(rng, 1, 3 * T))       # larger buffers
    m(features(rng, 4, 2), features(rng, 4, 1))               # smaller ones
    assert np.array_equal(out, keep)                           # not a view of a buffer
    assert np.array_equal(m(src, tgt, tgt_is_causal=True), keep)
    mha = fnn.MultiheadAttention(C, H, seed=45)
    o1, _ = mha(src, src, src, need_weights=False)
    k1 = o1.copy()
    mha(tgt, tgt, tgt, need_weights=False)
    assert np.array_equal(o1, k1)


def test_seq2seq_repeated_calls_identical(rng):
    m = fnn.Seq2SeqTransformer(2, 2, C, H, V_SRC, V_TGT, F, pad_id=PAD, seed=46)
    src = token_batch(rng, V_SRC, [S, 3, 5], S)
    tgt = token_batch(rng, V_TGT, [T, 2, 4], T)
    sc, tc = src.copy(), tgt.copy()
    a = m(src, tgt)
    mem = m.encode(src)
    memc = mem.copy()
    h = m.decode(tgt, mem, memory_key_padding_mask=src == PAD)
    assert np.array_equal(src, sc) and np.array_equal(tgt, tc) and np.array_equal(mem, memc)
    assert np.array_equal(m(src, tgt), a)
    assert np.array_equal(m.decode(tgt, mem, memory_key_padding_mask=src == PAD), h)
    assert_close(m.generator(h), a, **scaled(TOL["nn_split_forward"], a),
                 name="generator(decode(encode))")


def test_non_contiguous_and_float64_inputs(rng):
    m = fast_transformer(seed=47)
    src, tgt = features(rng, B, S), features(rng, B, T)
    expected = m(src, tgt)
    src_nc = np.asfortranarray(src)
    tgt_strided = np.repeat(tgt, 2, axis=1)[:, ::2]
    assert not src_nc.flags.c_contiguous and not tgt_strided.flags.c_contiguous
    assert np.array_equal(m(src_nc, tgt_strided), expected)
    out64 = m(src.astype(np.float64), tgt.astype(np.float64))
    assert out64.dtype == np.float32 and np.array_equal(out64, expected)


def test_base_forward_memory_stays_within_three_times_weights_plus_one_layer():
    """Issue contract: a Transformer-base forward at B=8, L=128 reuses its activation buffers,
    so the process grows by far less than 3x (weights + one layer's activations)."""
    import sys

    from fastattn.bench import peak_memory_growth

    if not sys.platform.startswith("linux"):
        pytest.skip("peak RSS is read from /proc")
    model = fnn.Transformer(seed=0)
    B, L, C, F = 8, 128, 512, 2048
    rng = np.random.default_rng(0)
    src = rng.standard_normal((B, L, C), dtype=np.float32)
    tgt = rng.standard_normal((B, L, C), dtype=np.float32)
    mask = fnn.generate_square_subsequent_mask(L)
    model(src, tgt, tgt_mask=mask)                       # first call: allocator warm
    _, grown_mib, _, _ = peak_memory_growth(lambda: model(src, tgt, tgt_mask=mask))
    weights_mib = model.parameters_nbytes() / 2 ** 20
    layer_mib = B * L * (3 * C + 3 * C + F) * 4 / 2 ** 20   # qkv, ctx/proj/out, ffn hidden
    assert weights_mib + grown_mib < 3 * (weights_mib + layer_mib), (grown_mib, weights_mib)
    assert grown_mib < weights_mib / 2, (grown_mib, weights_mib)


def test_empty_batches_and_lengths_give_empty_outputs():
    mha = fnn.MultiheadAttention(16, 4, seed=0)
    x = np.zeros((0, 5, 16), np.float32)
    out, w = mha(x, x, x)
    assert out.shape == (0, 5, 16) and w.shape == (0, 5, 5)
    layer = fnn.TransformerEncoderLayer(16, 4, 32, seed=0)
    assert layer(np.zeros((2, 0, 16), np.float32)).shape == (2, 0, 16)
    assert layer(np.zeros((0, 3, 16), np.float32)).shape == (0, 3, 16)
    t = fnn.Transformer(16, 4, 1, 1, 32, seed=0)
    assert t(np.zeros((0, 3, 16), np.float32), np.zeros((0, 2, 16), np.float32)).shape == \
        (0, 2, 16)
    s2s = fnn.Seq2SeqTransformer(1, 1, 16, 4, 10, 12, 32, seed=0)
    mem = s2s.encode(np.zeros((0, 4), np.int64))
    assert mem.shape == (0, 4, 16)
    assert s2s.decode(np.zeros((0, 3), np.int64), mem).shape == (0, 3, 16)
