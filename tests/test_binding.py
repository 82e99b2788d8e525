"""The private entry points (ops._*_into, the packed kernel) straight on the binding, with arrays
that have no elements: the binding passes NULL for them and the kernels must write exactly the
elements that exist. (Under the debug and sanitizer builds, Cython's bounds checks and ASan
would catch a pointer taken to an empty view or a read through NULL.)
"""
import numpy as np
import pytest

from fastattn import ops, reference
from strategies import rand

RELU = ops.ACTIVATIONS["relu"]


def empty(*shape):
    return np.empty(shape, np.float32)


@pytest.mark.parametrize("N,K,M", [(0, 4, 5), (3, 4, 0), (0, 0, 0), (3, 0, 5), (20, 0, 5)])
def test_linear_into_empty_sizes(rng, N, K, M):
    x, w, b = rand(rng, (N, K)), rand(rng, (M, K)), rand(rng, (M,))
    y = np.full((N, M), np.nan, np.float32)
    ops._linear_into(y, x, w, b, RELU)
    np.testing.assert_array_equal(y, reference.linear(x, w, b, activation="relu"))


@pytest.mark.parametrize("N,C,F", [(0, 4, 8), (3, 4, 0), (20, 4, 0), (3, 0, 8), (0, 0, 0)])
def test_ffn_into_empty_sizes(rng, N, C, F):
    x = rand(rng, (N, C))
    w1, b1, w2, b2 = rand(rng, (F, C)), rand(rng, (F,)), rand(rng, (C, F)), rand(rng, (C,))
    y = np.full((N, C), np.nan, np.float32)
    ops._ffn_into(y, x, w1, b1, w2, b2, RELU)
    np.testing.assert_array_equal(y, reference.ffn(x, w1, b1, w2, b2))
    y = np.full((N, C), np.nan, np.float32)
    ops._ffn_into(y, x, w1, None, w2, None, RELU)
    np.testing.assert_array_equal(y, reference.ffn(x, w1, None, w2, None))


@pytest.mark.parametrize("shape", [(0, 6), (3, 0), (0, 0)])
def test_layer_norm_and_softmax_into_empty(rng, shape):
    x = rand(rng, shape)
    y = empty(*shape)
    ops._layer_norm_into(y, x, None, None, 1e-5, x.copy(), empty(*shape))
    assert ops.softmax(x).shape == shape
    assert ops.layer_norm(x, None, None).shape == shape


@pytest.mark.parametrize("N,K,M", [(0, 4, 5), (3, 4, 0), (3, 0, 5), (0, 0, 0)])
def test_packed_linear_empty_sizes(rng, N, K, M):
    x, w, b = rand(rng, (N, K)), rand(rng, (M, K)), rand(rng, (M,))
    y = np.full((N, M), np.nan, np.float32)
    ops._linear_packed_into(y, x, ops.PackedWeight(w), b, RELU)
    np.testing.assert_array_equal(y, reference.linear(x, w, b, activation="relu"))


@pytest.mark.parametrize("B,H,Lq,Lk,D,Dv", [(0, 2, 3, 4, 5, 6), (2, 2, 0, 4, 5, 6),
                                            (2, 2, 3, 0, 5, 6), (2, 2, 3, 4, 0, 6),
                                            (2, 2, 3, 4, 5, 0)])
def test_attention_into_empty_sizes(rng, B, H, Lq, Lk, D, Dv):
    q, k, v = rand(rng, (B, H, Lq, D)), rand(rng, (B, H, Lk, D)), rand(rng, (B, H, Lk, Dv))
    out = np.full((B, H, Lq, Dv), np.nan, np.float32)
    ops._attention_into(out, q, k, v, None, None, False, 1.0)
    np.testing.assert_allclose(out, reference.attention(q, k, v, scale=1.0), rtol=1e-6,
                               atol=1e-6)
