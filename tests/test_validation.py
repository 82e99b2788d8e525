"""fastattn.ops rejects bad input with ValueError / TypeError naming the argument and the shapes.

Every match= regex checks the argument's name; shape errors also check that a shape is shown.
"""
import math
import re

import numpy as np
import pytest

import fastattn
from conftest import assert_close
from fastattn import _convert, _fast, kinds, ops
from tolerances import TOL


def arr(*shape):
    return np.zeros(shape, np.float32)


def re_shape(a):
    """A regex matching the printed shape of `a`, e.g. (7,) or (2, 3)."""
    return re.escape(str(tuple(a.shape)))


Q, K, V = arr(2, 3, 5, 4), arr(2, 3, 7, 4), arr(2, 3, 7, 6)   # B=2 H=3 Lq=5 Lk=7 D=4 Dv=6


# ----------------------------------------------------------------------------------------------
# attention


@pytest.mark.parametrize("name,q,k,v,pattern", [
    ("q", arr(3, 5, 4), K, V, r"\bq\b.*4-D.*\(3, 5, 4\)"),
    ("k", Q, arr(2, 3, 7, 4, 1), V, r"\bk\b.*4-D.*\(2, 3, 7, 4, 1\)"),
    ("v", Q, K, arr(7, 6), r"\bv\b.*4-D.*\(7, 6\)"),
])
def test_attention_wrong_ndim(name, q, k, v, pattern):
    with pytest.raises(ValueError, match=pattern):
        ops.attention(q, k, v)
    with pytest.raises(ValueError, match=pattern):
        ops.attention_forward(q, k, v)


def test_attention_head_dims_differ():
    with pytest.raises(ValueError, match=r"\bk\b.*\(2, 3, 5, 4\).*\(2, 3, 7, 8\)"):
        ops.attention(Q, arr(2, 3, 7, 8), V)


def test_attention_k_v_lengths_differ():
    with pytest.raises(ValueError, match=r"\bv\b.*\(2, 3, 7, 4\).*\(2, 3, 6, 6\)"):
        ops.attention(Q, K, arr(2, 3, 6, 6))


@pytest.mark.parametrize("k,v,arg", [
    (arr(1, 3, 7, 4), arr(1, 3, 7, 6), "k"),     # B mismatch with q
    (arr(2, 2, 7, 4), arr(2, 2, 7, 6), "k"),     # H mismatch with q
    (K, arr(3, 3, 7, 6), "v"),                   # B mismatch with k
    (K, arr(2, 1, 7, 6), "v"),                   # H mismatch with k
])
def test_attention_batch_or_heads_mismatch(k, v, arg):
    with pytest.raises(ValueError, match=rf"\b{arg}\b.*{re_shape(k if arg == 'k' else v)}"):
        ops.attention(Q, k, v)


@pytest.mark.parametrize("shape", [(5, 6), (3, 5, 7, 1), (2, 3, 5, 7, 1), (4, 7), (2, 4, 5, 7)])
@pytest.mark.parametrize("dtype", [bool, np.float32])
def test_attention_mask_not_broadcastable(shape, dtype):
    with pytest.raises(ValueError, match=rf"mask.*{re_shape(np.empty(shape))}.*\(2, 3, 5, 7\)"):
        ops.attention(Q, K, V, mask=np.zeros(shape, dtype))


@pytest.mark.parametrize("shape", [(2, 6), (7,), (1, 7), (2, 3, 7), (7, 2)])
def test_key_padding_mask_wrong_shape(shape):
    with pytest.raises(ValueError,
                       match=rf"key_padding_mask.*\(2, 7\).*{re_shape(np.empty(shape))}"):
        ops.attention(Q, K, V, key_padding_mask=np.zeros(shape, bool))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.int8])
def test_integer_masks_are_refused(dtype):
    # 0/1 integers are ambiguous (blocked? allowed? additive?): refused outright
    with pytest.raises(TypeError, match=r"\bmask\b.*int"):
        ops.attention(Q, K, V, mask=np.zeros((5, 7), dtype))
    with pytest.raises(TypeError, match=r"key_padding_mask.*int"):
        ops.attention(Q, K, V, key_padding_mask=np.zeros((2, 7), dtype))


BAD_DATA = {
    "str": lambda shape: np.full(shape, "a"),
    "object": lambda shape: np.zeros(shape, dtype=object),
    "complex": lambda shape: np.zeros(shape, np.complex64),
    "bool": lambda shape: np.zeros(shape, bool),
}


@pytest.mark.parametrize("kind", sorted(BAD_DATA))
@pytest.mark.parametrize("arg", ["q", "k", "v"])
def test_attention_non_numeric_data(kind, arg):
    args = {"q": Q, "k": K, "v": V}
    args[arg] = BAD_DATA[kind](args[arg].shape)
    with pytest.raises(TypeError, match=rf"\b{arg}\b.*dtype"):
        ops.attention(args["q"], args["k"], args["v"])


def test_attention_non_numeric_mask():
    with pytest.raises(TypeError, match=r"\bmask\b"):
        ops.attention(Q, K, V, mask=np.zeros((5, 7), np.complex64))
    with pytest.raises(TypeError, match=r"\bmask\b"):
        ops.attention(Q, K, V, mask=np.full((5, 7), "x"))


@pytest.mark.parametrize("scale", ["0.5", [0.5], True])
def test_attention_bad_scale(scale):
    with pytest.raises(TypeError, match=r"scale"):
        ops.attention(Q, K, V, scale=scale)


# ----------------------------------------------------------------------------------------------
# softmax


@pytest.mark.parametrize("shape,axis", [((3, 4), 2), ((3, 4), -3), ((5,), 1), ((2, 3, 4), 3)])
def test_softmax_axis_out_of_range(shape, axis):
    with pytest.raises(ValueError, match=rf"axis.*{axis}.*{re_shape(np.empty(shape))}"):
        ops.softmax(np.zeros(shape, np.float32), axis=axis)


def test_softmax_bad_axis_type_and_scalar():
    with pytest.raises((ValueError, TypeError), match=r"axis"):
        ops.softmax(np.zeros((3, 4), np.float32), axis=1.0)
    with pytest.raises(ValueError, match=r"\bx\b"):
        ops.softmax(np.float32(1.0))


@pytest.mark.parametrize("kind", sorted(BAD_DATA))
def test_softmax_non_numeric(kind):
    with pytest.raises(TypeError, match=r"\bx\b.*dtype"):
        ops.softmax(BAD_DATA[kind]((3, 4)))


# ----------------------------------------------------------------------------------------------
# layer norm


@pytest.mark.parametrize("eps", [0.0, -1e-5, math.nan, math.inf])
def test_layer_norm_bad_eps(eps):
    with pytest.raises(ValueError, match=r"eps"):
        ops.layer_norm(arr(2, 4), arr(4), arr(4), eps=eps)


def test_layer_norm_eps_not_a_number():
    with pytest.raises(TypeError, match=r"eps"):
        ops.layer_norm(arr(2, 4), arr(4), arr(4), eps="1e-5")


@pytest.mark.parametrize("arg,shape", [("weight", (5,)), ("bias", (3,)), ("weight", (1, 4)),
                                       ("bias", (4, 1))])
def test_layer_norm_param_wrong_shape(arg, shape):
    kwargs = {"weight": arr(4), "bias": arr(4)}
    kwargs[arg] = arr(*shape)
    with pytest.raises(ValueError, match=rf"\b{arg}\b.*\(4,\).*{re_shape(np.empty(shape))}"):
        ops.layer_norm(arr(2, 4), kwargs["weight"], kwargs["bias"])


def test_layer_norm_residual_wrong_shape():
    with pytest.raises(ValueError, match=r"residual.*\(2, 4\).*\(2, 5\)"):
        ops.layer_norm(arr(2, 4), arr(4), arr(4), residual=arr(2, 5))


@pytest.mark.parametrize("kind", sorted(BAD_DATA))
def test_layer_norm_non_numeric(kind):
    with pytest.raises(TypeError, match=r"\bx\b.*dtype"):
        ops.layer_norm(BAD_DATA[kind]((2, 4)), arr(4), arr(4))
    with pytest.raises(TypeError, match=r"\bweight\b.*dtype"):
        ops.layer_norm(arr(2, 4), BAD_DATA[kind]((4,)), arr(4))
    with pytest.raises(TypeError, match=r"\bresidual\b.*dtype"):
        ops.layer_norm(arr(2, 4), arr(4), arr(4), residual=BAD_DATA[kind]((2, 4)))


# ----------------------------------------------------------------------------------------------
# linear and ffn


@pytest.mark.parametrize("activation", ["tanh", "GELU", "", 1, "relu "])
def test_unknown_activation(activation):
    with pytest.raises(ValueError, match=r"activation"):
        ops.linear(arr(2, 4), arr(3, 4), activation=activation)
    with pytest.raises(ValueError, match=r"activation"):
        ops.ffn(arr(2, 4), arr(8, 4), None, arr(4, 8), None, activation=activation)


def test_linear_in_features_mismatch():
    with pytest.raises(ValueError, match=r"\bx\b.*\(2, 5\).*weight.*\(3, 4\)"):
        ops.linear(arr(2, 5), arr(3, 4))


def test_linear_weight_not_2d():
    with pytest.raises(ValueError, match=r"weight.*2-D.*\(3, 4, 1\)"):
        ops.linear(arr(2, 4), arr(3, 4, 1))


@pytest.mark.parametrize("shape", [(4,), (2,), (3, 1)])
def test_linear_bias_wrong_shape(shape):
    with pytest.raises(ValueError, match=rf"bias.*\(3,\).*{re_shape(np.empty(shape))}"):
        ops.linear(arr(2, 4), arr(3, 4), arr(*shape))


@pytest.mark.parametrize("kind", sorted(BAD_DATA))
def test_linear_non_numeric(kind):
    with pytest.raises(TypeError, match=r"\bx\b.*dtype"):
        ops.linear(BAD_DATA[kind]((2, 4)), arr(3, 4))
    with pytest.raises(TypeError, match=r"\bweight\b.*dtype"):
        ops.linear(arr(2, 4), BAD_DATA[kind]((3, 4)))


def test_ffn_w1_mismatch():
    with pytest.raises(ValueError, match=r"w1.*\(F, C\).*C = 4.*\(8, 5\)"):
        ops.ffn(arr(2, 4), arr(8, 5), None, arr(4, 8), None)


@pytest.mark.parametrize("shape", [(4, 9), (5, 8), (8, 4)])
def test_ffn_w2_mismatch(shape):
    with pytest.raises(ValueError, match=rf"w2.*\(4, 8\).*{re_shape(np.empty(shape))}"):
        ops.ffn(arr(2, 4), arr(8, 4), None, arr(*shape), None)


@pytest.mark.parametrize("arg,shape,want", [("b1", (4,), 8), ("b2", (8,), 4), ("b1", (8, 1), 8)])
def test_ffn_bias_wrong_shape(arg, shape, want):
    biases = {"b1": None, "b2": None}
    biases[arg] = arr(*shape)
    with pytest.raises(ValueError, match=rf"\b{arg}\b.*\({want},\).*{re_shape(np.empty(shape))}"):
        ops.ffn(arr(2, 4), arr(8, 4), biases["b1"], arr(4, 8), biases["b2"])


def test_ffn_weights_not_2d():
    with pytest.raises(ValueError, match=r"w1.*2-D"):
        ops.ffn(arr(2, 4), arr(8), None, arr(4, 8), None)
    with pytest.raises(ValueError, match=r"w2.*2-D"):
        ops.ffn(arr(2, 4), arr(8, 4), None, arr(4, 8, 1), None)


# ----------------------------------------------------------------------------------------------
# positional encoding and threads


@pytest.mark.parametrize("length,d_model,arg", [(-1, 4, "length"), (3, -2, "d_model")])
def test_positional_encoding_negative(length, d_model, arg):
    with pytest.raises(ValueError, match=rf"{arg}.*-\d"):
        ops.positional_encoding(length, d_model)


@pytest.mark.parametrize("length,d_model,arg", [(2.0, 4, "length"), (3, 4.5, "d_model"),
                                                ("3", 4, "length"), (True, 4, "length")])
def test_positional_encoding_non_int(length, d_model, arg):
    with pytest.raises(TypeError, match=rf"{arg}"):
        ops.positional_encoding(length, d_model)


@pytest.mark.parametrize("n", [0, -100, -10_000])
def test_set_num_threads_bad_value(restore_threads, n):
    before = fastattn.get_num_threads()
    with pytest.raises(ValueError, match=r"\bn\b"):
        fastattn.set_num_threads(n)
    assert fastattn.get_num_threads() == before          # unchanged after a refused value


@pytest.mark.parametrize("n", [2**31 - 1, 10**12, 2**64, "max+1"])
def test_set_num_threads_above_the_bound(restore_threads, n):
    """A count OpenMP cannot start (libgomp would end the process) or the binding cannot carry
    (OverflowError at the next call) is refused up front; the bound itself is accepted."""
    bound = fastattn.build_info()["max_threads"]
    assert bound >= 1024
    n = bound + 1 if n == "max+1" else n
    before = fastattn.get_num_threads()
    with pytest.raises(ValueError, match=rf"\bn={n}\b.*maximum of {bound}"):
        fastattn.set_num_threads(n)
    assert fastattn.get_num_threads() == before
    assert fastattn.set_num_threads(bound) == bound
    assert fastattn.get_num_threads() == bound


@pytest.mark.parametrize("n", [1.5, "2", True, 2.0])
def test_set_num_threads_bad_type(restore_threads, n):
    with pytest.raises(TypeError, match=r"\bn\b"):
        fastattn.set_num_threads(n)


# ---- found in review: inputs that used to slip past the checks ---------------------------------

def test_mask_with_odd_byte_strides_is_read_correctly():
    """A float32 mask viewed out of a packed record array (strides not a multiple of 4 bytes)
    must give the same result as its contiguous copy."""
    rng = np.random.default_rng(0)
    rec = np.zeros(15, [("a", "<f4"), ("b", "i1")])
    rec["a"] = rng.standard_normal(15)
    mask = rec["a"].reshape(3, 5)                               # strides (25, 5)
    q = rng.standard_normal((1, 2, 3, 8), dtype=np.float32)
    k = rng.standard_normal((1, 2, 5, 8), dtype=np.float32)
    out = fastattn.ops.attention(q, k, k, mask=mask)
    expect = fastattn.ops.attention(q, k, k, mask=np.ascontiguousarray(mask))
    np.testing.assert_array_equal(out, expect)


def test_layer_norm_eps_that_underflows_float32_is_refused():
    with pytest.raises(ValueError, match="eps"):
        fastattn.ops.layer_norm(np.ones((3, 4), np.float32), None, None, eps=1e-50)


def test_zero_dim_attention_input_is_a_value_error():
    with pytest.raises(ValueError, match="q must be 4-D"):
        fastattn.ops.attention(np.float32(1.0), np.zeros((1, 1, 1, 1)), np.zeros((1, 1, 1, 1)))


@pytest.mark.parametrize("how", ["bool_mask", "key_padding"])
def test_nan_key_hidden_by_a_mask_stays_out_in_both_twins(how):
    """A key a mask hides (True, or -inf) has score -inf whatever q.k is: a NaN in its row
    reaches neither twin's output (test_attention_masks.py covers every path)."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 1, 2, 4), dtype=np.float32)
    k = rng.standard_normal((1, 1, 3, 4), dtype=np.float32)
    k[0, 0, 2, 0] = np.nan
    kw = ({"mask": np.array([[False, False, True]] * 2)} if how == "bool_mask"
          else {"key_padding_mask": np.array([[False, False, True]])})
    fast = fastattn.ops.attention(q, k, k, **kw)
    ref = fastattn.reference.attention(q, k, k, **kw)
    assert np.isfinite(fast).all() and np.isfinite(ref).all()
    assert_close(fast, ref, **TOL["attention_small"], name="out")


def misaligned(a):
    """A float32 copy of `a` whose data sits one byte past a float boundary (np.frombuffer at an
    odd offset, as from a packed file): readable by NumPy, not by a whole-float load."""
    a = np.asarray(a, np.float32)
    out = np.frombuffer(b"\0" + a.tobytes(), np.float32, offset=1).reshape(a.shape)
    assert not out.flags.aligned
    return out


def test_misaligned_inputs_are_copied_to_aligned_memory():
    """Every array handed to the C kernels is aligned (the sanitizer build reports a misaligned
    float load as undefined behaviour); the results equal those of aligned copies."""
    rng = np.random.default_rng(5)
    for helper in (_convert.array, _convert.contig):
        assert helper(misaligned(np.ones((3, 4))), "x", "t").flags.aligned
    assert _convert.strided(misaligned(np.ones((3, 4)))).flags.aligned
    assert ops._mask_bias(misaligned(np.ones((3, 4))), "mask", "t").flags.aligned
    assert kinds.pack_panels(misaligned(np.ones((3, 4)))).flags.aligned

    q, k, v = (rng.standard_normal((2, 2, n, 8)).astype(np.float32) for n in (5, 7, 7))
    mask = rng.standard_normal((5, 7)).astype(np.float32)
    kpm = np.where(rng.random((2, 7)) < 0.3, -np.inf, 0).astype(np.float32)
    np.testing.assert_array_equal(
        ops.attention(*map(misaligned, (q, k, v)), mask=misaligned(mask),
                      key_padding_mask=misaligned(kpm)),
        ops.attention(q, k, v, mask=mask, key_padding_mask=kpm))
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((6, 8), (8,), (8,)))
    np.testing.assert_array_equal(ops.softmax(misaligned(x)), ops.softmax(x))
    np.testing.assert_array_equal(
        ops.layer_norm(misaligned(x), misaligned(w), misaligned(b), residual=misaligned(x)),
        ops.layer_norm(x, w, b, residual=x))
    W, W2 = rng.standard_normal((5, 8)).astype(np.float32), rng.standard_normal((8, 5))
    np.testing.assert_array_equal(ops.linear(misaligned(x), misaligned(W), misaligned(w[:5])),
                                  ops.linear(x, W, w[:5]))
    np.testing.assert_array_equal(
        ops.ffn(misaligned(x), misaligned(W), None, misaligned(W2), misaligned(b)),
        ops.ffn(x, W, None, W2.astype(np.float32), b))


# ---- degenerate inputs: both twins give the same error, or the same result -------------------

SCALAR = np.float32(3.0)
SCALAR_CALLS = {
    "softmax": (lambda F: F.softmax(SCALAR), r"softmax: x must have at least 1 dimension"),
    "layer_norm": (lambda F: F.layer_norm(SCALAR, None, None), r"layer_norm: x .*scalar"),
    "layer_norm_forward": (lambda F: F.layer_norm_forward(SCALAR, None, None),
                           r"layer_norm: x .*scalar"),
    "linear": (lambda F: F.linear(SCALAR, arr(2, 1)), r"linear: x .*scalar"),
    "linear_weight": (lambda F: F.linear(arr(3), SCALAR), r"linear: weight must be 2-D.*\(\)"),
    "ffn": (lambda F: F.ffn(SCALAR, arr(2, 1), None, arr(1, 2), None), r"ffn: x .*scalar"),
    "attention_q": (lambda F: F.attention(SCALAR, K, V), r"attention: q must be 4-D.*\(\)"),
    "attention_k": (lambda F: F.attention(Q, SCALAR, V), r"attention: k must be 4-D.*\(\)"),
    "attention_v": (lambda F: F.attention_forward(Q, K, SCALAR),
                    r"attention: v must be 4-D.*\(\)"),
}


@pytest.mark.parametrize("twin", ["ops", "reference"])
@pytest.mark.parametrize("case", sorted(SCALAR_CALLS))
def test_scalar_inputs_raise_the_same_value_error_in_both_twins(twin, case):
    call, pattern = SCALAR_CALLS[case]
    with pytest.raises(ValueError, match=pattern):
        call(getattr(fastattn, twin))


def _both(call):
    """call(ops) and call(reference), each result flattened to a list of float32 arrays."""
    def flat(r):
        if isinstance(r, dict):
            return [r[key] for key in sorted(r)]
        if isinstance(r, tuple):
            return [a for item in r for a in flat(item)]
        return [r]
    return flat(call(fastattn.ops)), flat(call(fastattn.reference))


def _qkv(B, H, Lq, Lk, D, Dv, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, H, Lq, D)), rng.standard_normal((B, H, Lk, D)),
            rng.standard_normal((B, H, Lk, Dv)))


DEGENERATE = {
    "attention D=0": lambda F: F.attention(*_qkv(2, 2, 3, 5, 0, 4), return_weights=True),
    "attention D=0 causal masked": lambda F: F.attention_forward(
        *_qkv(1, 2, 4, 3, 0, 2), causal=True, mask=np.eye(4, 3, dtype=bool),
        key_padding_mask=np.array([[False, True, False]])),
    "attention D=0 scaled": lambda F: F.attention(*_qkv(1, 1, 2, 3, 0, 2), scale=0.5),
    "attention Lk=0": lambda F: F.attention_forward(*_qkv(2, 1, 3, 0, 4, 5)),
    "attention Lq=0": lambda F: F.attention_forward(*_qkv(2, 1, 0, 3, 4, 5), causal=True),
    "attention Dv=0": lambda F: F.attention_forward(*_qkv(1, 2, 3, 3, 4, 0)),
    "attention B=0": lambda F: F.attention(*_qkv(0, 2, 3, 3, 4, 4), return_weights=True),
    "softmax C=0": lambda F: F.softmax(arr(3, 0)),
    "softmax N=0": lambda F: F.softmax(arr(0, 4), axis=0),
    "layer_norm N=0": lambda F: F.layer_norm_forward(arr(0, 4), arr(4), arr(4)),
    "linear N=0": lambda F: F.linear(arr(2, 0, 4), arr(3, 4), arr(3)),
    "linear K=0": lambda F: F.linear(arr(2, 0), arr(3, 0), np.ones(3), activation="gelu"),
    "linear M=0": lambda F: F.linear(arr(2, 4), arr(0, 4)),
    "ffn F=0": lambda F: F.ffn(arr(2, 4), arr(0, 4), None, arr(4, 0), np.ones(4)),
    "ffn N=0": lambda F: F.ffn(arr(0, 4), arr(8, 4), None, arr(4, 8), None),
}


@pytest.mark.parametrize("case", sorted(DEGENERATE))
def test_degenerate_sizes_give_the_same_result_in_both_twins(case):
    fast, ref = _both(DEGENERATE[case])
    assert len(fast) == len(ref)
    for a, b in zip(fast, ref):
        assert a.dtype == np.float32 and b.dtype == np.float32
        assert_close(a, b, **TOL["empty_sizes"], name=case)
