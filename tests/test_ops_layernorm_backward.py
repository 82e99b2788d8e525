"""fastattn.ops.layer_norm_backward (the C kernel) against the float64 twin, finite differences of
the twin, and torch autograd; its parameter gradients bit-identical for every thread count.

Tolerance (tolerances.layer_norm_grad_atols): the same computation on absolute values gives the
size of the terms each output sums. On top of that, the kernel recomputes s = x + residual in
float32 (as the forward keeps it), while the twin adds in float64: xhat moves by half an ulp of
the row's largest |s| times rstd (the forward's "conditioning" term), which matters for rows
with a large mean.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from conftest import TILES, assert_close, child_isa_tests, requires_torch, to_torch
from fastattn import _fast, ops, reference
from grad_util import float64_twins, numeric_grad
from strategies import LAYER_NORM_KINDS, features, layer_norm_input, rand, rows, seeds
from tolerances import TOL, layer_norm_grad_atols

FD = TOL["finite_difference"]

VL, RB = TILES["vector_width"], TILES["reduce_rows"]


def check_ln_backward(dy, x, weight, bias=None, *, residual=None, eps=1e-5):
    """Forward with ops, then both twins' backward from the kernel's mean and rstd."""
    _, cache = ops.layer_norm_forward(x, weight, bias, eps=eps, residual=residual)
    mean, rstd = cache["mean"], cache["rstd"]
    dx, dw, db = ops.layer_norm_backward(dy, x, mean, rstd, weight, residual=residual)
    rdx, rdw, rdb = reference.layer_norm_backward(dy, x, mean, rstd, weight, residual=residual)
    a_dx, a_dw, a_db = layer_norm_grad_atols(dy, x, mean, rstd, weight, residual)
    rtol = TOL["layer_norm_grad"]["rtol"]
    assert_close(dx, rdx, rtol=rtol, atol=a_dx, name="dx")
    if weight is None:
        assert dw is None and rdw is None
    else:
        assert_close(dw, rdw, rtol=rtol, atol=a_dw, name="dweight")
    assert_close(db, rdb, rtol=rtol, atol=a_db, name="dbias")
    return dx, dw, db


@given(N=rows(), C=features(), with_weight=st.booleans(), with_residual=st.booleans(),
       kind=st.sampled_from(LAYER_NORM_KINDS), seed=seeds)
def test_layer_norm_backward_matches_reference(N, C, with_weight, with_residual, kind, seed):
    rng = np.random.default_rng(seed)
    x = layer_norm_input(rng, kind, N, C)
    w = rand(rng, (C,)) if with_weight else None
    r = rand(rng, (N, C)) if with_residual else None
    dy = rand(rng, (N, C), 10.0 if kind == "large_magnitude" else 1.0)
    dx, dw, db = check_ln_backward(dy, x, w, rand(rng, (C,)), residual=r)
    assert dx.shape == (N, C) and dx.dtype == np.float32 and db.shape == (C,)


@pytest.mark.parametrize("N", sorted({1, RB - 1, RB, RB + 1, 2 * RB + 1, 7 * RB + 3}))
@pytest.mark.parametrize("C", sorted({1, VL - 1, VL, VL + 1, 2 * VL + 3, 512}))
def test_tile_edges(rng, N, C):
    """Rows around the partial-sum blocks (reduce_rows) and row lengths around the vector."""
    x, r, w = rand(rng, (N, C), 2.0), rand(rng, (N, C)), rand(rng, (C,))
    check_ln_backward(rand(rng, (N, C)), x, w, residual=r)
    check_ln_backward(rand(rng, (N, C)), x, None)


def test_tall_input_takes_larger_blocks(rng):
    """Past reduce_rows * 256 rows the blocks grow (a multiple of reduce_rows rows each)."""
    N, C = 256 * RB + 3 * RB + 5, 9
    x, w = rand(rng, (N, C)), rand(rng, (C,))
    check_ln_backward(rand(rng, (N, C)), x, w, residual=rand(rng, (N, C)))


def test_leading_dims_and_noncontiguous(rng):
    x, r, dy = rand(rng, (2, 3, 33)), rand(rng, (2, 3, 33)), rand(rng, (2, 3, 33))
    w = rand(rng, (33,))
    dx, dw, db = check_ln_backward(dy, x, w, residual=r)
    assert dx.shape == (2, 3, 33)
    _, cache = ops.layer_norm_forward(x, w, None, residual=r)
    x64, dyt = x.astype(np.float64), np.asfortranarray(dy)          # converted, copied
    got = ops.layer_norm_backward(dyt, x64, cache["mean"], cache["rstd"], w, residual=r)
    for a, b in zip(got, (dx, dw, db)):
        np.testing.assert_array_equal(a, b)


def test_dx_serves_x_and_residual(rng):
    """With a residual, dx is the gradient of both inputs: x + residual normalised as one."""
    x, r, w, dy = rand(rng, (40, 24)), rand(rng, (40, 24)), rand(rng, (24,)), rand(rng, (40, 24))
    _, c1 = ops.layer_norm_forward(x, w, None, residual=r)
    got = ops.layer_norm_backward(dy, x, c1["mean"], c1["rstd"], w, residual=r)
    s = x + r
    _, c2 = ops.layer_norm_forward(s, w, None)
    want = ops.layer_norm_backward(dy, s, c2["mean"], c2["rstd"], w)
    for a, b, name in zip(got, want, ("dx", "dweight", "dbias")):
        assert_close(a, b, **TOL["layer_norm_fused_residual"], name=name)


def test_constant_rows(rng):
    """var = 0: xhat = 0, rstd = 1/sqrt(eps): dx = rstd * (g - mean(g)), dweight gets nothing."""
    C = 37
    x = np.stack([np.full(C, 1e4, np.float32), np.zeros(C, np.float32)])
    w, dy = rand(rng, (C,)), rand(rng, (2, C))
    dx, dw, db = check_ln_backward(dy, x, w)
    assert_close(dw, np.zeros(C), **TOL["layer_norm_constant_rows"], name="dweight")


def test_empty(rng):
    for N, C in ((0, 5), (3, 0), (0, 0)):
        x = np.zeros((N, C), np.float32)
        w = np.ones(C, np.float32)
        dx, dw, db = ops.layer_norm_backward(x, x, np.zeros(N), np.ones(N), w)
        rdx, rdw, rdb = reference.layer_norm_backward(x, x, np.zeros(N), np.ones(N), w)
        assert dx.shape == (N, C) and dw.shape == (C,) and db.shape == (C,)
        np.testing.assert_array_equal(dw, rdw)
        np.testing.assert_array_equal(db, rdb)


# ---- finite differences of the float64 twin ------------------------------------------------


@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("with_weight", [False, True])
def test_twin_backward_matches_finite_differences(with_residual, with_weight):
    rng = np.random.default_rng(3)
    N, C = 3, 5
    x = rng.standard_normal((N, C)) * 2.0 + 0.5
    r = rng.standard_normal((N, C)) if with_residual else None
    w = rng.standard_normal(C) if with_weight else None
    b = rng.standard_normal(C)
    dy = rng.standard_normal((N, C))
    with float64_twins():
        def loss():
            y, _ = reference.layer_norm_forward(x, w, b, residual=r, eps=1e-3)
            return float(np.sum(y * dy))
        _, cache = reference.layer_norm_forward(x, w, b, residual=r, eps=1e-3)
        dx, dw, db = reference.layer_norm_backward(dy, x, cache["mean"], cache["rstd"], w,
                                                   residual=r)
        assert_close(dx, numeric_grad(loss, x), **FD, name="dx", dtype=None)
        if r is not None:
            assert_close(dx, numeric_grad(loss, r), **FD, name="dresidual", dtype=None)
        if w is not None:
            assert_close(dw, numeric_grad(loss, w), **FD, name="dweight", dtype=None)
        assert_close(db, numeric_grad(loss, b), **FD, name="dbias", dtype=None)


# ---- torch autograd ------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(5, 16), (2, 3, 33), (1, 7), (300, 513)])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("with_weight", [False, True])
def test_vs_torch_autograd(rng, shape, with_residual, with_weight):
    torch = requires_torch()
    C = shape[-1]
    x, dy = rand(rng, shape, 3.0) + np.float32(1.0), rand(rng, shape)
    w, b = rand(rng, (C,)) if with_weight else None, rand(rng, (C,))
    r = rand(rng, shape) if with_residual else None
    _, cache = ops.layer_norm_forward(x, w, b, residual=r)
    dx, dw, db = ops.layer_norm_backward(dy, x, cache["mean"], cache["rstd"], w, residual=r)
    xt, bt = to_torch(x).requires_grad_(), to_torch(b).requires_grad_()
    wt = to_torch(w).requires_grad_() if with_weight else None
    rt = to_torch(r).requires_grad_() if with_residual else None
    s = xt + rt if with_residual else xt
    torch.nn.functional.layer_norm(s, (C,), wt, bt, eps=1e-5).backward(to_torch(dy))
    t = TOL["torch"]
    scale = float(np.abs(dy).max()) * (1.0 if w is None else float(np.abs(w).max()))
    rows = x.size // C
    assert_close(dx, xt.grad.numpy(), rtol=t["rtol"], atol=t["atol"] * scale * 4, name="dx")
    if with_residual:
        assert_close(dx, rt.grad.numpy(), rtol=t["rtol"], atol=t["atol"] * scale * 4,
                     name="dresidual")
    if with_weight:
        assert_close(dw, wt.grad.numpy(), rtol=t["rtol"],
                     atol=t["atol"] * np.sqrt(rows) * float(np.abs(dy).max()) * 4, name="dweight")
    else:
        assert dw is None
    assert_close(db, bt.grad.numpy(), rtol=t["rtol"],
                 atol=t["atol"] * np.sqrt(rows) * float(np.abs(dy).max()), name="dbias")


# ---- threads, teams and SIMD levels --------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("C", [17, 512, 1025])
def test_bit_identical_for_every_thread_count(restore_threads, rng, n, C):
    N = 701
    x, r = rand(rng, (N, C)) + np.float32(1e3), rand(rng, (N, C))
    w, dy = rand(rng, (C,)), rand(rng, (N, C))
    _, cache = ops.layer_norm_forward(x, w, None, residual=r)

    def run(threads):
        fastattn.set_num_threads(threads)
        return ops.layer_norm_backward(dy, x, cache["mean"], cache["rstd"], w, residual=r)
    one, many = run(1), run(n)
    for a, b, name in zip(one, many, ("dx", "dweight", "dbias")):
        np.testing.assert_array_equal(a, b, err_msg=f"{name}: 1 thread vs {n}")


def test_accumulate_into(rng):
    N, C = 333, 40
    x, w, dy = rand(rng, (N, C)), rand(rng, (C,)), rand(rng, (N, C))
    _, cache = ops.layer_norm_forward(x, w, None)
    dx_ref, dw_ref, db_ref = ops.layer_norm_backward(dy, x, cache["mean"], cache["rstd"], w)
    dw, db = np.full(C, 0.5, np.float32), np.full(C, -2.0, np.float32)
    _fast.layer_norm_backward_into(None, dw, db, dy, x, cache["mean"], cache["rstd"], w,
                                  accumulate=True)
    np.testing.assert_array_equal(dw, np.float32(0.5) + dw_ref)
    np.testing.assert_array_equal(db, np.float32(-2.0) + db_ref)
    dx = np.full((N, C), np.nan, np.float32)
    _fast.layer_norm_backward_into(dx, None, None, dy, x, cache["mean"], cache["rstd"], w)
    np.testing.assert_array_equal(dx, dx_ref)


def isa_checks():
    """Run in a child under each FASTATTN_CPU_ISA (and under small OpenMP teams)."""
    rng = np.random.default_rng(11)
    tiles = fastattn.build_info()["tiles"]
    vl, rb = tiles["vector_width"], tiles["reduce_rows"]
    for N, C in ((rb + 1, vl - 1), (3 * rb, vl + 1), (2 * rb - 1, 4 * vl + 3), (1500, 513)):
        x, r, w = rand(rng, (N, C), 2.0), rand(rng, (N, C)), rand(rng, (C,))
        check_ln_backward(rand(rng, (N, C)), x, w, residual=r)
        check_ln_backward(rand(rng, (N, C)), x + np.float32(1e4), None)


test_every_simd_level, test_correct_when_openmp_starts_fewer_threads = \
    child_isa_tests("test_ops_layernorm_backward")


# ---- bad input -----------------------------------------------------------------------------


def arr(*shape):
    return np.zeros(shape, np.float32)


@pytest.mark.parametrize("args,pattern", [
    ((arr(2, 5), arr(2, 4), arr(2), arr(2), None), r"\bdy\b.*\(2, 4\).*\(2, 5\)"),
    ((arr(2, 4), arr(2, 4), arr(3), arr(2), None), r"\bmean\b.*\(2,\).*\(3,\)"),
    ((arr(2, 4), arr(2, 4), arr(2), arr(2, 1), None), r"\brstd\b.*\(2,\).*\(2, 1\)"),
    ((arr(2, 4), arr(2, 4), arr(2), arr(2), arr(5)), r"\bweight\b.*\(4,\).*\(5,\)"),
])
def test_bad_shapes(args, pattern):
    with pytest.raises(ValueError, match=pattern):
        ops.layer_norm_backward(*args)


def test_bad_residual_and_scalar():
    with pytest.raises(ValueError, match=r"residual.*\(2, 4\).*\(2, 5\)"):
        ops.layer_norm_backward(arr(2, 4), arr(2, 4), arr(2), arr(2), None, residual=arr(2, 5))
    with pytest.raises(ValueError, match=r"\bx\b.*scalar"):
        ops.layer_norm_backward(arr(), arr(), arr(1), arr(1), None)
    with pytest.raises(TypeError, match=r"\bdy\b.*dtype"):
        ops.layer_norm_backward(np.zeros((2, 4), bool), arr(2, 4), arr(2), arr(2), None)
