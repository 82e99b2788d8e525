"""cross_entropy: the kernel (fastattn.ops) against the float64 twin (fastattn.reference) and
both against torch.nn.functional.cross_entropy (values and autograd gradients): label
smoothing, ignored rows, all-ignored batches, the three reductions, large logits, vector tails,
the in-place gradient of _cross_entropy_into, every SIMD path, thread counts and bad input.

torch puts the classes on axis 1 of an N-D input; fastattn on the LAST axis (rows of logits),
so N-D cases are compared with torch on the flattened (N, V) rows.
"""
import numpy as np
import pytest
from conftest import assert_close, child_isa_tests, requires_torch
from hypothesis import given
from hypothesis import strategies as st
from strategies import features, rand, rows, seeds
from tolerances import EPS32, TOL, loss_atol

import fastattn
from fastattn import _fast, ops, reference

REDUCTIONS = ("mean", "sum", "none")
TILES_BY_ISA = fastattn.build_info()["tiles_by_isa"]
# vocabulary sizes around the vector and chunk edges of every SIMD level (read-pass tails)
TAIL_V = sorted({n + d for t in TILES_BY_ISA.values()
                 for n in (t["vector_width"], t["softmax_chunk"]) for d in (-1, 0, 1)})


def problem(rng, N, V, *, scale=3.0, ignored=0.25, ignore_index=-100):
    """logits (N, V) float32 and targets (N,) int64 with about `ignored` of them ignore_index."""
    x = rand(rng, (N, V), scale)
    t = rng.integers(0, V, N) if V else np.full(N, ignore_index)
    t[rng.random(N) < ignored] = ignore_index
    return x, t


def torch_ce(x, t, *, dtype, **kw):
    """(loss, dlogits) from torch: loss (or the sum of "none"'s losses) backpropagated."""
    torch = requires_torch()
    xt = torch.tensor(np.asarray(x), dtype=dtype, requires_grad=True)
    loss = torch.nn.functional.cross_entropy(xt, torch.tensor(np.asarray(t), dtype=torch.int64),
                                             **kw)
    loss.sum().backward()
    return loss.detach().numpy(), xt.grad.numpy()


def check_loss(actual, expected, x, reduction, count, name):
    """Per-row losses within loss_atol; a sum of N of them within N times that."""
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    atol = loss_atol(x) * (count if reduction == "sum" else 1)
    assert_close(a, e, TOL["cross_entropy"]["rtol"], atol, name, dtype=None)


def check_grad(actual, expected, scale, name):
    """softmax - targets, times scale (1 / count for a mean): float32 and the exp polynomial."""
    t = TOL["cross_entropy_grad"]
    assert_close(actual, expected, t["rtol"], t["atol"] * EPS32 * scale, name)


def scale_of(t, reduction, ignore_index=-100):
    count = int(np.count_nonzero(np.asarray(t) != ignore_index))
    return (1.0 / count if reduction == "mean" and count else 1.0), count


# ---- against torch ---------------------------------------------------------------------------

SHAPES = [(1, 1), (1, 17), (7, 1), (5, 3), (33, 1025), (64, 8000)]


@pytest.mark.parametrize("N, V", SHAPES)
@pytest.mark.parametrize("eps", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_matches_torch(rng, N, V, eps, reduction):
    torch = requires_torch()
    x, t = problem(rng, N, V)
    if N > 1:
        t[0] = rng.integers(0, V)                  # at least one counted row (torch: NaN else)
    kw = dict(label_smoothing=eps, reduction=reduction)
    loss, d = ops.cross_entropy(x, t, return_grad=True, **kw)
    ref_loss, ref_d = reference.cross_entropy(x, t, return_grad=True, **kw)
    scale, count = scale_of(t, reduction)
    if count == 0 and reduction == "mean":
        pytest.skip("torch gives NaN for a mean over no rows (tested separately)")
    t64_loss, t64_d = torch_ce(x.astype(np.float64), t, dtype=torch.float64, **kw)
    t32_loss, t32_d = torch_ce(x, t, dtype=torch.float32, **kw)
    # the twin is float64 like torch.float64: they agree to rounding
    twin = TOL["cross_entropy_twin_torch64"]
    assert_close(np.asarray(ref_loss, np.float64), t64_loss, twin["loss"]["rtol"],
                 twin["loss"]["atol"] * loss_atol(x), "reference loss vs torch float64",
                 dtype=None)
    assert_close(ref_d, t64_d, twin["grad"]["rtol"], twin["grad"]["atol"] * scale,
                 "reference dlogits vs torch float64")
    # the kernel against both torch dtypes
    check_loss(loss, t64_loss, x, reduction, count, "loss vs torch float64")
    check_loss(loss, t32_loss, x, reduction, count, "loss vs torch float32")
    check_grad(d, t64_d, scale, "dlogits vs torch float64")
    check_grad(d, t32_d, scale, "dlogits vs torch float32")
    assert d.dtype == np.float32 and d.shape == x.shape
    if reduction == "none":
        assert isinstance(loss, np.ndarray) and loss.dtype == np.float32 and loss.shape == (N,)
    else:
        assert isinstance(loss, float)


@pytest.mark.parametrize("magnitude", [1e2, 1e4])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_large_logits(rng, magnitude, eps):
    """|logits| ~ 1e4: the row max is subtracted before exp, the mean of x is accumulated
    relative to the row's first logit, and the loss is combined in double."""
    torch = requires_torch()
    x, t = problem(rng, 40, 1001, scale=magnitude, ignored=0.0)
    x[3] += 5e4                                                  # one row all large and positive
    loss, d = ops.cross_entropy(x, t, label_smoothing=eps, reduction="none", return_grad=True)
    tl, td = torch_ce(x.astype(np.float64), t, dtype=torch.float64, label_smoothing=eps,
                      reduction="none")
    large = TOL["cross_entropy_large"]
    assert_close(loss, tl, large["rtol"], large["atol"] * EPS32 * float(np.abs(x).max()),
                 "loss, large logits")
    check_grad(d, td, 1.0, "dlogits, large logits")
    assert np.isfinite(loss).all() and np.isfinite(d).all()


def test_batched_leading_dims(rng):
    """logits (B, T, V) with targets (B, T): the same as the flattened rows."""
    x, t = problem(rng, 24, 37)
    x3, t3 = x.reshape(2, 12, 37), t.reshape(2, 12)
    for reduction in REDUCTIONS:
        loss3, d3 = ops.cross_entropy(x3, t3, reduction=reduction, label_smoothing=0.2,
                                      return_grad=True)
        loss, d = ops.cross_entropy(x, t, reduction=reduction, label_smoothing=0.2,
                                    return_grad=True)
        assert d3.shape == x3.shape
        np.testing.assert_array_equal(d3.reshape(24, 37), d)
        np.testing.assert_array_equal(np.reshape(loss3, -1), np.reshape(loss, -1))
        if reduction == "none":
            assert loss3.shape == (2, 12)
    # one unbatched row: logits (V,), target a scalar
    loss1, d1 = ops.cross_entropy(x[0], t[0] if t[0] >= 0 else 3, return_grad=True)
    ref1, rd1 = reference.cross_entropy(x[0], t[0] if t[0] >= 0 else 3, return_grad=True)
    assert d1.shape == (37,)
    assert abs(loss1 - ref1) <= loss_atol(x[0])
    check_grad(d1, rd1, 1.0, "unbatched row")


# ---- ignored rows ----------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_all_ignored_batch_gives_zero_not_nan(rng, reduction):
    x, _ = problem(rng, 6, 11)
    t = np.full(6, -100)
    for F in (ops, reference):
        loss, d = F.cross_entropy(x, t, reduction=reduction, label_smoothing=0.1,
                                  return_grad=True)
        np.testing.assert_array_equal(loss, 0.0 if reduction != "none" else np.zeros(6))
        np.testing.assert_array_equal(d, np.zeros_like(x))


def test_ignored_rows_excluded_from_mean_and_gradient(rng):
    x, t = problem(rng, 10, 13, ignored=0.0)
    t[[1, 4, 5]] = 7                                   # ignore_index = 7, also a valid class
    loss, d = ops.cross_entropy(x, t, ignore_index=7, return_grad=True)
    keep = t != 7
    sub, dsub = ops.cross_entropy(x[keep], t[keep], return_grad=True)
    assert abs(loss - sub) <= loss_atol(x)
    np.testing.assert_array_equal(d[~keep], 0.0)
    check_grad(d[keep], dsub, 1.0 / keep.sum(), "counted rows")


def test_empty_batch():
    for reduction in REDUCTIONS:
        loss, d = ops.cross_entropy(np.zeros((0, 5), np.float32), np.zeros(0, np.int64),
                                    reduction=reduction, return_grad=True)
        assert d.shape == (0, 5)
        if reduction == "none":
            assert loss.shape == (0,)
        else:
            assert loss == 0.0


def test_no_classes_all_ignored():
    loss, d = ops.cross_entropy(np.zeros((3, 0), np.float32), np.full(3, -100), return_grad=True)
    assert loss == 0.0 and d.shape == (3, 0)


# ---- special values --------------------------------------------------------------------------

def test_minus_inf_logit_elsewhere(rng):
    """A -inf logit that is not the target: finite loss without smoothing (torch likewise),
    +inf with smoothing (its -log p is infinite)."""
    torch = requires_torch()
    x, t = problem(rng, 4, 9, ignored=0.0)
    t[:] = 0
    x[:, 5] = -np.inf
    loss = ops.cross_entropy(x, t, reduction="none")
    assert np.isfinite(loss).all()
    tl, _ = torch_ce(x.astype(np.float64), t, dtype=torch.float64, reduction="none")
    check_loss(loss, tl, np.nan_to_num(x, neginf=0.0), "none", 4, "-inf logit")
    smooth = ops.cross_entropy(x, t, reduction="none", label_smoothing=0.1)
    assert np.isposinf(smooth).all()


def test_nan_propagates_to_its_row(rng):
    x, t = problem(rng, 5, 40, ignored=0.0)
    x[2, 17] = np.nan
    loss, d = ops.cross_entropy(x, t, reduction="none", return_grad=True)
    assert np.isnan(loss[2]) and np.isfinite(np.delete(loss, 2)).all()
    assert np.isnan(d[2]).all() and np.isfinite(np.delete(d, 2, axis=0)).all()


# ---- vector tails and hypothesis -------------------------------------------------------------

@pytest.mark.parametrize("V", TAIL_V)
def test_vector_tails(rng, V):
    x, t = problem(rng, 9, V)
    t[0] = V - 1                                              # the target in the scalar tail
    for eps in (0.0, 0.3):
        loss, d = ops.cross_entropy(x, t, label_smoothing=eps, reduction="none",
                                    return_grad=True)
        rl, rd = reference.cross_entropy(x, t, label_smoothing=eps, reduction="none",
                                         return_grad=True)
        check_loss(loss, rl, x, "none", 9, f"loss V={V}")
        check_grad(d, rd, 1.0, f"dlogits V={V}")


@given(N=rows(1, 80), V=features(1, 1100), seed=seeds,
       eps=st.sampled_from([0.0, 0.05, 0.5, 1.0]), reduction=st.sampled_from(REDUCTIONS),
       ignored=st.sampled_from([0.0, 0.3, 1.0]), magnitude=st.sampled_from([1.0, 30.0, 1e4]),
       ignore_index=st.sampled_from([-100, 0, -1]))
def test_hypothesis_matches_reference(N, V, seed, eps, reduction, ignored, magnitude,
                                      ignore_index):
    rng = np.random.default_rng(seed)
    x, t = problem(rng, N, V, scale=magnitude, ignored=ignored, ignore_index=ignore_index)
    kw = dict(label_smoothing=eps, reduction=reduction, ignore_index=ignore_index)
    loss, d = ops.cross_entropy(x, t, return_grad=True, **kw)
    rl, rd = reference.cross_entropy(x, t, return_grad=True, **kw)
    scale, count = scale_of(t, reduction, ignore_index)
    check_loss(loss, rl, x, reduction, count, "loss")
    check_grad(d, rd, scale, "dlogits")
    again = ops.cross_entropy(x, t, **kw)                     # without the gradient pass
    np.testing.assert_array_equal(np.asarray(again), np.asarray(loss))


# ---- the private in-place entry point ----------------------------------------------------------

@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_into_writes_the_gradient_over_the_logits(rng, reduction):
    x, t = problem(rng, 50, 515)
    loss, d = ops.cross_entropy(x, t, label_smoothing=0.1, reduction=reduction,
                                return_grad=True)
    buf = x.copy()
    losses = np.full(50, np.nan, np.float32)
    got = _fast.cross_entropy_into(buf, losses, buf, t.astype(np.int64), label_smoothing=0.1,
                                  reduction=reduction)
    np.testing.assert_array_equal(buf, d)                    # the same bits, in place
    np.testing.assert_array_equal(np.asarray(got), np.asarray(loss))
    no_grad = _fast.cross_entropy_into(None, losses, x, t.astype(np.int64),
                                      label_smoothing=0.1, reduction=reduction)
    np.testing.assert_array_equal(np.asarray(no_grad), np.asarray(loss))


def test_into_still_checks_targets(rng):
    x, t = problem(rng, 4, 6, ignored=0.0)
    t[2] = 6
    with pytest.raises(ValueError, match="target 6 is out of range"):
        _fast.cross_entropy_into(None, np.empty(4, np.float32), x, t.astype(np.int64))


# ---- determinism -----------------------------------------------------------------------------

def test_one_and_two_threads_bit_identical(restore_threads, rng):
    x, t = problem(rng, 300, 2049)
    out = {}
    for n in (1, 2, 3):
        fastattn.set_num_threads(n)
        out[n] = [ops.cross_entropy(x, t, label_smoothing=0.1, reduction=r,
                                    return_grad=True) for r in REDUCTIONS]
    for n in (2, 3):
        for (l1, d1), (ln, dn) in zip(out[1], out[n]):
            np.testing.assert_array_equal(np.asarray(l1), np.asarray(ln))
            np.testing.assert_array_equal(d1, dn)


# ---- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("F", [ops, reference], ids=["ops", "reference"])
@pytest.mark.parametrize("bad", [5, -1, 10**6])
def test_out_of_range_target_names_the_value(F, bad):
    x = np.zeros((3, 5), np.float32)
    with pytest.raises(ValueError, match=f"target {bad} is out of range for V = 5"):
        F.cross_entropy(x, np.array([0, bad, 1]))


def test_bad_arguments():
    x = np.zeros((3, 5), np.float32)
    t = np.array([0, 1, 2])
    with pytest.raises(TypeError, match="targets must be an integer array"):
        ops.cross_entropy(x, t.astype(np.float32))
    with pytest.raises(TypeError, match="targets must be an integer array"):
        ops.cross_entropy(x, t > 0)
    with pytest.raises(ValueError, match=r"targets must have the shape .*\(3,\)"):
        ops.cross_entropy(x, t[:2])
    with pytest.raises(ValueError, match="at least 1 dimension"):
        ops.cross_entropy(np.float32(1.0), 0)
    with pytest.raises(TypeError, match="real numeric"):
        ops.cross_entropy(x.astype(bool), t)
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        ops.cross_entropy(x, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match="label_smoothing must be finite"):
        ops.cross_entropy(x, t, label_smoothing=float("nan"))
    with pytest.raises(ValueError, match="reduction must be"):
        ops.cross_entropy(x, t, reduction="avg")
    with pytest.raises(TypeError, match="ignore_index must be an int"):
        ops.cross_entropy(x, t, ignore_index=True)
    with pytest.raises(ValueError, match="fit in int64"):
        ops.cross_entropy(x, t, ignore_index=2**70)


def test_converts_dtype_and_layout(rng):
    x, t = problem(rng, 8, 30, ignored=0.0)
    loss, d = ops.cross_entropy(x, t, return_grad=True)
    l64, d64 = ops.cross_entropy(x.astype(np.float64), t.astype(np.int32), return_grad=True)
    np.testing.assert_array_equal(d64, d)
    assert l64 == loss
    xt = np.asfortranarray(x)
    lf, df = ops.cross_entropy(xt, t.astype(np.uint8), return_grad=True)
    np.testing.assert_array_equal(df, d)


# ---- every SIMD path, and a team smaller than asked for ---------------------------------------

def isa_checks():
    """Run in a child under each FASTATTN_CPU_ISA (and small OpenMP teams): losses and dlogits of
    every reduction, with and without label smoothing, at vocabulary sizes around the vector
    tails and at large logits, on a team of 2."""
    fastattn.set_num_threads(2)
    rng = np.random.default_rng(11)
    for N, V, mag in ((37, 1, 1.0), (37, 15, 3.0), (37, 17, 3.0), (9, 1025, 30.0),
                      (300, 2053, 3.0), (5, 4000, 1e4)):
        x = (rng.standard_normal((N, V)) * mag).astype(np.float32)
        t = rng.integers(0, V, N)
        t[::4] = -100
        for eps in (0.0, 0.1):
            for red in REDUCTIONS:
                loss, d = ops.cross_entropy(x, t, label_smoothing=eps, reduction=red,
                                            return_grad=True)
                rl, rd = reference.cross_entropy(x, t, label_smoothing=eps, reduction=red,
                                                 return_grad=True)
                scale, count = scale_of(t, red)
                case = f"V={V} label_smoothing={eps} {red}"
                check_loss(loss, rl, x, red, count, f"loss, {case}")
                check_grad(d, rd, scale, f"dlogits, {case}")


test_every_isa_path, test_fewer_threads_than_asked = \
    child_isa_tests("test_ops_loss", num_threads=None)


# ---- the benchmark target ------------------------------------------------------------------------

def test_cross_entropy_bench_target():
    from fastattn import bench
    from fastattn.bench import runner
    case = bench.CASES["cross_entropy"]
    assert "cross_entropy" in bench.OP_CASES
    assert case.nbytes == 2 * 4096 * 8000 * 4
    row = runner.empty_row(case, 2)
    row["fastattn_times_ms"], row["torch_times_ms"] = [10.0], [25.0]
    runner.finish_row(case, row)
    (target,) = [t for t in bench.check_targets([row]) if t["case"] == "cross_entropy"]
    assert target["status"] == "PASS" and target["target"] == "speedup vs torch >= 2x"
