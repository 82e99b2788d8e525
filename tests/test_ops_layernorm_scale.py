"""Layer norm at every scale of float32: the kernel against the float64 twin for rows whose
largest |x + residual| runs from 1e-30 to ~3e38, forward (y, the training forward's mean and
rstd, the fused residual add) and backward, on every SIMD level (child processes).

Layer norm is scale-invariant up to eps: a row of 1e30s normalises like a row of 1s. The
kernel's one float32 pass cannot hold the squares of such rows (they overflow past |x| ~ 1e19),
so those rows are redone in double; these tests hold it to the twin on both sides of that
switch. x + residual is a float32 sum in both twins: a sum past the float32 range is inf, and
its row comes out NaN in both.
"""
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from conftest import TILES, assert_close, child_isa_tests
from fastattn import _fast, ops, reference
from strategies import features, rand, rows, seeds
from test_ops_layernorm_backward import check_ln_backward
from tolerances import TOL, layer_norm_atol

VL = TILES["vector_width"]
F32_MAX = float(np.finfo(np.float32).max)


def scaled_rows(rng, shape, top):
    """float32 rows (N, C) of random signs and sizes whose largest |value| per row is `top`
    (each row divided by its own max, then multiplied by top in float64)."""
    r = rng.standard_normal(shape)
    peak = np.abs(r).max(axis=-1, keepdims=True)
    return (r / np.where(peak > 0, peak, 1.0) * top).astype(np.float32)


def check_scaled(x, weight, bias, *, residual=None, dy=None, eps=1e-5):
    """ops against reference for y, mean, rstd and (dy given) the backward, with tolerances
    relative to the rows' own scale (y is O(|weight|) + |bias| at any scale of x)."""
    y, cache = ops.layer_norm_forward(x, weight, bias, eps=eps, residual=residual)
    ry, rcache = reference.layer_norm_forward(x, weight, bias, eps=eps, residual=residual)
    assert_close(y, ry, rtol=TOL["layer_norm"]["rtol"], atol=layer_norm_atol(weight, bias),
                 name="y")
    s = reference._ln_input(x, residual)
    smax = float(np.abs(s).max(initial=0.0))
    tm = TOL["layer_norm_mean"]
    assert_close(cache["mean"], rcache["mean"], rtol=tm["rtol"], atol=tm["atol"] * smax,
                 name="mean")
    tr = TOL["layer_norm_rstd"]
    assert_close(cache["rstd"], rcache["rstd"], rtol=tr["rtol"], atol=tr["atol"], name="rstd")
    np.testing.assert_array_equal(ops.layer_norm(x, weight, bias, eps=eps, residual=residual), y)
    if dy is not None:
        check_ln_backward(dy, x, weight, bias, residual=residual, eps=eps)
    return y, cache


@given(N=rows(1, 40), C=st.one_of(st.just(1), st.integers(1, 3 * VL + 3), features(1, 600)),
       log10_top=st.floats(-30.0, 38.5), with_weight=st.booleans(), with_residual=st.booleans(),
       seed=seeds)
def test_every_scale_matches_reference(N, C, log10_top, with_weight, with_residual, seed):
    rng = np.random.default_rng(seed)
    top = 10.0 ** log10_top                          # <= 3.16e38 < the float32 maximum
    w = rand(rng, (C,)) if with_weight else None
    b = rand(rng, (C,)) if with_weight else None
    if with_residual:                                # x + residual stays within [-top, top]
        x, r = scaled_rows(rng, (N, C), top / 2), scaled_rows(rng, (N, C), top / 2)
    else:
        x, r = scaled_rows(rng, (N, C), top), None
    check_scaled(x, w, b, residual=r, dy=rand(rng, (N, C)))


def test_scale_invariant_up_to_eps(rng):
    # the probe's case: LN(x * 1e19) was all zeros (the squares overflowed float32)
    # (eps = 1e-38, far below the variance of every row here)
    x = rand(rng, (7, 33))
    want = reference.layer_norm(x, None, None, eps=1e-38)
    for top in (1e-15, 1.0, 1e19, 1e30, 3e38):
        xs = (x.astype(np.float64) * (top / np.abs(x).max())).astype(np.float32)
        y = ops.layer_norm(xs, None, None, eps=1e-38)
        assert_close(y, want, **TOL["layer_norm"], name=f"LN(x) at max |x| = {top:g}")


def test_extreme_rows(rng):
    # rows at the float32 maximum with both signs (std ~3e38: rstd is a denormal), constant
    # rows at the maximum, single elements, and a mix of scales row by row
    C = 2 * VL + 3
    m = np.float32(F32_MAX)
    x = np.zeros((6, C), np.float32)
    x[0, ::2], x[0, 1::2] = m, -m
    x[1] = m
    x[2, 0], x[2, 1] = m, -m
    x[3] = rand(rng, (C,)) * np.float32(1e-30)
    x[4] = scaled_rows(rng, (C,), 1e20)
    x[5] = scaled_rows(rng, (C,), 1.0)
    w, b = rand(rng, (C,)), rand(rng, (C,))
    check_scaled(x, w, b, dy=rand(rng, (6, C)))
    check_scaled(x, None, None, dy=rand(rng, (6, C)))
    check_scaled(x[:, :1], None, None, dy=rand(rng, (6, 1)))   # C = 1: y = bias, dx = 0


def test_training_state_kept_at_scale(rng):
    # the fused residual add keeps s = x + residual (sum_out) and the statistics, as the
    # model's training forward uses them; the backward from that s matches the twin's
    N, C = 5, 4 * VL + 1
    x, r = scaled_rows(rng, (N, C), 1e36), scaled_rows(rng, (N, C), 1e36)
    w, b = rand(rng, (C,)), rand(rng, (C,))
    y, s = np.empty((N, C), np.float32), np.empty((N, C), np.float32)
    mean, rstd = np.empty(N, np.float32), np.empty(N, np.float32)
    _fast.layer_norm_into(y, x, w, b, 1e-5, r, s, mean, rstd)
    ry, rcache = reference.layer_norm_forward(x, w, b, residual=r)
    np.testing.assert_array_equal(s, x + r)
    assert_close(y, ry, rtol=TOL["layer_norm"]["rtol"], atol=layer_norm_atol(w, b), name="y")
    # |x + residual| <= 2e36
    assert_close(mean, rcache["mean"], rtol=TOL["layer_norm_mean"]["rtol"],
                 atol=TOL["layer_norm_mean"]["atol"] * 2e36, name="mean")
    assert_close(rstd, rcache["rstd"], **TOL["layer_norm_rstd"], name="rstd")
    dy = rand(rng, (N, C))
    dx, dw, db = np.empty((N, C), np.float32), np.empty(C, np.float32), np.empty(C, np.float32)
    _fast.layer_norm_backward_into(dx, dw, db, dy, s, mean, rstd, w)
    rdx, rdw, rdb = reference.layer_norm_backward(dy, s, rcache["mean"], rcache["rstd"], w)
    tol = TOL["layer_norm_grad_at_scale"]
    assert_close(dx, rdx, **tol["dx"], name="dx")
    assert_close(dw, rdw, rtol=tol["dweight"]["rtol"], atol=tol["dweight"]["atol"] * N,
                 name="dweight")
    assert_close(db, rdb, rtol=tol["dbias"]["rtol"], atol=tol["dbias"]["atol"] * N, name="dbias")


def test_residual_sum_past_float32_is_nan_in_both(rng):
    # x + residual rounds to float32 in both twins: rows whose sum overflows are NaN (as
    # LN(inf) is), the other rows are unaffected
    C = VL + 3
    x, r = rand(rng, (3, C)), rand(rng, (3, C))
    x[1, 2] = r[1, 2] = np.float32(3e38)
    y, cache = ops.layer_norm_forward(x, None, None, residual=r)
    ry, rcache = reference.layer_norm_forward(x, None, None, residual=r)
    assert np.isnan(y[1]).all() and np.isnan(ry[1]).all()
    assert np.isfinite(y[[0, 2]]).all()
    assert_close(y, ry, **TOL["layer_norm"], name="y")
    assert_close(cache["mean"], rcache["mean"], **TOL["layer_norm_mean_small"], name="mean")
    assert_close(cache["rstd"], rcache["rstd"], **TOL["layer_norm_rstd"], name="rstd")
    dy = rand(rng, (3, C))
    got = ops.layer_norm_backward(dy, x, cache["mean"], cache["rstd"], None, residual=r)
    want = reference.layer_norm_backward(dy, x, rcache["mean"], rcache["rstd"], None, residual=r)
    assert np.isnan(got[0][1]).all() and np.isfinite(got[0][[0, 2]]).all()
    assert_close(got[0], want[0], **TOL["layer_norm_grad_small"]["dx"], name="dx")
    assert_close(got[2], want[2], **TOL["layer_norm_grad_small"]["dbias"], name="dbias")


def isa_checks():
    """Run in a child under each FASTATTN_CPU_ISA (and under small OpenMP teams): every decade
    of scale, odd row lengths around the vector width, with and without a residual."""
    rng = np.random.default_rng(5)
    vl = fastattn.build_info()["tiles"]["vector_width"]
    for C in (1, vl - 1, vl + 1, 4 * vl + 3, 513):
        for top in [10.0 ** e for e in range(-30, 39, 4)] + [3e38]:
            w, b = rand(rng, (C,)), rand(rng, (C,))
            check_scaled(scaled_rows(rng, (9, C), top), w, b, dy=rand(rng, (9, C)))
            check_scaled(scaled_rows(rng, (9, C), top / 2), None, b,
                         residual=scaled_rows(rng, (9, C), top / 2), dy=rand(rng, (9, C)))
    # enough rows for a team of threads
    check_scaled(scaled_rows(rng, (1500, 257), 1e25), rand(rng, (257,)), None,
                 dy=rand(rng, (1500, 257)))


test_every_simd_level, test_correct_when_openmp_starts_fewer_threads = \
    child_isa_tests("test_ops_layernorm_scale")
