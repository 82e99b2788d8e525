"""Transformer, its layers and stacks: against torch.nn (random weights), fast vs reference backend,
fully masked rows (zeros where torch gives NaN). See nn_util for what the torch comparisons check.
"""

import numpy as np
import pytest

from conftest import assert_close, requires_torch
from fastattn import _fast, nn as fnn
from nn_util import *  # noqa: F401,F403  (helpers and constants)
from nn_util import TORCH_WARNINGS
from tolerances import TOL, max_rel, scaled

pytestmark = TORCH_WARNINGS


# ----------------------------------------------------------------------------------------------
# Transformer against torch.nn.Transformer


def _masks(rng, case):
    """Transformer keyword masks (NumPy) for one case; every query row keeps key 0."""
    kw = {}
    if case in ("padding", "padding_float_src_mask"):
        kw["src_key_padding_mask"] = padding(B, S, [S, 4, 2])
        kw["tgt_key_padding_mask"] = padding(B, T, [T, 3, 1])
        kw["memory_key_padding_mask"] = kw["src_key_padding_mask"]
    if case in ("float_src_mask", "padding_float_src_mask"):
        kw["src_mask"] = float_mask(rng, S, S)
    if case == "bool_masks":
        kw["src_mask"] = bool_mask(rng, (S, S))
        kw["tgt_mask"] = bool_mask(rng, (T, T))
        kw["memory_mask"] = bool_mask(rng, (T, S))
    if case == "float_memory_mask":
        kw["memory_mask"] = float_mask(rng, T, S)
    if case == "causal_float":
        kw["tgt_mask"] = fnn.generate_square_subsequent_mask(T)
    if case == "causal_bool":
        kw["tgt_mask"] = np.triu(np.ones((T, T), dtype=bool), k=1)
    if case == "causal_padding":
        kw["tgt_mask"] = fnn.generate_square_subsequent_mask(T)
        kw["src_key_padding_mask"] = padding(B, S, [3, S, 5])
        kw["tgt_key_padding_mask"] = padding(B, T, [2, T, 4])
        kw["memory_key_padding_mask"] = kw["src_key_padding_mask"]
    return kw


MASK_CASES = ["none", "padding", "float_src_mask", "padding_float_src_mask", "bool_masks",
              "float_memory_mask", "causal_float", "causal_bool", "causal_padding"]


@pytest.mark.parametrize("case", MASK_CASES)
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_vs_torch(rng, norm_first, activation, case):
    torch = requires_torch()
    tm = torch_transformer(torch, norm_first=norm_first, activation=activation)
    fm = fast_transformer(tm, norm_first=norm_first, activation=activation)
    src, tgt = features(rng, B, S), features(rng, B, T)
    kw = _masks(rng, case)
    with torch_fastpath(torch, kw.values()):
        ref = tm(t(torch, src), t(torch, tgt), **{k: t(torch, v) for k, v in kw.items()})
        ref_mem = tm.encoder(t(torch, src), mask=t(torch, kw.get("src_mask")),
                             src_key_padding_mask=t(torch, kw.get("src_key_padding_mask")))
    out = fm(src, tgt, **kw)
    mem = fm.encoder(src, mask=kw.get("src_mask"),
                     src_key_padding_mask=kw.get("src_key_padding_mask"))
    keep_t = ~kw.get("tgt_key_padding_mask", np.zeros((B, T), bool))
    keep_s = ~kw.get("src_key_padding_mask", np.zeros((B, S), bool))
    assert out.shape == (B, T, C) and out.dtype == np.float32
    assert np.isfinite(out).all()
    assert_close(out[keep_t], ref.numpy()[keep_t], **max_rel(ref.numpy()[keep_t]),
                 name="transformer output")
    assert_close(mem[keep_s], ref_mem.numpy()[keep_s], **max_rel(ref_mem.numpy()[keep_s]),
                 name="encoder memory")


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_is_causal_vs_torch_mask(rng, norm_first):
    """tgt_is_causal / src_is_causal without a mask = torch with the square subsequent mask."""
    torch = requires_torch()
    tm = torch_transformer(torch, norm_first=norm_first)
    fm = fast_transformer(tm, norm_first=norm_first)
    src, tgt = features(rng, B, S), features(rng, B, T)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(T)
    smask = torch.nn.Transformer.generate_square_subsequent_mask(S)
    assert np.array_equal(fnn.Transformer.generate_square_subsequent_mask(T), mask.numpy())
    with torch.inference_mode():
        ref = tm(t(torch, src), t(torch, tgt), tgt_mask=mask, tgt_is_causal=True).numpy()
        ref_s = tm(t(torch, src), t(torch, tgt), src_mask=smask, src_is_causal=True).numpy()
    assert_close(fm(src, tgt, tgt_is_causal=True), ref, **max_rel(ref))
    assert_close(fm(src, tgt, tgt_mask=mask.numpy()), ref, **max_rel(ref))
    assert_close(fm(src, tgt, src_is_causal=True), ref_s, **max_rel(ref_s), name="src_is_causal")
    assert_close(fm(src, tgt, src_mask=smask.numpy()), ref_s, **max_rel(ref_s),
                 name="causal src_mask")


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_longer_sequences_vs_torch(rng, norm_first):
    """Lengths past one attention block, head dim 16, odd lengths, padding and causal."""
    torch = requires_torch()
    torch.manual_seed(9)
    d, Ls, Lt = 64, 67, 45
    tm = torch.nn.Transformer(d, 4, 2, 2, 128, dropout=0.0, batch_first=True,
                              norm_first=norm_first).eval()
    fm = fast_transformer(tm, d_model=d, dim_feedforward=128, norm_first=norm_first)
    src, tgt = features(rng, 2, Ls, d), features(rng, 2, Lt, d)
    kpm, tkpm = padding(2, Ls, [Ls, 29]), padding(2, Lt, [33, Lt])
    mask = fnn.generate_square_subsequent_mask(Lt)
    kw = dict(tgt_mask=mask, src_key_padding_mask=kpm, tgt_key_padding_mask=tkpm,
              memory_key_padding_mask=kpm)
    with torch.inference_mode():
        ref = tm(t(torch, src), t(torch, tgt), **{k: t(torch, v) for k, v in kw.items()})
    out = fm(src, tgt, **kw)
    assert_close(out[~tkpm], ref.numpy()[~tkpm], **max_rel(ref.numpy()[~tkpm]))
    ref_backend = fast_transformer(tm, d_model=d, dim_feedforward=128, norm_first=norm_first,
                                   backend="reference")
    want = ref_backend(src, tgt, **kw)
    assert_close(out, want, **scaled(TOL["nn_backends"], want))


def test_transformer_bias_false_vs_torch(rng):
    torch = requires_torch()
    tm = torch_transformer(torch, bias=False)
    fm = fast_transformer(tm, bias=False)
    src, tgt = features(rng, B, S), features(rng, B, T)
    mask = fnn.generate_square_subsequent_mask(T)
    with torch.inference_mode():
        ref = tm(t(torch, src), t(torch, tgt), tgt_mask=t(torch, mask)).numpy()
    assert_close(fm(src, tgt, tgt_mask=mask), ref, **max_rel(ref))


def test_transformer_layer_norm_eps_vs_torch(rng):
    torch = requires_torch()
    torch.manual_seed(3)
    tm = torch.nn.Transformer(C, H, 1, 1, F, dropout=0.0, layer_norm_eps=1e-3,
                              batch_first=True).eval()
    fm = fast_transformer(tm, num_encoder_layers=1, num_decoder_layers=1, layer_norm_eps=1e-3)
    src, tgt = 0.05 * features(rng, B, S), 0.05 * features(rng, B, T)   # eps matters
    with torch.inference_mode():
        ref = tm(t(torch, src), t(torch, tgt)).numpy()
    assert_close(fm(src, tgt), ref, **max_rel(ref))


@pytest.mark.parametrize("mask_kind", ["float", "bool"])
def test_subsequent_tgt_mask_runs_as_causal_kernel(rng, monkeypatch, mask_kind):
    """A tgt_mask equal to the square subsequent mask reaches the kernel as causal=True with no
    mask array; any other tgt_mask reaches it as an additive array."""
    calls = []
    real = _fast.attention_into

    def spy(out, q, k, v, bias, key_bias, causal, scale, **kw):
        calls.append((q.shape[2], k.shape[2], bias is None, bool(causal)))
        return real(out, q, k, v, bias, key_bias, causal, scale, **kw)

    monkeypatch.setattr(_fast, "attention_into", spy)
    fm = fast_transformer(num_encoder_layers=1, num_decoder_layers=2)
    src, tgt = features(rng, B, S), features(rng, B, T)
    causal = np.triu(np.ones((T, T), bool), k=1)
    mask = causal if mask_kind == "bool" else fnn.generate_square_subsequent_mask(T)
    out = fm(src, tgt, tgt_mask=mask)
    self_attn = [c for c in calls if c[:2] == (T, T)]
    assert len(self_attn) == 2
    assert all(no_bias and is_causal for _, _, no_bias, is_causal in self_attn), calls
    want = fast_transformer(num_encoder_layers=1, num_decoder_layers=2,
                            backend="reference")(src, tgt, tgt_mask=mask)
    assert_close(out, want, **scaled(TOL["nn_backends"], want))
    calls.clear()
    other = causal.copy()
    other[T - 1, 0] = True                        # no longer the subsequent mask
    if mask_kind == "float":
        other = np.where(other, np.float32(-np.inf), np.float32(0.0))
    fm(src, tgt, tgt_mask=other)
    self_attn = [c for c in calls if c[:2] == (T, T)]
    assert self_attn and all(not no_bias and not is_causal
                             for _, _, no_bias, is_causal in self_attn), calls


# ----------------------------------------------------------------------------------------------
# layers and stacks alone against torch


def layer_pair(torch, kind, seed, **kw):
    """torch.nn.<kind> (seeded, eval, batch_first, no dropout) and fnn.<kind> with its weights."""
    torch.manual_seed(seed)
    tl = getattr(torch.nn, kind)(C, H, F, dropout=0.0, batch_first=True, **kw).eval()
    fl = getattr(fnn, kind)(C, H, F, dropout=0.0, **kw)
    fl.load_state_dict(tl.state_dict())
    return tl, fl


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_vs_torch(rng, norm_first, activation):
    torch = requires_torch()
    tl, fl = layer_pair(torch, "TransformerEncoderLayer", 4, activation=activation,
                        norm_first=norm_first)
    x = features(rng, B, S)
    kpm = padding(B, S, [S, 4, 6])
    mask = float_mask(rng, S, S)
    with torch.inference_mode():
        ref = tl(t(torch, x)).numpy()
    with torch_fastpath(torch, [mask]):
        ref_m = tl(t(torch, x), src_mask=t(torch, mask),
                   src_key_padding_mask=t(torch, kpm)).numpy()
    assert_close(fl(x), ref, **max_rel(ref))
    out_m = fl(x, src_mask=mask, src_key_padding_mask=kpm)
    assert_close(out_m[~kpm], ref_m[~kpm], **max_rel(ref_m[~kpm]), name="masked")


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_decoder_layer_vs_torch(rng, norm_first, activation):
    torch = requires_torch()
    tl, fl = layer_pair(torch, "TransformerDecoderLayer", 5, activation=activation,
                        norm_first=norm_first)
    y, mem = features(rng, B, T), features(rng, B, S)
    tmask = fnn.generate_square_subsequent_mask(T)
    tkpm, mkpm = padding(B, T, [T, 2, 3]), padding(B, S, [4, S, 1])
    mmask = bool_mask(rng, (T, S))
    with torch.inference_mode():
        ref = tl(t(torch, y), t(torch, mem)).numpy()
        ref_m = tl(t(torch, y), t(torch, mem), tgt_mask=t(torch, tmask),
                   memory_mask=t(torch, mmask), tgt_key_padding_mask=t(torch, tkpm),
                   memory_key_padding_mask=t(torch, mkpm)).numpy()
    assert_close(fl(y, mem), ref, **max_rel(ref))
    out_m = fl(y, mem, tgt_mask=tmask, memory_mask=mmask, tgt_key_padding_mask=tkpm,
               memory_key_padding_mask=mkpm)
    assert_close(out_m, ref_m, **max_rel(ref_m), name="masked")


@pytest.mark.parametrize("final_norm", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_stack_vs_torch(rng, norm_first, final_norm):
    torch = requires_torch()
    torch.manual_seed(6)
    tl = torch.nn.TransformerEncoderLayer(C, H, F, dropout=0.0, batch_first=True,
                                          norm_first=norm_first)
    te = torch.nn.TransformerEncoder(tl, 3, norm=torch.nn.LayerNorm(C) if final_norm else None,
                                     enable_nested_tensor=not norm_first).eval()
    with torch.no_grad():                          # make the final norm's affine matter
        for name, p in te.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    fe = fnn.TransformerEncoder(fnn.TransformerEncoderLayer(C, H, F, norm_first=norm_first), 3,
                                fnn.LayerNorm(C) if final_norm else None)
    assert list(fe.state_dict()) == list(te.state_dict())
    fe.load_state_dict(te.state_dict())
    x = features(rng, B, S)
    kpm = padding(B, S, [S, 2, 5])
    with torch.inference_mode():
        ref = te(t(torch, x)).numpy()
        ref_m = te(t(torch, x), src_key_padding_mask=t(torch, kpm)).numpy()
    assert_close(fe(x), ref, **max_rel(ref))
    assert_close(fe(x, src_key_padding_mask=kpm)[~kpm], ref_m[~kpm], **max_rel(ref_m[~kpm]),
                 name="padded")


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_stack_vs_torch(rng, norm_first):
    torch = requires_torch()
    torch.manual_seed(7)
    tl = torch.nn.TransformerDecoderLayer(C, H, F, dropout=0.0, batch_first=True,
                                          norm_first=norm_first)
    td = torch.nn.TransformerDecoder(tl, 2, norm=torch.nn.LayerNorm(C)).eval()
    fd = fnn.TransformerDecoder(fnn.TransformerDecoderLayer(C, H, F, norm_first=norm_first), 2,
                                fnn.LayerNorm(C))
    assert list(fd.state_dict()) == list(td.state_dict())
    fd.load_state_dict(td.state_dict())
    y, mem = features(rng, B, T), features(rng, B, S)
    mask = fnn.generate_square_subsequent_mask(T)
    mkpm = padding(B, S, [S, 3, 6])
    with torch.inference_mode():
        ref = td(t(torch, y), t(torch, mem), tgt_mask=t(torch, mask),
                 memory_key_padding_mask=t(torch, mkpm)).numpy()
    assert_close(fd(y, mem, tgt_mask=mask, memory_key_padding_mask=mkpm), ref, **max_rel(ref))
    assert_close(fd(y, mem, tgt_is_causal=True, memory_key_padding_mask=mkpm), ref, **max_rel(ref))


# ----------------------------------------------------------------------------------------------
# fast vs reference backend (no torch)


@pytest.mark.parametrize("case", MASK_CASES)
@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
def test_transformer_fast_vs_reference(rng, norm_first, activation, case):
    fast = fast_transformer(norm_first=norm_first, activation=activation, seed=11)
    ref = fast_transformer(norm_first=norm_first, activation=activation, seed=11,
                           backend="reference")
    for (k, a), (k2, b) in zip(fast.state_dict().items(), ref.state_dict().items()):
        assert k == k2 and np.array_equal(a, b)
    src, tgt = features(rng, B, S), features(rng, B, T)
    kw = _masks(rng, case)
    out_f, out_r = fast(src, tgt, **kw), ref(src, tgt, **kw)
    assert out_f.dtype == out_r.dtype == np.float32
    assert_close(out_f, out_r, **scaled(TOL["nn_backends"], out_r))
    mem_f = fast.encoder(src, kw.get("src_mask"), kw.get("src_key_padding_mask"))
    mem_r = ref.encoder(src, kw.get("src_mask"), kw.get("src_key_padding_mask"))
    assert_close(mem_f, mem_r, **scaled(TOL["nn_backends"], mem_r), name="memory")
    dec_f = fast.decoder(tgt, mem_f, kw.get("tgt_mask"), kw.get("memory_mask"),
                         kw.get("tgt_key_padding_mask"), kw.get("memory_key_padding_mask"))
    dec_r = ref.decoder(tgt, mem_f, kw.get("tgt_mask"), kw.get("memory_mask"),
                        kw.get("tgt_key_padding_mask"), kw.get("memory_key_padding_mask"))
    assert_close(dec_f, dec_r, **scaled(TOL["nn_backends"], dec_r), name="decoder")


def test_to_backend_switches_every_module(rng):
    m = fast_transformer(seed=12)
    src, tgt = features(rng, B, S), features(rng, B, T)
    out_f = m(src, tgt, tgt_is_causal=True)
    assert m.to_backend("reference") is m
    assert {mod.backend for mod in m.modules()} == {"reference"}
    out_r = m(src, tgt, tgt_is_causal=True)
    assert_close(out_f, out_r, **scaled(TOL["nn_backends"], out_r))
    assert np.array_equal(m.to_backend("fast")(src, tgt, tgt_is_causal=True), out_f)


# ----------------------------------------------------------------------------------------------
# fully masked query rows: zeros from attention, finite outputs (torch gives NaN here)


@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_mha_fully_masked_row_gives_zero_attention(rng, backend):
    m = fnn.MultiheadAttention(C, H, backend=backend, seed=30)
    m.out_proj.bias[...] = rng.standard_normal(C)
    m.in_proj_bias[...] = rng.standard_normal(3 * C)
    q, k = features(rng, B, T), features(rng, B, S)
    kpm = padding(B, S, [S, 0, 3])                # batch 1: every key padded
    for need in (False, True):
        out, w = m(q, k, k, key_padding_mask=kpm, need_weights=need)
        assert np.isfinite(out).all()
        # zeros from attention, then out_proj: the row is out_proj.bias exactly
        assert_close(out[1], np.broadcast_to(m.out_proj.bias, (T, C)), **TOL["masked_row_bias"],
                     name="fully masked row")
        if need:
            assert np.isfinite(w).all() and np.all(w[1] == 0)
            assert_close(w[0].sum(-1), np.ones(T), **TOL["row_sums"], name="weights sum")
    mask = np.zeros((T, S), bool)
    mask[2] = True                                 # one query row blocked by the attn_mask
    out, _ = m(q, k, k, attn_mask=mask, need_weights=False)
    assert np.isfinite(out).all()
    assert_close(out[:, 2], np.broadcast_to(m.out_proj.bias, (B, C)), **TOL["masked_row_bias"],
                 name="blocked row")


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_fully_masked_rows_finite(rng, norm_first):
    fast = fast_transformer(norm_first=norm_first, seed=31)
    ref = fast_transformer(norm_first=norm_first, seed=31, backend="reference")
    src, tgt = features(rng, B, S), features(rng, B, T)
    kpm = padding(B, S, [S, 0, 4])                 # batch 1: every source position padded
    tkpm = padding(B, T, [T, 3, 0])                # batch 2: every target position padded
    mmask = np.zeros((T, S), bool)
    mmask[1] = True
    kw = dict(src_key_padding_mask=kpm, memory_key_padding_mask=kpm, tgt_key_padding_mask=tkpm,
              memory_mask=mmask)
    out = fast(src, tgt, **kw)
    assert np.isfinite(out).all()
    want = ref(src, tgt, **kw)
    assert_close(out, want, **scaled(TOL["nn_backends"], want))
    mem = fast.encoder(src, src_key_padding_mask=kpm)
    assert np.isfinite(mem).all()
