"""fastattn.ops.layer_norm / layer_norm_forward (the C kernel) against the NumPy twin and torch.

The kernel computes the moments in one pass, shifted by the first element of each row, so a
large mean (x = 1e4 + noise) must not cancel: the output must still match the float64 twin.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import TILES, assert_close, requires_torch, to_torch
from fastattn import ops, reference
from strategies import LAYER_NORM_KINDS, features, layer_norm_input, rand, rows, seeds
from tolerances import TOL, layer_norm_atol

VL = TILES["vector_width"]   # row lengths around it (and its multiples) hit the vector tails


def check_layer_norm(x, weight, bias, *, eps=1e-5, residual=None):
    """ops vs reference for y, mean and rstd. Returns the kernel's (y, cache)."""
    y, cache = ops.layer_norm_forward(x, weight, bias, eps=eps, residual=residual)
    ry, rcache = reference.layer_norm_forward(x, weight, bias, eps=eps, residual=residual)
    wmax = 1.0 if weight is None else float(np.abs(weight).max(initial=0.0))
    s = np.asarray(x, np.float64)
    if residual is not None:
        s = s + np.asarray(residual, np.float64)
    smax = float(np.abs(s).max(initial=0.0))
    # Conditioning of float32 itself: s = x + residual and the mean are float32 (the contract
    # keeps s in float32), so each is known to half an ulp of the row's largest |s|; y moves by
    # rstd * |w| per unit of either, and rstd relatively by rstd per unit. For s ~ 1e4 that is
    # ~5e-4 * rstd: normalising with a float32 mean cannot do better (torch neither); a naive
    # one-pass variance does far worse.
    cond = 0.0
    if s.size:
        row_ulp = np.spacing(np.abs(s).max(axis=-1).astype(np.float32)).astype(np.float64)
        cond = float(np.max(row_ulp.reshape(-1) * rcache["rstd"]))
    atol = layer_norm_atol(weight, bias) + 2.0 * cond * wmax
    assert_close(y, ry, rtol=TOL["layer_norm"]["rtol"], atol=atol, name="y")
    tm = TOL["layer_norm_mean"]
    assert_close(cache["mean"], rcache["mean"], rtol=tm["rtol"], atol=tm["atol"] * max(1.0, smax),
                 name="mean")
    tr = TOL["layer_norm_rstd"]
    assert_close(cache["rstd"], rcache["rstd"], rtol=tr["rtol"] + 2.0 * cond, atol=tr["atol"],
                 name="rstd")
    np.testing.assert_array_equal(ops.layer_norm(x, weight, bias, eps=eps, residual=residual), y)
    return y, cache


@given(N=rows(), C=features(), with_weight=st.booleans(), with_bias=st.booleans(),
       with_residual=st.booleans(), eps=st.sampled_from([1e-5, 1e-6, 1e-3]),
       kind=st.sampled_from(LAYER_NORM_KINDS), seed=seeds)
def test_layer_norm_matches_reference(N, C, with_weight, with_bias, with_residual, eps, kind,
                                      seed):
    rng = np.random.default_rng(seed)
    x = layer_norm_input(rng, kind, N, C)
    w = rand(rng, (C,)) if with_weight else None
    b = rand(rng, (C,)) if with_bias else None
    r = rand(rng, (N, C)) if with_residual else None
    y, cache = check_layer_norm(x, w, b, eps=eps, residual=r)
    assert y.shape == (N, C) and cache["mean"].shape == (N,) and cache["rstd"].shape == (N,)


@pytest.mark.parametrize("C", sorted({1, VL - 1, VL, VL + 1, 32 * VL - 1, 32 * VL,
                                       32 * VL + 1, 1100}))
def test_large_mean_does_not_cancel(rng, C):
    # x = 1e4 + randn: a naive one-pass E[x^2] - E[x]^2 in float32 loses every digit here (its
    # variance error is ~eps * 1e8 ~ 10). What float32 can do: the mean rounded to half an ulp
    # of 1e4 (4.9e-4), times rstd ~ 1: y within ~1e-3 of the float64 twin.
    x = rand(rng, (64, C)) + np.float32(1e4)
    y, _ = check_layer_norm(x, None, None)
    ref = reference.layer_norm(x, None, None)
    assert np.max(np.abs(y.astype(np.float64) - ref)) < 1e-3 * (2.0 if C < 15 else 1.0)
    w, b = rand(rng, (C,)), rand(rng, (C,))
    check_layer_norm(x, w, b)
    # with the large mean split between x and residual
    check_layer_norm(x - np.float32(5e3), w, b, residual=np.full_like(x, 5e3))


@pytest.mark.parametrize("C", [VL, VL + 1, 32 * VL + 1])
def test_large_magnitude(rng, C):
    x = rand(rng, (50, C), 1e4)
    check_layer_norm(x, rand(rng, (C,)), rand(rng, (C,)))
    check_layer_norm(x, None, None, residual=rand(rng, (50, C), 1e4))


def test_constant_rows_give_bias(rng):
    # var = 0: y = 0 * rstd * w + b exactly, rstd = 1 / sqrt(eps)
    C = 37
    x = np.stack([np.full(C, 1e4, np.float32), np.zeros(C, np.float32),
                  np.full(C, -3.5, np.float32)])
    w, b = rand(rng, (C,)), rand(rng, (C,))
    y, cache = check_layer_norm(x, w, b, eps=1e-5)
    assert_close(y, np.broadcast_to(b, (3, C)), **TOL["layer_norm_constant_rows"], name="y = bias")
    assert_close(cache["rstd"], np.full(3, 1 / np.sqrt(1e-5)), **TOL["layer_norm_constant_rstd"],
                 name="rstd")


@pytest.mark.parametrize("with_weight,with_bias", [(False, False), (True, False), (False, True)])
def test_weight_bias_none(rng, with_weight, with_bias):
    # None means weight = 1 / bias = 0
    x, r = rand(rng, (3, 5, 33), 3.0), rand(rng, (3, 5, 33))
    w = rand(rng, (33,)) if with_weight else None
    b = rand(rng, (33,)) if with_bias else None
    y, _ = check_layer_norm(x, w, b, residual=r)
    y_explicit = ops.layer_norm(x, np.ones(33, np.float32) if w is None else w,
                                np.zeros(33, np.float32) if b is None else b, residual=r)
    assert_close(y, y_explicit, **TOL["layer_norm_none_weight"], name="None == explicit 1 / 0")


def test_leading_dims_residual_and_cache(rng):
    x, r = rand(rng, (2, 3, 65)), rand(rng, (2, 3, 65))
    w, b = rand(rng, (65,)), rand(rng, (65,))
    y, cache = check_layer_norm(x, w, b, residual=r, eps=1e-6)
    assert y.shape == (2, 3, 65) and cache["mean"].shape == (6,)
    # residual fused == residual added first
    y2 = ops.layer_norm(x + r, w, b, eps=1e-6)
    assert_close(y, y2, **TOL["layer_norm_fused_residual"], name="fused residual")


def test_empty_and_noncontiguous(rng):
    y, cache = ops.layer_norm_forward(np.zeros((0, 4), np.float32), np.ones(4), np.zeros(4))
    assert y.shape == (0, 4) and cache["mean"].shape == (0,) and cache["rstd"].shape == (0,)
    x = rand(rng, (48, 20)).astype(np.float64)
    w, b = rand(rng, (48,)), rand(rng, (48,))
    y, _ = check_layer_norm(x.T, w, b, residual=x.T[::-1])
    assert y.dtype == np.float32
    y_c, _ = ops.layer_norm_forward(np.ascontiguousarray(x.T, np.float32), w, b,
                                    residual=np.ascontiguousarray(x.T[::-1], np.float32))
    np.testing.assert_array_equal(y, y_c)


def test_large_rows_multithreaded(rng):
    x = rand(rng, (2000, 513)) + np.float32(100.0)
    check_layer_norm(x, rand(rng, (513,)), rand(rng, (513,)), residual=rand(rng, (2000, 513)))


@pytest.mark.parametrize("shape", [(5, 16), (2, 3, 33), (1, 7), (40, 513)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_layer_norm_vs_torch(rng, shape, with_residual):
    torch = requires_torch()
    C = shape[-1]
    x, w, b = rand(rng, shape, 3.0) + np.float32(1.0), rand(rng, (C,)), rand(rng, (C,))
    r = rand(rng, shape) if with_residual else None
    y, cache = ops.layer_norm_forward(x, w, b, residual=r)
    s = to_torch(x) + to_torch(r) if with_residual else to_torch(x)
    ref = torch.nn.functional.layer_norm(s, (C,), to_torch(w), to_torch(b), eps=1e-5).numpy()
    assert_close(y, ref, name="y vs torch", **TOL["torch"])
    _, mean, rstd = torch.ops.aten.native_layer_norm(s, [C], to_torch(w), to_torch(b), 1e-5)
    assert_close(cache["mean"], mean.reshape(-1).numpy(), name="mean vs torch", **TOL["torch"])
    assert_close(cache["rstd"], rstd.reshape(-1).numpy(), name="rstd vs torch", **TOL["torch"])
