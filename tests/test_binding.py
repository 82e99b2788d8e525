"""The private entry points (ops._*_into, the packed kernel) straight on the binding, with arrays
that have no elements: the binding passes NULL for them and the kernels must write exactly the
elements that exist. (Under the debug and sanitizer builds, Cython's bounds checks and ASan
would catch a pointer taken to an empty view or a read through NULL.)
"""
import numpy as np
import pytest

from conftest import assert_close
from fastattn import _fast, _kernels, kinds, ops, reference
from strategies import rand
from tolerances import TOL

RELU = ops.ACTIVATIONS["relu"]


def empty(*shape):
    return np.empty(shape, np.float32)


@pytest.mark.parametrize("N,K,M", [(0, 4, 5), (3, 4, 0), (0, 0, 0), (3, 0, 5), (20, 0, 5)])
def test_linear_into_empty_sizes(rng, N, K, M):
    x, w, b = rand(rng, (N, K)), rand(rng, (M, K)), rand(rng, (M,))
    y = np.full((N, M), np.nan, np.float32)
    _fast.linear_into(y, x, w, b, RELU)
    np.testing.assert_array_equal(y, reference.linear(x, w, b, activation="relu"))


@pytest.mark.parametrize("N,C,F", [(0, 4, 8), (3, 4, 0), (20, 4, 0), (3, 0, 8), (0, 0, 0)])
def test_ffn_into_empty_sizes(rng, N, C, F):
    x = rand(rng, (N, C))
    w1, b1, w2, b2 = rand(rng, (F, C)), rand(rng, (F,)), rand(rng, (C, F)), rand(rng, (C,))
    y = np.full((N, C), np.nan, np.float32)
    _fast.ffn_into(y, x, w1, b1, w2, b2, RELU)
    np.testing.assert_array_equal(y, reference.ffn(x, w1, b1, w2, b2))
    y = np.full((N, C), np.nan, np.float32)
    _fast.ffn_into(y, x, w1, None, w2, None, RELU)
    np.testing.assert_array_equal(y, reference.ffn(x, w1, None, w2, None))


@pytest.mark.parametrize("shape", [(0, 6), (3, 0), (0, 0)])
def test_layer_norm_and_softmax_into_empty(rng, shape):
    x = rand(rng, shape)
    y = empty(*shape)
    _fast.layer_norm_into(y, x, None, None, 1e-5, x.copy(), empty(*shape))
    assert ops.softmax(x).shape == shape
    assert ops.layer_norm(x, None, None).shape == shape


@pytest.mark.parametrize("N,K,M", [(0, 4, 5), (3, 4, 0), (3, 0, 5), (0, 0, 0)])
def test_packed_linear_empty_sizes(rng, N, K, M):
    x, w, b = rand(rng, (N, K)), rand(rng, (M, K)), rand(rng, (M,))
    y = np.full((N, M), np.nan, np.float32)
    _fast.linear_packed_into(y, x, kinds.pack_panels(w), b, RELU)
    np.testing.assert_array_equal(y, reference.linear(x, w, b, activation="relu"))


@pytest.mark.parametrize("B,H,Lq,Lk,D,Dv", [(0, 2, 3, 4, 5, 6), (2, 2, 0, 4, 5, 6),
                                            (2, 2, 3, 0, 5, 6), (2, 2, 3, 4, 0, 6),
                                            (2, 2, 3, 4, 5, 0)])
def test_attention_into_empty_sizes(rng, B, H, Lq, Lk, D, Dv):
    q, k, v = rand(rng, (B, H, Lq, D)), rand(rng, (B, H, Lk, D)), rand(rng, (B, H, Lk, Dv))
    out = np.full((B, H, Lq, Dv), np.nan, np.float32)
    _fast.attention_into(out, q, k, v, None, None, False, 1.0)
    assert_close(out, reference.attention(q, k, v, scale=1.0), **TOL["empty_sizes"],
                 name="out")


# ---- the decode step's entries check their ndarrays by hand (no typed memoryviews) --------------

OTHER_ORDER = ">f4" if np.little_endian else "<f4"     # float32 in the other byte order


def _unaligned(shape):
    """A float32 array whose data starts one byte past an element boundary."""
    n = int(np.prod(shape))
    return np.frombuffer(np.zeros(4 * n + 8, np.uint8), np.float32, n, 1).reshape(shape)


def _linear_args(rng, N=2, K=8, M=4):
    x, w, b = rand(rng, (N, K)), rand(rng, (M, K)), rand(rng, (M,))
    q = ops.QuantizedWeight.from_float(w, "int8")
    h = ops.QuantizedWeight.from_float(w, "bf16")
    p = kinds.pack_panels(w)
    y = np.empty((N, M), np.float32)
    calls = {
        "int8": lambda y=y, x=x, b=b, s=q.scale: _kernels.linear_int8_forward(
            y, x, q._kernel_arrays()[1], s, b, 0, 1),
        "bf16": lambda y=y, x=x, b=b: _kernels.linear_bf16_forward(
            y, x, h._kernel_arrays()[1], b, 0, 1),
        "packed": lambda y=y, x=x, b=b: _kernels.linear_packed_forward(y, x, p, b, 0, 1),
    }
    return x, w, b, y, calls


@pytest.mark.parametrize("kind", ["int8", "bf16", "packed"])
def test_linear_entries_refuse_bad_arrays(rng, kind):
    x, w, b, y, calls = _linear_args(rng)
    call = calls[kind]
    call()                                               # the good call runs
    bad = {
        "y": [y.astype(np.float64), y.reshape(-1), np.empty((2, 8), np.float32)[:, ::2],
              _readonly(y), _unaligned(y.shape), None],
        "x": [x.astype(np.float64), x[:, ::2], x.reshape(-1), [list(r) for r in x],
              _unaligned(x.shape), x.astype(OTHER_ORDER), None],
        "b": [b.astype(np.float64), b[None], _unaligned(b.shape),
              b.astype(OTHER_ORDER)],
    }
    for name, values in bad.items():
        for value in values:
            with pytest.raises((TypeError, ValueError), match=rf"^{name[0]}"):
                call(**{name: value})


def test_layer_norm_entry_refuses_bad_arrays(rng):
    x, r = rand(rng, (3, 8)), rand(rng, (3, 8))
    w, b = rand(rng, (8,)), rand(rng, (8,))
    y = np.empty((3, 8), np.float32)

    def call(y=y, x=x, residual=r, weight=w):
        _kernels.layer_norm_forward(y, None, None, None, x, residual, weight, b, 1e-5, 1)

    call()
    assert_close(y, reference.layer_norm(x + r, w, b), **TOL["layer_norm_fused_residual"],
                 name="y")
    for kw, name in [({"y": _readonly(y)}, "y"), ({"y": None}, "y"), ({"x": x.T}, "x"),
                     ({"x": x.astype(np.float16)}, "x"), ({"residual": r[:, :, None]},
                                                          "residual"),
                     ({"weight": _unaligned((8,))}, "weight"),
                     ({"weight": w.astype(OTHER_ORDER)}, "weight")]:
        with pytest.raises((TypeError, ValueError), match=rf"^{name}"):
            call(**kw)


def test_attention_entry_checks_views(rng):
    q, k, v = rand(rng, (1, 2, 3, 4)), rand(rng, (1, 2, 5, 4)), rand(rng, (1, 2, 5, 4))
    out = np.empty((1, 2, 3, 4), np.float32)

    def call(out=out, q=q, k=k, v=v, mask=None):
        _kernels.attention_forward(out, None, None, q, k, v, mask, None, 0.5, False, 1)

    big = rand(rng, (1, 2, 9, 4))                 # a strided view: a cache's first positions
    call(k=big[:, :, :5], v=big[:, :, 4:])
    assert_close(out, reference.attention(q, big[:, :, :5], big[:, :, 4:], scale=0.5),
                 **TOL["attention_small"], name="strided k, v")
    bias = np.broadcast_to(rand(rng, (5,)), (1, 2, 3, 5))      # zero strides: allowed for mask
    call(mask=bias)
    assert_close(out, reference.attention(q, k, v, mask=bias, scale=0.5),
                 **TOL["attention_small"], name="broadcast mask")
    one = np.lib.stride_tricks.as_strided(q, (1, 2, 3, 4), (3, 48, 16, 4))   # odd stride on
    call(q=one)                                                # an axis of one: never used
    assert_close(out, reference.attention(q, k, v, scale=0.5), **TOL["attention_small"],
                 name="odd stride on an axis of one")
    for kw, name in [({"q": q[..., ::2]}, "q"), ({"k": k.astype(np.float64)}, "k"),
                     ({"v": v[0]}, "v"), ({"out": _readonly(out)}, "out"), ({"out": None}, "out"),
                     ({"q": _unaligned(q.shape)}, "q"),
                     ({"k": k.astype(OTHER_ORDER)}, "k"),
                     ({"mask": np.zeros((1, 2, 3, 5), np.float64)}, "mask")]:
        with pytest.raises((TypeError, ValueError), match=rf"^{name}"):
            call(**kw)


def _readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a
