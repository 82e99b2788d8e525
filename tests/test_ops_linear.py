"""fastattn.ops.linear and ops.ffn (the GEMM engine + fused epilogue) against the twin and torch.

Tolerance of a float32 dot product of K terms: a few eps * sqrt(K) times the size of the terms
(max of |x| @ |w|^T + |b|), not of the result, which may cancel to ~0.
"""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from conftest import TILES, assert_close, requires_torch, to_torch, torch_activation
from fastattn import _fast, kinds, ops, reference
from strategies import features, rand, rows, seeds
from tolerances import TOL, dot_atol, ffn_atol

ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh", "silu"]

# Row counts around the engine's tiles and tasks: a few rows (SKINNY: fewer than a tile's rows
# on every level), one task per thread or several (MIN_ROWS rows per thread), and the bf16
# tiles' ROW_BLOCK-row blocks.
SKINNY, ROW_BLOCK = 8, TILES["row_block"]
MIN_ROWS = 128
PANEL, TILE_ROWS = TILES["packed_panel"], TILES["packed_tile_rows"]


def check_linear(x, w, b=None, activation=None):
    y = ops.linear(x, w, b, activation=activation)
    ref = reference.linear(x, w, b, activation=activation)
    assert_close(y, ref, rtol=TOL["linear"]["rtol"], atol=dot_atol(x, w, bias=b),
                 name=f"linear(activation={activation})")
    return y


def check_ffn(x, w1, b1, w2, b2, activation="relu"):
    y = ops.ffn(x, w1, b1, w2, b2, activation=activation)
    ref = reference.ffn(x, w1, b1, w2, b2, activation=activation)
    assert_close(y, ref, rtol=TOL["ffn"]["rtol"], atol=ffn_atol(x, w1, b1, w2, b2, activation),
                 name=f"ffn(activation={activation})")
    return y


# ----------------------------------------------------------------------------------------------
# linear


@given(N=rows(), K=features(), M=features(1, 600), activation=st.sampled_from(ACTIVATIONS),
       with_bias=st.booleans(), seed=seeds)
def test_linear_matches_reference(N, K, M, activation, with_bias, seed):
    rng = np.random.default_rng(seed)
    x, w = rand(rng, (N, K)), rand(rng, (M, K), 1.0 / math.sqrt(K))
    b = rand(rng, (M,)) if with_bias else None
    y = check_linear(x, w, b, activation)
    assert y.shape == (N, M) and y.dtype == np.float32


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("N", ["edge-1", "edge", "edge+1", ROW_BLOCK + 88, 2 * ROW_BLOCK + 276])
def test_linear_many_rows_multiblock(rng, activation, N):
    # around MIN_ROWS rows per thread: few and many engine tasks per thread
    edge = MIN_ROWS * fastattn.get_num_threads()
    N = {"edge-1": edge - 1, "edge": edge, "edge+1": edge + 1}.get(N, N)
    x, w, b = rand(rng, (N, 64)), rand(rng, (129, 64), 0.125), rand(rng, (129,))
    check_linear(x, w, b, activation)


@pytest.mark.parametrize("N", [1, SKINNY - 1, SKINNY, SKINNY + 1, 2 * SKINNY + 1])
def test_linear_few_rows(rng, N):
    x, w, b = rand(rng, (N, 77)), rand(rng, (301, 77), 0.1), rand(rng, (301,))
    for activation in ACTIVATIONS:
        check_linear(x, w, b, activation)


def test_linear_leading_dims_and_noncontiguous(rng):
    x, w, b = rand(rng, (2, 3, 17)), rand(rng, (5, 17)), rand(rng, (5,))
    y = check_linear(x, w, b, "gelu")
    assert y.shape == (2, 3, 5)
    x_t = rand(rng, (17, 6)).T                                # (6, 17) non-contiguous
    w_t = rand(rng, (17, 5)).T                                # (5, 17) non-contiguous
    y_t = check_linear(x_t, w_t, b)
    np.testing.assert_array_equal(y_t, ops.linear(np.ascontiguousarray(x_t),
                                                  np.ascontiguousarray(w_t), b))
    y64 = ops.linear(x_t.astype(np.float64), w_t.astype(np.float64), b.astype(np.float64))
    assert y64.dtype == np.float32
    np.testing.assert_array_equal(y64, y_t)


@pytest.mark.parametrize("N", [3 * MIN_ROWS + 1, 2 * ROW_BLOCK + 277])
def test_linear_by_rows_same_bits_for_every_team_size(restore_threads, rng, N):
    # every element one sum in k order (the engine), whichever thread takes its task
    x, w, b = rand(rng, (N, 600)), rand(rng, (300, 600), 0.04), rand(rng, (300,))
    out = {}
    for n in (1, 2, 3):
        fastattn.set_num_threads(n)
        out[n] = (ops.linear(x, w, b, activation="gelu"),
                  ops.ffn(x, w, b, w.T.copy(), None, activation="relu"))
    for n in (2, 3):
        for one, many in zip(out[1], out[n]):
            np.testing.assert_array_equal(many, one, err_msg=f"{n} threads vs 1")


def test_linear_empty(rng):
    w, b = rand(rng, (5, 4)), rand(rng, (5,))
    assert ops.linear(np.zeros((0, 4), np.float32), w, b).shape == (0, 5)
    assert ops.linear(np.zeros((2, 0, 4), np.float32), w, b).shape == (2, 0, 5)
    # K = 0: an empty sum; only the bias (and activation) remain
    y = ops.linear(np.zeros((3, 0), np.float32), np.zeros((5, 0), np.float32), b,
                   activation="relu")
    assert_close(y, np.broadcast_to(np.maximum(b, 0), (3, 5)), **TOL["exact"], name="K=0")


def test_activation_special_values():
    x = np.array([[0.0, 1.0, -1.0, 10.0, -10.0, 3e38, np.inf, -np.inf, np.nan]],
                 np.float32).T                                 # (9, 1)
    eye = np.eye(1, dtype=np.float32)
    for activation in ACTIVATIONS:
        y = ops.linear(x, eye, activation=activation)
        ref = reference.linear(x, eye, activation=activation)
        assert_close(y, ref, **TOL["activation_special_values"],
                     name=f"{activation} special values")


def test_gelu_accuracy_over_range():
    x = np.linspace(-12.0, 12.0, 4001, dtype=np.float32)[:, None]
    y = ops.linear(x, np.eye(1, dtype=np.float32), activation="gelu")
    assert_close(y, reference.linear(x, np.eye(1), activation="gelu"),
                 **TOL["activation"]["gelu"], name="gelu")
    # tanh form: u = k0 (x + k1 x^3) carries float32's relative error ~1e-7 into e^(2|u|),
    # so the left tail (where 1 + tanh(u) = 2 / (1 + e^(2|u|))) is good to ~1e-5 relative
    y = ops.linear(x, np.eye(1, dtype=np.float32), activation="gelu_tanh")
    assert_close(y, reference.linear(x, np.eye(1), activation="gelu_tanh"),
                 **TOL["activation"]["gelu_tanh"], name="gelu_tanh")
    # silu = x sigmoid(x), sigmoid from e^-|x| (no cancellation): a few float32 ulps; the far
    # left tail (x < -87, where e^-|x| leaves float32's normal range) reads 0 for ~1e-37
    y = ops.linear(x, np.eye(1, dtype=np.float32), activation="silu")
    assert_close(y, reference.linear(x, np.eye(1), activation="silu"),
                 **TOL["activation"]["silu"], name="silu")
    special = np.array([[-np.inf], [np.inf], [-1e30], [1e30], [-100.0], [0.0], [-0.0]],
                       np.float32)
    got = ops.linear(special, np.eye(1, dtype=np.float32), activation="silu")
    want = np.array([[0.0], [np.inf], [-0.0], [1e30], [-0.0], [0.0], [0.0]], np.float32)
    np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------------------------------------
# ffn


@given(N=rows(), C=features(1, 520), F=features(), activation=st.sampled_from(ACTIVATIONS),
       with_b1=st.booleans(), with_b2=st.booleans(), seed=seeds)
def test_ffn_matches_reference(N, C, F, activation, with_b1, with_b2, seed):
    rng = np.random.default_rng(seed)
    x = rand(rng, (N, C))
    w1, w2 = rand(rng, (F, C), 1.0 / math.sqrt(C)), rand(rng, (C, F), 1.0 / math.sqrt(F))
    b1 = rand(rng, (F,)) if with_b1 else None
    b2 = rand(rng, (C,)) if with_b2 else None
    y = check_ffn(x, w1, b1, w2, b2, activation)
    assert y.shape == (N, C) and y.dtype == np.float32


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("N", [ROW_BLOCK + 88, 2 * ROW_BLOCK + 276])
def test_ffn_large_multiblock(rng, activation, N):
    # x (N, 64), w1 (256, 64): N >= MIN_ROWS * threads splits the rows over threads, each with
    # its own (rows_per_block, F) hidden block
    x = rand(rng, (N, 64))
    w1, b1 = rand(rng, (256, 64), 0.125), rand(rng, (256,))
    w2, b2 = rand(rng, (64, 256), 0.0625), rand(rng, (64,))
    check_ffn(x, w1, b1, w2, b2, activation)


def test_ffn_leading_dims_none_biases_and_composition(rng):
    x = rand(rng, (2, 5, 33))
    w1, w2 = rand(rng, (65, 33), 0.2), rand(rng, (33, 65), 0.15)
    y = check_ffn(x, w1, None, w2, None, "gelu")
    assert y.shape == (2, 5, 33)
    composed = ops.linear(ops.linear(x, w1, activation="gelu"), w2)
    assert_close(y, composed, rtol=TOL["ffn"]["rtol"],
                 atol=ffn_atol(x, w1, None, w2, None, "gelu"),
                 name="ffn == linear(linear)")


def test_ffn_empty(rng):
    w1, b1, w2, b2 = rand(rng, (8, 4)), rand(rng, (8,)), rand(rng, (4, 8)), rand(rng, (4,))
    assert ops.ffn(np.zeros((0, 4), np.float32), w1, b1, w2, b2).shape == (0, 4)
    # F = 0: the hidden layer is empty and y = b2
    y = ops.ffn(np.ones((3, 4), np.float32), np.zeros((0, 4), np.float32), None,
                np.zeros((4, 0), np.float32), b2)
    assert_close(y, np.broadcast_to(b2, (3, 4)), **TOL["exact"], name="F=0")


# ----------------------------------------------------------------------------------------------
# against torch (skipped without torch)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("N,K,M", [(10, 12, 7), (300, 513, 17), (600, 64, 256)])
def test_linear_vs_torch(rng, activation, with_bias, N, K, M):
    torch = requires_torch()
    x, w, b = rand(rng, (N, K)), rand(rng, (M, K), 1 / math.sqrt(K)), rand(rng, (M,))
    y = ops.linear(x, w, b if with_bias else None, activation=activation)
    ref = torch_activation(activation)(torch.nn.functional.linear(
        to_torch(x), to_torch(w), to_torch(b) if with_bias else None))
    assert_close(y, ref.numpy(), rtol=TOL["torch"]["rtol"],
                 atol=2 * dot_atol(x, w, bias=b if with_bias else None), name="linear vs torch")


@pytest.mark.parametrize("N", [12, 600])
def test_ffn_vs_torch(rng, N):
    torch = requires_torch()
    x = rand(rng, (N, 64))
    w1, b1, w2, b2 = rand(rng, (256, 64), 0.125), rand(rng, (256,)), rand(rng, (64, 256), 0.0625), \
        rand(rng, (64,))
    fl = torch.nn.functional.linear
    for act in ("relu", "gelu", "gelu_tanh", "silu"):
        y = ops.ffn(x, w1, b1, w2, b2, activation=act)
        ref = fl(torch_activation(act)(fl(to_torch(x), to_torch(w1), to_torch(b1))),
                 to_torch(w2), to_torch(b2))
        assert_close(y, ref.numpy(), rtol=TOL["torch"]["rtol"],
                     atol=2 * ffn_atol(x, w1, b1, w2, b2, act), name=f"ffn({act}) vs torch")


@pytest.mark.parametrize("n_rows", sorted({*range(1, TILE_ROWS + 2), 2 * TILE_ROWS - 1,
                                           4 * TILE_ROWS + 1, 32, 133}))
@pytest.mark.parametrize("shape", [(1, 1), (PANEL - 1, 33), (PANEL, 64), (PANEL + 1, 512),
                                   (4 * PANEL + 8, 17)])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_packed_linear_matches_reference(n_rows, shape, activation):
    """The decode-step kernel (weights packed in PANEL-feature panels) vs the twin, including
    partial panels (M % PANEL), K tails, every count of rows left over after the full register
    tiles (each has its own tile shape) and row counts around the tiles' rows."""
    M, K = shape
    rng = np.random.default_rng(M * 1000 + K + n_rows)
    x = rng.standard_normal((n_rows, K), dtype=np.float32)
    w = rng.standard_normal((M, K), dtype=np.float32) / np.float32(np.sqrt(K))
    b = rng.standard_normal(M, dtype=np.float32)
    y = np.full((n_rows, M), np.nan, np.float32)
    _fast.linear_packed_into(y, x, kinds.pack_panels(w), b, ops.ACTIVATIONS[activation])
    expect = reference.linear(x, w, b, activation=activation)
    assert_close(y, expect, rtol=TOL["linear_packed"]["rtol"],
                 atol=TOL["linear_packed"]["atol"] * np.sqrt(K), name="packed linear")


def test_packed_linear_rows_are_batch_invariant():
    """Each output row is the same sum in the same order whatever the number of rows."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((13, 96), dtype=np.float32)
    pw = kinds.pack_panels(rng.standard_normal((130, 96), dtype=np.float32))
    full = np.empty((13, 130), np.float32)
    _fast.linear_packed_into(full, x, pw, None, 0)
    for r in range(13):
        one = np.empty((1, 130), np.float32)
        _fast.linear_packed_into(one, x[r:r + 1], pw, None, 0)
        assert np.array_equal(one[0], full[r])
    for n in range(2, 13):  # every count of rows left over: each takes its own tile shape
        part = np.empty((n, 130), np.float32)
        _fast.linear_packed_into(part, x[:n], pw, None, 0)
        assert np.array_equal(part, full[:n]), n
