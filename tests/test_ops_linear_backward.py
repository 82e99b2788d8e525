"""fastattn.ops.linear_forward / linear_backward and ffn_forward / ffn_backward (the GEMM engine with
fused activation-gradient epilogues, FFN dropout regenerated in the backward) against the float64
twin, finite differences of the twin, and torch autograd.

Tolerance of each gradient (chain_atol): the same chain of products on absolute values, in
float64, gives the size of the terms each output sums; float32 error is a few eps * sqrt(terms)
of that. Every gradient is bit-identical for every thread count and run to run: bias gradients
are column sums in a fixed order, dx and dweight the engine's one sum per element in k order.
"""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from conftest import (TILES, assert_close, child_isa_tests, requires_torch, to_torch,
                      torch_activation)
from fastattn import _fast, ops, reference
from grad_util import float64_twins, numeric_grad
from strategies import features, rand, rows, seeds
from tolerances import GELU_MAX_SLOPE, TOL, chain_atol

ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh", "silu"]
SKINNY, ROW_BLOCK = 8, TILES["row_block"]     # a few rows; the bf16 tiles' blocks
MIN_ROWS = 128   # rows per thread: shapes of one and of several engine tasks per thread
VL, ALIGN = TILES["vector_width"], TILES["feature_align"]
RTOL = TOL["linear_grad"]["rtol"]
FD = TOL["finite_difference"]


def _abs(a):
    return np.abs(np.asarray(a, np.float64))


def act_slope(pre, activation):
    """|act'(pre)|, bounded (for the tolerance only)."""
    if activation is None:
        return np.ones_like(_abs(pre))
    if activation == "relu":
        return (np.asarray(pre) > 0).astype(np.float64)
    return np.full(np.shape(pre), GELU_MAX_SLOPE)


# ---- linear --------------------------------------------------------------------------------


def check_linear_backward(dy, x, w, b=None, activation=None):
    y, cache = ops.linear_forward(x, w, b, activation=activation)
    ry, rcache = reference.linear_forward(x, w, b, activation=activation)
    K, M = w.shape[1], w.shape[0]
    N = math.prod(np.shape(x)[:-1])
    assert y.shape == ry.shape and y.dtype == np.float32
    if activation is None:
        assert cache["pre"] is None and rcache["pre"] is None
    else:
        assert cache["pre"].shape == (N, M)
    pre = cache["pre"]
    dx, dw, db = ops.linear_backward(dy, x, w, pre=pre, activation=activation)
    rdx, rdw, rdb = reference.linear_backward(dy, x, w, pre=pre, activation=activation)
    dz = _abs(dy).reshape(N, M) * (1.0 if pre is None else act_slope(pre, activation))
    x2 = _abs(x).reshape(N, K)
    assert_close(dx, rdx, rtol=RTOL, atol=chain_atol(dz @ _abs(w), M), name="dx")
    assert_close(dw, rdw, rtol=RTOL, atol=chain_atol(dz.T @ x2, N), name="dweight")
    assert_close(db, rdb, rtol=RTOL, atol=chain_atol(dz.sum(axis=0), N), name="dbias")
    return (dx, dw, db), cache


@given(N=rows(), K=features(1, 600), M=features(1, 600), activation=st.sampled_from(ACTIVATIONS),
       with_bias=st.booleans(), seed=seeds)
def test_linear_backward_matches_reference(N, K, M, activation, with_bias, seed):
    rng = np.random.default_rng(seed)
    x, w = rand(rng, (N, K)), rand(rng, (M, K), 1.0 / math.sqrt(K))
    b = rand(rng, (M,)) if with_bias else None
    (dx, dw, db), _ = check_linear_backward(rand(rng, (N, M)), x, w, b, activation)
    assert dx.shape == (N, K) and dw.shape == (M, K) and db.shape == (M,)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("N", ["edge-1", "edge", "edge+1", 1, SKINNY + 1, ROW_BLOCK + 88,
                               2 * ROW_BLOCK + 276])
def test_linear_row_paths(rng, activation, N):
    """Row blocks from MIN_ROWS rows per thread (the edge); below it, dx split by features."""
    edge = MIN_ROWS * fastattn.get_num_threads()
    N = {"edge-1": edge - 1, "edge": edge, "edge+1": edge + 1}.get(N, N)
    x, w, b = rand(rng, (N, 64)), rand(rng, (129, 64), 0.125), rand(rng, (129,))
    check_linear_backward(rand(rng, (N, 129)), x, w, b, activation)


@pytest.mark.parametrize("M", sorted({1, VL - 1, VL + 1, ALIGN + 1, 3 * ALIGN - 1}))
def test_linear_feature_tails(rng, M):
    for N in (5, 3 * MIN_ROWS + 1):
        x, w = rand(rng, (N, 2 * VL + 1)), rand(rng, (M, 2 * VL + 1), 0.2)
        check_linear_backward(rand(rng, (N, M)), x, w, None, "gelu")


def test_linear_forward_keeps_pre(rng):
    """y equals ops.linear bit for bit; pre equals the activation-free linear bit for bit."""
    for N in (3, 40, 3 * MIN_ROWS + 7):
        x, w, b = rand(rng, (N, 48)), rand(rng, (70, 48), 0.2), rand(rng, (70,))
        for activation in ("relu", "gelu"):
            y, cache = ops.linear_forward(x, w, b, activation=activation)
            np.testing.assert_array_equal(y, ops.linear(x, w, b, activation=activation))
            np.testing.assert_array_equal(cache["pre"], ops.linear(x, w, b))
        y, cache = ops.linear_forward(x, w, b)
        assert cache["pre"] is None
        np.testing.assert_array_equal(y, ops.linear(x, w, b))


def test_linear_leading_dims_and_empty(rng):
    x, w, dy = rand(rng, (2, 3, 17)), rand(rng, (5, 17)), rand(rng, (2, 3, 5))
    (dx, dw, db), cache = check_linear_backward(dy, x, w, rand(rng, (5,)), "relu")
    assert dx.shape == (2, 3, 17) and cache["pre"].shape == (6, 5)
    for N, K, M in ((0, 4, 5), (3, 0, 5), (3, 4, 0), (0, 0, 0)):
        x, w, dy = rand(rng, (N, K)), rand(rng, (M, K)), rand(rng, (N, M))
        for act in ACTIVATIONS:
            y, cache = ops.linear_forward(x, w, activation=act)
            got = ops.linear_backward(dy, x, w, pre=cache["pre"], activation=act)
            want = reference.linear_backward(dy, x, w, pre=cache["pre"], activation=act)
            for a, b, name in zip(got, want, ("dx", "dweight", "dbias")):
                assert_close(a, b, **TOL["empty_sizes"],
                             name=f"{name} {(N, K, M)} {act}")


def check_activation_gradient(pre, activation):
    """The kernel's activation derivative at the points pre (N, 1) against the twin's: the
    backward of a linear layer with one identity weight and dy = 1."""
    eye = np.eye(1, dtype=np.float32)
    dy = np.ones_like(pre)
    dx, _, _ = ops.linear_backward(dy, pre, eye, pre=pre, activation=activation)
    with np.errstate(invalid="ignore"):       # dweight: NaN * inf terms, as intended
        rdx, _, _ = reference.linear_backward(dy, pre, eye, pre=pre, activation=activation)
    assert_close(dx, rdx, **TOL["activation_grad"][activation], name=f"{activation}'")


def test_activation_gradient_special_values():
    """relu' is a select on pre > 0; gelu' = Phi + pre * phi, 1 and 0 at +inf and -inf (and
    gelu_tanh' and silu' likewise)."""
    pre = np.array([[0.0, -0.0, 1e-30, -1e-30, 0.5, -0.75, 3.0, -3.0, 12.0, -12.0, 40.0, -40.0,
                     3e38, np.inf, -np.inf, np.nan]], np.float32).T           # (16, 1)
    for activation in ("relu", "gelu", "gelu_tanh", "silu"):
        check_activation_gradient(pre, activation)


def test_gelu_gradient_over_range():
    pre = np.linspace(-14.0, 14.0, 8001, dtype=np.float32)[:, None]
    check_activation_gradient(pre, "gelu")
    check_activation_gradient(pre, "gelu_tanh")
    check_activation_gradient(pre, "silu")


# ---- ffn -----------------------------------------------------------------------------------


def ffn_chain(dy, x, w1, w2, pre, activation, dropout_p):
    """The backward's products on absolute values: |dh|, |dpre|, and the four gradients."""
    N, C = np.shape(x)[0], np.shape(x)[1]
    drop = 1.0 / (1.0 - dropout_p)
    dyA, xA = _abs(dy).reshape(N, C), _abs(x).reshape(N, C)
    h = np.abs(reference._act64(np.asarray(pre, np.float64), activation)) * drop
    dh = dyA @ _abs(w2)
    dpre = dh * drop * act_slope(pre, activation)
    return {"dx": dpre @ _abs(w1), "dw1": dpre.T @ xA, "db1": dpre.sum(axis=0),
            "dw2": dyA.T @ h, "db2": dyA.sum(axis=0)}


def check_ffn_backward(dy, x, w1, b1, w2, b2, activation="relu", dropout_p=0.0, seed=None):
    y, cache = ops.ffn_forward(x, w1, b1, w2, b2, activation=activation, dropout_p=dropout_p,
                               seed=seed)
    ry, rcache = reference.ffn_forward(x, w1, b1, w2, b2, activation=activation,
                                       dropout_p=dropout_p, seed=seed)
    F, C = w1.shape
    N = math.prod(np.shape(x)[:-1])
    pre = cache["pre"]
    assert pre.shape == (N, F) and pre.dtype == np.float32
    pre_atol = chain_atol(_abs(x).reshape(N, C) @ _abs(w1).T + (0 if b1 is None else _abs(b1)), C)
    assert_close(pre, rcache["pre"], rtol=RTOL, atol=pre_atol, name="pre")
    got = ops.ffn_backward(dy, x, w1, b1, w2, b2, pre, activation=activation,
                           dropout_p=dropout_p, seed=seed)
    want = reference.ffn_backward(dy, x, w1, b1, w2, b2, pre, activation=activation,
                                  dropout_p=dropout_p, seed=seed)
    mag = ffn_chain(np.reshape(dy, (N, C)), np.reshape(x, (N, C)), w1, w2, pre, activation,
                    dropout_p)
    inner = {"dx": C + F, "dw1": N + C, "db1": N + C, "dw2": N, "db2": N}
    for name, a, b in zip(("dx", "dw1", "db1", "dw2", "db2"), got, want):
        if b is None:
            assert a is None, name
            continue
        assert_close(a, b, rtol=RTOL, atol=chain_atol(mag[name], inner[name]), name=name)
    return y, cache, got


@given(N=rows(0, 200), C=features(1, 300), F=features(1, 600),
       activation=st.sampled_from(ACTIVATIONS), with_b1=st.booleans(), with_b2=st.booleans(),
       dropout_p=st.sampled_from([0.0, 0.1, 0.5, 0.9]), seed=seeds)
def test_ffn_backward_matches_reference(N, C, F, activation, with_b1, with_b2, dropout_p, seed):
    rng = np.random.default_rng(seed)
    x = rand(rng, (N, C))
    w1, w2 = rand(rng, (F, C), 1.0 / math.sqrt(C)), rand(rng, (C, F), 1.0 / math.sqrt(F))
    b1 = rand(rng, (F,)) if with_b1 else None
    b2 = rand(rng, (C,)) if with_b2 else None
    check_ffn_backward(rand(rng, (N, C)), x, w1, b1, w2, b2, activation, dropout_p, seed)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
@pytest.mark.parametrize("N", ["edge-1", "edge", 1, SKINNY + 1, ROW_BLOCK + 88,
                               2 * ROW_BLOCK + 276])
def test_ffn_row_paths(rng, activation, dropout_p, N):
    edge = MIN_ROWS * fastattn.get_num_threads()
    N = {"edge-1": edge - 1, "edge": edge}.get(N, N)
    x = rand(rng, (N, 64))
    w1, b1 = rand(rng, (ALIGN * 8 + 3, 64), 0.125), rand(rng, (ALIGN * 8 + 3,))
    w2, b2 = rand(rng, (64, ALIGN * 8 + 3), 0.0625), rand(rng, (64,))
    check_ffn_backward(rand(rng, (N, 64)), x, w1, b1, w2, b2, activation, dropout_p, 1234)


@pytest.mark.parametrize("N", [3, SKINNY + 5, 3 * MIN_ROWS + 1, ROW_BLOCK + 88])
def test_ffn_forward_without_dropout_is_the_inference_path(rng, N):
    """p = 0: y equals ops.ffn bit for bit (the same blocks, GEMMs and epilogues)."""
    x = rand(rng, (N, 48))
    w1, b1, w2, b2 = rand(rng, (130, 48), 0.15), rand(rng, (130,)), rand(rng, (48, 130), 0.09), \
        rand(rng, (48,))
    for activation in ACTIVATIONS:
        y, cache = ops.ffn_forward(x, w1, b1, w2, b2, activation=activation)
        np.testing.assert_array_equal(y, ops.ffn(x, w1, b1, w2, b2, activation=activation))
        assert_close(cache["pre"], reference.linear(x, w1, b1), rtol=RTOL,
                     atol=chain_atol(_abs(x) @ _abs(w1).T + _abs(b1), 48), name="pre")


def test_ffn_dropout_mask_is_the_twins(rng):
    """The hidden dropout keeps exactly reference.dropout_keep(seed, n, f, p): with w2 = I
    (C = F) the output shows the hidden itself."""
    N, F = 300, 67
    x = rand(rng, (N, F))
    w1, w2 = np.eye(F, dtype=np.float32), np.eye(F, dtype=np.float32)
    for p, seed in ((0.5, 0), (0.1, 2**64 - 1), (0.9, 12345)):
        y, _ = ops.ffn_forward(x, w1, None, w2, None, activation=None, dropout_p=p, seed=seed)
        keep = reference.dropout_keep(seed, np.arange(N), np.arange(F), p)
        np.testing.assert_array_equal(y != 0, keep & (x != 0))
        np.testing.assert_array_equal(y[keep], (x * np.float32(1 / (1 - p)))[keep])


def test_ffn_leading_dims_none_biases_and_empty(rng):
    x, dy = rand(rng, (2, 5, 33)), rand(rng, (2, 5, 33))
    w1, w2 = rand(rng, (65, 33), 0.2), rand(rng, (33, 65), 0.15)
    _, cache, (dx, dw1, db1, dw2, db2) = check_ffn_backward(dy, x, w1, None, w2, None, "gelu",
                                                            0.2, 5)
    assert dx.shape == (2, 5, 33) and cache["pre"].shape == (10, 65)
    assert db1 is None and db2 is None
    for N, C, F in ((0, 4, 8), (3, 4, 0), (3, 0, 8), (0, 0, 0)):
        x, dy = rand(rng, (N, C)), rand(rng, (N, C))
        w1, b1, w2, b2 = rand(rng, (F, C)), rand(rng, (F,)), rand(rng, (C, F)), rand(rng, (C,))
        y, cache = ops.ffn_forward(x, w1, b1, w2, b2)
        ry, rcache = reference.ffn_forward(x, w1, b1, w2, b2)
        np.testing.assert_array_equal(y, ry)
        got = ops.ffn_backward(dy, x, w1, b1, w2, b2, cache["pre"])
        want = reference.ffn_backward(dy, x, w1, b1, w2, b2, cache["pre"])
        for a, b, name in zip(got, want, ("dx", "dw1", "db1", "dw2", "db2")):
            assert a.shape == b.shape, name
            assert_close(a, b, **TOL["empty_sizes"], name=f"{name} {(N, C, F)}")


# ---- finite differences of the float64 twins -----------------------------------------------


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_linear_twin_matches_finite_differences(activation):
    rng = np.random.default_rng(5)
    x, w, b, dy = (rng.standard_normal(s) for s in ((4, 3), (5, 3), (5,), (4, 5)))
    with float64_twins():
        def loss():
            return float(np.sum(reference.linear(x, w, b, activation=activation) * dy))
        _, cache = reference.linear_forward(x, w, b, activation=activation)
        if activation == "relu":
            assert np.abs(cache["pre"]).min() > 1e-3     # no kink within the step
        dx, dw, db = reference.linear_backward(dy, x, w, pre=cache["pre"], activation=activation)
        for got, arg in ((dx, x), (dw, w), (db, b)):
            assert_close(got, numeric_grad(loss, arg), **FD, dtype=None)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dropout_p", [0.0, 0.4])
def test_ffn_twin_matches_finite_differences(activation, dropout_p):
    rng = np.random.default_rng(6)
    N, C, F = 4, 3, 6
    x, dy = rng.standard_normal((N, C)), rng.standard_normal((N, C))
    w1, b1 = rng.standard_normal((F, C)), rng.standard_normal(F)
    w2, b2 = rng.standard_normal((C, F)), rng.standard_normal(C)
    kw = dict(activation=activation, dropout_p=dropout_p, seed=99)
    with float64_twins():
        def loss():
            return float(np.sum(reference.ffn_forward(x, w1, b1, w2, b2, **kw)[0] * dy))
        _, cache = reference.ffn_forward(x, w1, b1, w2, b2, **kw)
        grads = reference.ffn_backward(dy, x, w1, b1, w2, b2, cache["pre"], **kw)
        for got, arg in zip(grads, (x, w1, b1, w2, b2)):
            assert_close(got, numeric_grad(loss, arg), **FD, dtype=None)


# ---- torch autograd ------------------------------------------------------------------------


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("N,K,M", [(10, 12, 7), (300, 513, 17), (600, 64, 256)])
def test_linear_vs_torch_autograd(rng, activation, N, K, M):
    torch = requires_torch()
    x, w, b = rand(rng, (N, K)), rand(rng, (M, K), 1 / math.sqrt(K)), rand(rng, (M,))
    dy = rand(rng, (N, M))
    _, cache = ops.linear_forward(x, w, b, activation=activation)
    dx, dw, db = ops.linear_backward(dy, x, w, pre=cache["pre"], activation=activation)
    xt, wt, bt = (to_torch(a).requires_grad_() for a in (x, w, b))
    torch_activation(activation)(torch.nn.functional.linear(xt, wt, bt)).backward(to_torch(dy))
    dz = _abs(dy)
    rtol, factor = TOL["linear_grad_torch"]["rtol"], TOL["linear_grad_torch"]["atol"]
    assert_close(dx, xt.grad.numpy(), rtol=rtol, atol=chain_atol(dz @ _abs(w), M, factor),
                 name="dx")
    assert_close(dw, wt.grad.numpy(), rtol=rtol, atol=chain_atol(dz.T @ _abs(x), N, factor),
                 name="dweight")
    assert_close(db, bt.grad.numpy(), rtol=rtol, atol=chain_atol(dz.sum(axis=0), N, factor),
                 name="dbias")


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.25])
@pytest.mark.parametrize("N", [12, 600])
def test_ffn_vs_torch_autograd(rng, activation, dropout_p, N):
    """torch's linear2(dropout(act(linear1(x)))) with our mask (torch's RNG differs): the
    hidden is multiplied by keep / (1 - p) from reference.dropout_keep."""
    torch = requires_torch()
    C, F = 64, 256
    x, dy = rand(rng, (N, C)), rand(rng, (N, C))
    w1, b1, w2, b2 = rand(rng, (F, C), 0.125), rand(rng, (F,)), rand(rng, (C, F), 0.0625), \
        rand(rng, (C,))
    seed = 77
    y, cache = ops.ffn_forward(x, w1, b1, w2, b2, activation=activation, dropout_p=dropout_p,
                               seed=seed)
    grads = ops.ffn_backward(dy, x, w1, b1, w2, b2, cache["pre"], activation=activation,
                             dropout_p=dropout_p, seed=seed)
    ts = [to_torch(a).requires_grad_() for a in (x, w1, b1, w2, b2)]
    keep = reference.dropout_keep(seed, np.arange(N), np.arange(F), dropout_p)
    mask = to_torch((keep / (1 - dropout_p)).astype(np.float32))
    fl = torch.nn.functional.linear
    yt = fl(torch_activation(activation)(fl(ts[0], ts[1], ts[2])) * mask, ts[3], ts[4])
    yt.backward(to_torch(dy))
    mag = ffn_chain(dy, x, w1, w2, cache["pre"], activation, dropout_p)
    rtol, factor = TOL["linear_grad_torch"]["rtol"], TOL["linear_grad_torch"]["atol"]
    assert_close(y, yt.detach().numpy(), rtol=rtol,
                 atol=chain_atol(_abs(x) @ _abs(w1).T @ _abs(w2).T / (1 - dropout_p),
                                 C + F, factor), name="y")
    inner = {"dx": C + F, "dw1": N + C, "db1": N + C, "dw2": N, "db2": N}
    for name, got, t in zip(("dx", "dw1", "db1", "dw2", "db2"), grads, ts):
        assert_close(got, t.grad.numpy(), rtol=rtol,
                     atol=chain_atol(mag[name], inner[name], factor), name=name)


# ---- accumulation and aliasing (the model's entry points) -----------------------------------


def test_linear_backward_into_accumulates(rng):
    N, K, M = 3 * MIN_ROWS + 5, 40, 72
    x, w, b, dy = rand(rng, (N, K)), rand(rng, (M, K), 0.2), rand(rng, (M,)), rand(rng, (N, M))
    _, cache = ops.linear_forward(x, w, b, activation="gelu")
    dx_ref, dw_ref, db_ref = ops.linear_backward(dy, x, w, pre=cache["pre"], activation="gelu")
    gelu = ops.ACTIVATIONS["gelu"]
    dw, db = np.full((M, K), 0.25, np.float32), np.full(M, -1.0, np.float32)
    _fast.linear_backward_into(None, dw, db, dy, x, w, cache["pre"], gelu, True)
    assert_close(dw, dw_ref + np.float32(0.25), **TOL["linear_grad_accumulate"],
                 name="dweight +=")
    np.testing.assert_array_equal(db, db_ref + np.float32(-1.0))
    # dz in place over pre (the model's pre is not needed after its backward)
    dx, dw = np.full((N, K), np.nan, np.float32), np.full((M, K), np.nan, np.float32)
    pre = cache["pre"].copy()
    _fast.linear_backward_into(dx, dw, None, dy, x, w, pre, gelu, False, dz=pre)
    np.testing.assert_array_equal(dx, dx_ref)
    np.testing.assert_array_equal(dw, dw_ref)
    # no activation: dz is dy itself
    dx2 = np.empty((N, K), np.float32)
    _fast.linear_backward_into(dx2, None, None, dy, x, w, None, 0, False)
    np.testing.assert_array_equal(dx2, ops.linear_backward(dy, x, w)[0])


def test_ffn_forward_and_backward_into(rng):
    N, C, F = 3 * MIN_ROWS + 5, 40, 136
    x, dy = rand(rng, (N, C)), rand(rng, (N, C))
    w1, b1, w2, b2 = rand(rng, (F, C), 0.15), rand(rng, (F,)), rand(rng, (C, F), 0.1), \
        rand(rng, (C,))
    kw = dict(activation="relu", dropout_p=0.3, seed=8)
    y_ref, cache = ops.ffn_forward(x, w1, b1, w2, b2, **kw)
    ref = ops.ffn_backward(dy, x, w1, b1, w2, b2, cache["pre"], **kw)
    relu = ops.ACTIVATIONS["relu"]
    y, pre = np.empty((N, C), np.float32), np.empty((N, F), np.float32)
    _fast.ffn_forward_into(y, pre, x, w1, b1, w2, b2, relu, 0.3, 8)
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_array_equal(pre, cache["pre"])
    grads = [np.full(a.shape, 0.5, np.float32) for a in ref]
    _fast.ffn_backward_into(None, *grads[1:], dy, x, w1, w2, pre, relu, 0.3, 8, True, dpre=pre)
    for g, r, name in zip(grads[1:], ref[1:], ("dw1", "db1", "dw2", "db2")):
        assert_close(g, r + np.float32(0.5), **TOL["linear_grad_accumulate"], name=f"{name} +=")
    dx = np.empty((N, C), np.float32)
    _fast.ffn_backward_into(dx, None, None, None, None, dy, x, w1, w2, cache["pre"].copy(), relu,
                           0.3, 8, False)
    np.testing.assert_array_equal(dx, ref[0])


# ---- threads, teams and SIMD levels --------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("N", [MIN_ROWS // 2, 3 * MIN_ROWS + 1, 2 * ROW_BLOCK + 276])
def test_threads(restore_threads, rng, n, N):
    """Every gradient bit-identical for every thread count (the engine: one sum in k order per
    element; the bias sums in a fixed order) and from one run to the next."""
    C, F = 64, 200
    x, dy = rand(rng, (N, C)), rand(rng, (N, C))
    w1, b1, w2, b2 = rand(rng, (F, C), 0.125), rand(rng, (F,)), rand(rng, (C, F), 0.07), \
        rand(rng, (C,))

    # the forwards' caches once (every thread count differentiates the same inputs)
    _, cl = ops.linear_forward(x, w1, b1, activation="gelu")
    _, cf = ops.ffn_forward(x, w1, b1, w2, b2, dropout_p=0.2, seed=4)

    def run(threads):
        fastattn.set_num_threads(threads)
        lin = ops.linear_backward(rand(np.random.default_rng(1), (N, F)), x, w1, pre=cl["pre"],
                                  activation="gelu")
        ffn = ops.ffn_backward(dy, x, w1, b1, w2, b2, cf["pre"], dropout_p=0.2, seed=4)
        return lin, ffn
    (lin1, ffn1), (linn, ffnn), (linn2, ffnn2) = run(1), run(n), run(n)
    np.testing.assert_array_equal(lin1[2], linn[2], err_msg="linear dbias")
    np.testing.assert_array_equal(ffn1[4], ffnn[4], err_msg="ffn db2")
    for one, many, again, names in ((lin1, linn, linn2, ("dx", "dweight", "dbias")),
                                    (ffn1, ffnn, ffnn2, ("dx", "dw1", "db1", "dw2", "db2"))):
        for a, b, c, name in zip(one, many, again, names):
            np.testing.assert_array_equal(b, c, err_msg=f"{name}: run to run, {n} threads")
            np.testing.assert_array_equal(b, a, err_msg=f"{name}: {n} threads vs 1")


def isa_checks():
    """Run in a child under each FASTATTN_CPU_ISA (and under small OpenMP teams)."""
    rng = np.random.default_rng(12)
    tiles = fastattn.build_info()["tiles"]
    vl, min_rows = tiles["vector_width"], MIN_ROWS
    for N in (3, 2 * min_rows + 9):
        for M in (vl - 1, 3 * vl + 1):
            x, w, b = rand(rng, (N, 33)), rand(rng, (M, 33), 0.2), rand(rng, (M,))
            for act in ACTIVATIONS:
                check_linear_backward(rand(rng, (N, M)), x, w, b, act)
        x = rand(rng, (N, 40))
        F = 4 * vl + 3
        w1, b1, w2, b2 = rand(rng, (F, 40), 0.15), rand(rng, (F,)), rand(rng, (40, F), 0.1), \
            rand(rng, (40,))
        for act in ("relu", "gelu"):
            for p in (0.0, 0.35):
                check_ffn_backward(rand(rng, (N, 40)), x, w1, b1, w2, b2, act, p, 2024)
    check_activation_gradient(np.linspace(-14.0, 14.0, 2001, dtype=np.float32)[:, None], "gelu")


test_every_simd_level, test_correct_when_openmp_starts_fewer_threads = \
    child_isa_tests("test_ops_linear_backward")


# ---- bad input -----------------------------------------------------------------------------


def arr(*shape):
    return np.zeros(shape, np.float32)


def test_linear_backward_bad_input():
    with pytest.raises(ValueError, match=r"\bdy\b.*\(2, 3\).*\(2, 4\)"):
        ops.linear_backward(arr(2, 4), arr(2, 5), arr(3, 5))
    with pytest.raises(ValueError, match=r"\bx\b.*\(2, 6\).*weight.*\(3, 5\)"):
        ops.linear_backward(arr(2, 3), arr(2, 6), arr(3, 5))
    with pytest.raises(ValueError, match=r"\bpre\b.*required"):
        ops.linear_backward(arr(2, 3), arr(2, 5), arr(3, 5), activation="relu")
    with pytest.raises(ValueError, match=r"\bpre\b.*\(2, 3\).*\(3, 2\)"):
        ops.linear_backward(arr(2, 3), arr(2, 5), arr(3, 5), pre=arr(3, 2), activation="gelu")
    with pytest.raises(ValueError, match=r"activation"):
        ops.linear_backward(arr(2, 3), arr(2, 5), arr(3, 5), pre=arr(2, 3), activation="tanh")
    with pytest.raises(ValueError, match=r"activation"):
        ops.linear_forward(arr(2, 5), arr(3, 5), activation="tanh")


def test_ffn_backward_bad_input():
    x, w1, w2 = arr(2, 4), arr(8, 4), arr(4, 8)
    with pytest.raises(ValueError, match=r"\bdy\b.*\(2, 4\).*\(2, 5\)"):
        ops.ffn_backward(arr(2, 5), x, w1, None, w2, None, arr(2, 8))
    with pytest.raises(ValueError, match=r"\bpre\b.*\(2, 8\).*\(2, 7\)"):
        ops.ffn_backward(arr(2, 4), x, w1, None, w2, None, arr(2, 7))
    with pytest.raises(ValueError, match=r"w2.*\(4, 8\).*\(4, 9\)"):
        ops.ffn_backward(arr(2, 4), x, w1, None, arr(4, 9), None, arr(2, 8))
    for fn in (lambda **k: ops.ffn_forward(x, w1, None, w2, None, **k),
               lambda **k: ops.ffn_backward(x, x, w1, None, w2, None, arr(2, 8), **k)):
        with pytest.raises(ValueError, match=r"\bp\b.*\[0, 1\)"):
            fn(dropout_p=1.0, seed=0)
        with pytest.raises(ValueError, match=r"seed.*required"):
            fn(dropout_p=0.1)
        with pytest.raises(ValueError, match=r"seed"):
            fn(dropout_p=0.1, seed=-1)
