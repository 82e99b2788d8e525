"""bf16 mixed-precision training's products (compute_type="bfloat16" of linear_forward /
linear_backward, ffn_forward / ffn_backward, attention_forward / attention_backward): the
kernels against the twin's emulation, which rounds at the same points (reference docstrings),
and against float32.

Bounds, as norms relative to the twin's result (rel_err):
- kernels vs twin: the kernels sum in float32 where the twin sums in float64, so a value about
  to be rounded to bf16 may differ from the twin's by a float32 ulp and round to the
  neighbouring bf16 (2^-8 relative) in rare elements; BF16_TWIN bounds that. Attention whose
  keys come in several blocks rounds P relative to the running maximum of the blocks seen so
  far (the twin: relative to the row's maximum), a difference of up to a bf16 ulp in P where
  the maximum moved: BF16_TWIN_BLOCKS.
- bf16 vs float32: each product rounds both operands to 8 significant bits (relative error
  <= 2^-9 each), so a result moves by about 2^-8 of its size; BF16_VS_FP32 bounds it from
  above, and it must move at all (a bf16 mode that silently ran float32 fails).
"""
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastattn
from fastattn import ops, reference
from conftest import assert_close, child_isa_tests, run_checks
from tolerances import TOL, scaled

BF16 = dict(compute_type="bfloat16")
BF16_TWIN = TOL["bf16_training"]["twin"]
BF16_TWIN_BLOCKS = TOL["bf16_training"]["twin_blocks"]
BF16_VS_FP32 = TOL["bf16_training"]["vs_fp32"]
BF16_MOVES = TOL["bf16_training"]["moves"]


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def rand(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def check_pair(got, twin, fp32, bound=BF16_TWIN, names=()):
    for i, (g, t, f) in enumerate(zip(got, twin, fp32)):
        name = names[i] if i < len(names) else str(i)
        if t is None:
            assert g is None and f is None, name
            continue
        assert g.shape == t.shape and g.dtype == np.float32, name
        assert rel_err(g, t) <= bound, (name, rel_err(g, t))
        moved = rel_err(t, f)
        assert BF16_MOVES < moved <= BF16_VS_FP32, (name, moved)


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("shape", [(37, 29, 23), (1, 64, 48), (300, 65, 130), (5, 1, 7),
                                   (50, 33, 47), (16, 64, 32), (97, 130, 65)])
def test_linear_bf16_against_twin_and_fp32(rng, activation, shape):
    N, K, M = shape
    x, w, b = rand(rng, (N, K)), rand(rng, (M, K)), rand(rng, M)
    got, gc = ops.linear_forward(x, w, b, activation=activation, **BF16)
    twin, tc = reference.linear_forward(x, w, b, activation=activation, **BF16)
    fp32, _ = reference.linear_forward(x, w, b, activation=activation)
    if K > 1:
        check_pair([got], [twin], [fp32], names=["y"])
    dy = rand(rng, got.shape)
    g = ops.linear_backward(dy, x, w, pre=gc["pre"], activation=activation, **BF16)
    t = reference.linear_backward(dy, x, w, pre=tc["pre"], activation=activation, **BF16)
    f = reference.linear_backward(dy, x, w, pre=tc["pre"], activation=activation)
    check_pair(g, t, f, names=["dx", "dweight", "dbias"])


def test_linear_bf16_rounds_at_the_stated_points(rng):
    """Operands exactly representable in bf16, a gradient that is not: the forward equals
    float32's, the backward equals float32's on the rounded gradient."""
    x = reference.round_bfloat16(rand(rng, (16, 24)))
    w = reference.round_bfloat16(rand(rng, (8, 24)))
    y, _ = ops.linear_forward(x, w, None, **BF16)
    assert_close(y, ops.linear_forward(x, w, None)[0], **TOL["bf16_exact_operands"], name="y",
                 equal_nan=False)
    dy = rand(rng, (16, 8))
    dyr = reference.round_bfloat16(dy)
    for a, b, name in zip(ops.linear_backward(dy, x, w, **BF16), ops.linear_backward(dyr, x, w),
                          ("dx", "dweight", "dbias")):
        assert_close(a, b, **TOL["bf16_exact_operands"], name=name, equal_nan=False)
    with pytest.raises(AssertionError):      # the unrounded gradient gives another dx
        assert_close(ops.linear_backward(dy, x, w, **BF16)[0], ops.linear_backward(dy, x, w)[0],
                     **TOL["bf16_gradient_rounded"], equal_nan=False)


@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
@pytest.mark.parametrize("shape", [(37, 24, 40), (3, 16, 33), (200, 48, 96), (300, 33, 70)])
def test_ffn_bf16_against_twin_and_fp32(rng, dropout_p, shape):
    N, C, F = shape
    x = rand(rng, (N, C))
    w1, b1, w2, b2 = rand(rng, (F, C), 0.2), rand(rng, F), rand(rng, (C, F), 0.2), rand(rng, C)
    kw = dict(activation="gelu", dropout_p=dropout_p, seed=5 if dropout_p else None)
    got, gc = ops.ffn_forward(x, w1, b1, w2, b2, **kw, **BF16)
    twin, tc = reference.ffn_forward(x, w1, b1, w2, b2, **kw, **BF16)
    fp32, _ = reference.ffn_forward(x, w1, b1, w2, b2, **kw)
    check_pair([got], [twin], [fp32], names=["y"])
    pre = ops.linear_forward(x, w1, b1, **BF16)[0]       # the same product (another order)
    assert_close(gc["pre"], pre, **scaled(TOL["bf16_pre_two_orders"], pre), name="pre",
                 equal_nan=False)
    assert not np.array_equal(gc["pre"], reference.round_bfloat16(gc["pre"]))   # kept float32
    dy = rand(rng, got.shape)
    g = ops.ffn_backward(dy, x, w1, b1, w2, b2, gc["pre"], **kw, **BF16)
    t = reference.ffn_backward(dy, x, w1, b1, w2, b2, tc["pre"], **kw, **BF16)
    f = reference.ffn_backward(dy, x, w1, b1, w2, b2, tc["pre"], **kw)
    check_pair(g, t, f, names=["dx", "dw1", "db1", "dw2", "db2"])


def _attention_case(rng, B, H, Lq, Lk, D, Dv, causal, dropout_p, masked_row=False):
    q, k, v = rand(rng, (B, H, Lq, D)), rand(rng, (B, H, Lk, D)), rand(rng, (B, H, Lk, Dv))
    kpm = None
    if masked_row:                              # batch 0 sees no key: zero output and grads
        kpm = np.zeros((B, Lk), bool)
        kpm[0] = True
    kw = dict(causal=causal, dropout_p=dropout_p, seed=3 if dropout_p else None,
              key_padding_mask=kpm)
    got, gc = ops.attention_forward(q, k, v, **kw, **BF16)
    twin, tc = reference.attention_forward(q, k, v, **kw, **BF16)
    fp32, fc = reference.attention_forward(q, k, v, **kw)
    dout = rand(rng, got.shape)
    # the backward from the twin's forward, so that it is compared alone
    g = ops.attention_backward(dout, q, k, v, twin, tc["lse"], **kw, **BF16)
    t = reference.attention_backward(dout, q, k, v, twin, tc["lse"], **kw, **BF16)
    f = reference.attention_backward(dout, q, k, v, fp32, fc["lse"], **kw)
    return (got, twin, fp32), (g, t, f), kpm


def test_attention_bf16_twin_applies_dropout_as_the_kernel_does(rng):
    # attention (not only attention_forward) with compute_type="bfloat16" and dropout: the
    # twin once left the dropout out, answering as if dropout_p were 0
    q, k, v = rand(rng, (2, 3, 9, 16)), rand(rng, (2, 3, 11, 16)), rand(rng, (2, 3, 11, 8))
    kw = dict(dropout_p=0.3, seed=11, return_weights=True, **BF16)
    got, gw = ops.attention(q, k, v, **kw)
    twin, tw = reference.attention(q, k, v, **kw)
    via_forward, _ = reference.attention_forward(q, k, v, dropout_p=0.3, seed=11, **BF16)
    assert_close(twin, via_forward, rtol=0, atol=0)            # the same function: same bits
    assert rel_err(got, twin) <= BF16_TWIN, rel_err(got, twin)
    assert np.array_equal(gw == 0, tw == 0)                    # the same weights dropped
    undropped = reference.attention(q, k, v, **BF16)
    assert rel_err(twin, undropped) > BF16_VS_FP32             # dropout really applied


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dropout_p", [0.0, 0.2])
@pytest.mark.parametrize("dims", [(2, 3, 19, 23, 16, 16), (1, 2, 40, 40, 32, 24),
                                  (2, 1, 1, 7, 9, 5), (1, 2, 150, 150, 64, 64)])
def test_attention_bf16_training_against_twin_and_fp32(rng, causal, dropout_p, dims):
    (got, twin, fp32), (g, t, f), _ = _attention_case(rng, *dims, causal, dropout_p)
    blocks = dims[3] > 16          # keys in several blocks: P rounded at the running maximum
    check_pair([got], [twin], [fp32], BF16_TWIN_BLOCKS if blocks else BF16_TWIN, ["out"])
    check_pair(g, t, f, BF16_TWIN_BLOCKS if blocks else BF16_TWIN, ["dq", "dk", "dv"])


@settings(deadline=None)
@given(B=st.integers(1, 2), H=st.integers(1, 2), Lq=st.integers(1, 33), Lk=st.integers(1, 33),
       D=st.integers(1, 20), Dv=st.integers(1, 20), causal=st.booleans(),
       dropout=st.sampled_from([0.0, 0.25]), masked_row=st.booleans(),
       scale=st.sampled_from([1e-3, 1.0, 30.0]), seed=st.integers(0, 2 ** 16))
def test_attention_bf16_backward_any_shape(B, H, Lq, Lk, D, Dv, causal, dropout, masked_row,
                                           scale, seed):
    """L = 1, odd head dims, Lq != Lk, fully masked rows (zero gradients, never NaN), scores
    from tiny to huge: the kernels follow the twin within the stated bound."""
    rng = np.random.default_rng(seed)
    q, k, v = (rand(rng, s, scale) for s in ((B, H, Lq, D), (B, H, Lk, D), (B, H, Lk, Dv)))
    kpm = None
    if masked_row:
        kpm = np.zeros((B, Lk), bool)
        kpm[0] = True
    kw = dict(causal=causal, dropout_p=dropout, seed=7 if dropout else None,
              key_padding_mask=kpm)
    out, c = reference.attention_forward(q, k, v, **kw, **BF16)
    dout = rand(rng, out.shape)
    g = ops.attention_backward(dout, q, k, v, out, c["lse"], **kw, **BF16)
    t = reference.attention_backward(dout, q, k, v, out, c["lse"], **kw, **BF16)
    for a, b in zip(g, t):
        assert np.all(np.isfinite(a))
        assert rel_err(a, b) <= BF16_TWIN_BLOCKS, rel_err(a, b)
    if masked_row:
        assert not np.any(g[0][0])
    if masked_row and not causal:
        assert not np.any(g[1][0]) and not np.any(g[2][0])


def test_compute_type_is_checked():
    x, w = np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)
    for F in (ops, reference):
        for fn, args in ((F.linear_forward, (x, w)), (F.linear_backward, (np.ones((2, 4)), x, w))):
            with pytest.raises(ValueError, match="compute_type must be one of"):
                fn(*args, compute_type="bf16")


def weight_pack_checks(rng=None):
    """A weight packed once (the model layer's per-step cache: _fast.bf16_weight_pack) gives the
    very bits of the per-call packing in all four kinds of product that read it, with row
    counts on both sides of the tiles' minimum and K past one chunk of the tiles (512)."""
    from fastattn import _fast
    rng = np.random.default_rng(5) if rng is None else rng
    r = lambda shape: reference.round_bfloat16(rand(rng, shape))   # noqa: E731
    for N, C, F in ((300, 65, 130), (40, 600, 33), (7, 48, 96)):
        x, w1, w2, b1 = r((N, C)), r((F, C)), r((C, F)), rand(rng, (F,))
        dy, dyf = r((N, F)), r((N, C))
        packs = {t: (_fast.bf16_weight_pack(w1, t), _fast.bf16_weight_pack(w2, t))
                 for t in (0, 1)}
        if fastattn.build_info()["bf16_path"] not in ("amx", "amx-emulated"):
            assert all(p is None for pair in packs.values() for p in pair)
        outs = []
        for use in (False, True):
            p0, p1 = packs[0] if use else (None, None), packs[1] if use else (None, None)
            y, pre = np.empty((N, F), np.float32), np.empty((N, F), np.float32)
            _fast.linear_into(y, x, w1, b1, 1, pre, bf16=True, packed=p1[0])
            dx, dw, db = np.empty_like(x), np.empty_like(w1), np.empty_like(b1)
            _fast.linear_backward_into(dx, dw, db, dy, x, w1, pre.copy(), 1, False, bf16=True,
                                       packed=p0[0])
            yf, pref = np.empty((N, C), np.float32), np.empty((N, F), np.float32)
            _fast.ffn_forward_into(yf, pref, x, w1, b1, w2, None, 1, bf16=True, packed=p1)
            g = [np.empty_like(a) for a in (x, w1, b1, w2)]
            _fast.ffn_backward_into(g[0], g[1], g[2], g[3], None, dyf, x, w1, w2, pref, 1, 0.0,
                                    0, False, bf16=True, packed=p0)
            outs.append([y, pre, dx, dw, db, yf, pref, *g])
        for got, want in zip(outs[1], outs[0]):
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_kept_bits_widen_to_the_rounded_values(rng):
    """What bf16 training keeps of attention's q, k, v (round_bf16_bits) widens back to the
    very values round_bf16 gives, specials included; an output array that is not C-contiguous
    is refused, not written to a copy."""
    from fastattn import _fast
    x = rand(rng, (300, 70), 3.0)
    x.flat[:6] = [np.nan, np.inf, -np.inf, 1e-40, -1e-42, 3.4e38]
    bits = _fast.round_bf16_bits(x, np.empty(x.shape, np.uint16))
    wide = _fast.widen_bf16(bits, np.empty(x.shape, np.float32))
    want = reference.round_bfloat16(x)
    np.testing.assert_array_equal(wide.view(np.uint32), want.view(np.uint32))
    with pytest.raises(ValueError, match="widen_bf16: out must be C-contiguous"):
        _fast.widen_bf16(bits[:, :35], np.empty((300, 70), np.float32)[:, ::2])
    with pytest.raises(ValueError, match="round_bf16_bits: out must be C-contiguous"):
        _fast.round_bf16_bits(x[:, :35].copy(), np.empty((300, 70), np.uint16)[:, ::2])


def test_weight_packed_once_gives_the_same_bits():
    weight_pack_checks()


def test_weight_pack_that_does_not_fit_is_refused(rng):
    from fastattn import _fast
    if fastattn.build_info()["bf16_path"] not in ("amx", "amx-emulated"):
        pytest.skip("no bf16 tiles here: nothing is packed")
    w = reference.round_bfloat16(rand(rng, (40, 24)))
    x, y = reference.round_bfloat16(rand(rng, (32, 24))), np.empty((32, 40), np.float32)
    with pytest.raises(ValueError, match=r"linear_forward: a Bf16WeightPack of \(40, 24\) "
                                         r"trans 0 .*trans 1 wanted"):
        _fast.linear_into(y, x, w, None, 0, bf16=True, packed=_fast.bf16_weight_pack(w, 0))
    w2 = reference.round_bfloat16(rand(rng, (40, 25)))
    with pytest.raises(ValueError, match=r"\(40, 25\) weight"):
        _fast.linear_into(y, np.zeros((32, 25), np.float32), w2, None, 0, bf16=True,
                          packed=_fast.bf16_weight_pack(w, 1))
    with pytest.raises(ValueError, match="bf16=False product"):
        _fast.linear_into(y, x, w, None, 0, packed=_fast.bf16_weight_pack(w, 1))


def team_checks(rng):
    """bf16 training's gradients bit-identical for teams of 1, 2 and 4: where the weight
    gradient runs (the tiles or the engine) is decided for the whole product, never by a
    thread's slice (a 17-row gradient once put its last row on the engine with 2 threads)."""
    from fastattn import _fast
    r = lambda shape: reference.round_bfloat16(rand(rng, shape))   # noqa: E731
    saved = fastattn.get_num_threads()
    for N, M, K in ((40, 17, 12), (40, 8, 4), (2, 33, 20)):
        x, w, dy = r((N, K)), r((M, K)), r((N, M))
        outs = []
        for n in (1, 2, 4):
            fastattn.set_num_threads(n)
            dx, dw, db = np.empty_like(x), np.full((M, K), 0.5, np.float32), np.zeros(M,
                                                                                   np.float32)
            _fast.linear_backward_into(dx, dw, db, dy, x, w, None, 0, True, bf16=True)
            outs.append((dx, dw, db))
        for got in outs[1:]:
            for a, b in zip(got, outs[0]):
                np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    fastattn.set_num_threads(saved)


def isa_checks():
    """Run in a child under each SIMD level (FASTATTN_CPU_ISA) and with fewer OpenMP threads."""
    rng = np.random.default_rng(1)
    weight_pack_checks(rng)
    team_checks(rng)
    test_linear_bf16_against_twin_and_fp32(rng, "relu", (300, 65, 130))
    test_linear_bf16_against_twin_and_fp32(rng, None, (50, 33, 47))
    # the weight gradient's product has 600 rows: more than one chunk of the tiles' rows
    test_linear_bf16_against_twin_and_fp32(rng, None, (40, 20, 600))
    test_ffn_bf16_against_twin_and_fp32(rng, 0.3, (200, 48, 96))
    test_ffn_bf16_against_twin_and_fp32(rng, 0.0, (300, 33, 70))
    for causal in (False, True):
        test_attention_bf16_training_against_twin_and_fp32(rng, causal, 0.2,
                                                           (1, 2, 150, 150, 64, 64))


test_every_simd_level, test_correct_when_openmp_starts_fewer_threads = \
    child_isa_tests("test_ops_bf16_training")


@pytest.mark.parametrize("path", ["fma", "avx512bf16", "amx", "amx-emulated"])
def test_every_bf16_path(path):
    """The products of 3 rows or more run on the bfloat16 compute type's path: the AMX tiles
    (real, or emulated in C on any AVX-512 CPU) or the float32 engine on the rounded operands."""
    info = fastattn.build_info()
    if path not in info["bf16_paths_available"]:
        pytest.skip(f"the {path} path is not available here ({info['bf16_paths_available']})")
    run_checks("test_ops_bf16_training", env={"FASTATTN_BF16_PATH": path})


def attention_path_checks():
    """Run in a child under each FASTATTN_ATTENTION_BF16_PATH: the backward's five products (on
    the AMX tiles, real or emulated, every operand in pairs of bf16; on the vector paths, float32
    FMA on the rounded values) follow the twin within the stated bound: several key and query
    blocks, odd head dims, causal with Lq != Lk, dropout, a batch that sees no key; a hidden key
    row holding inf (its dq share then summed by the scalar path); one thread and two (the split
    of the key and query passes) giving the same bits."""
    forced = os.environ["FASTATTN_ATTENTION_BF16_PATH"]
    assert fastattn.build_info()["attention_bf16_path"] == forced
    rng = np.random.default_rng(12)
    for dims, causal, p, masked in (((1, 2, 150, 150, 64, 64), False, 0.0, False),
                                    ((2, 1, 70, 133, 7, 33), True, 0.2, True),
                                    ((1, 1, 65, 200, 130, 17), False, 0.0, False),
                                    ((2, 2, 1, 5, 3, 2), True, 0.0, False)):
        _, (g, t, f), _ = _attention_case(rng, *dims, causal, p, masked)
        check_pair(g, t, f, BF16_TWIN_BLOCKS if dims[3] > 16 else BF16_TWIN,
                   ["dq", "dk", "dv"])
    B, H, L, D = 1, 1, 80, 24
    q, k, v = rand(rng, (B, H, L, D)), rand(rng, (B, H, L, D)), rand(rng, (B, H, L, D))
    kpm = np.zeros((B, L), bool)
    kpm[0, 70] = True
    k[0, 0, 70] = np.inf                      # hidden by the mask: must not reach any gradient
    kw = dict(key_padding_mask=kpm, **BF16)
    out, c = reference.attention_forward(q, k, v, **kw)
    dout = rand(rng, out.shape)
    outs = []
    for n in (1, 2):
        fastattn.set_num_threads(n)
        outs.append(ops.attention_backward(dout, q, k, v, out, c["lse"], **kw))
    t = reference.attention_backward(dout, q, k, v, out, c["lse"], **kw)
    for a, b, w in zip(outs[0], outs[1], t):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
        assert np.all(np.isfinite(a)) and rel_err(a, w) <= BF16_TWIN_BLOCKS, rel_err(a, w)


@pytest.mark.parametrize("path", ["fma", "avx512bf16", "avx512bf16-decode", "amx",
                                  "amx-emulated"])
def test_every_attention_bf16_path_backward(path):
    available = fastattn.build_info()["attention_bf16_paths_available"]
    if path not in available:
        pytest.skip(f"the {path} attention path is not available here ({available})")
    run_checks("test_ops_bf16_training", "attention_path_checks",
               {"FASTATTN_ATTENTION_BF16_PATH": path})
