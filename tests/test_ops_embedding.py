"""fastattn.ops.embedding_backward: a deterministic scatter-add (counting sort by id, each thread
owning a range of ids) against the twin, torch's embedding backward, and the exact float32 sum
in position order; bit-identical for every thread count.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from conftest import assert_close, child_isa_tests, requires_torch, to_torch
from fastattn import _fast, ops, reference
from grad_util import float64_twins, numeric_grad
from strategies import features, rand, rows, seeds
from tolerances import TOL



def in_order_sum(dout, ids, V):
    """float32 rows added one position after another, in position order: what the kernel
    computes (np.add.at is unbuffered and goes through the indices in order)."""
    C = dout.shape[-1]
    out = np.zeros((V, C), np.float32)
    np.add.at(out, np.asarray(ids).reshape(-1), np.asarray(dout, np.float32).reshape(-1, C))
    return out


def check_embedding_backward(dout, ids, V):
    dw = ops.embedding_backward(dout, ids, V)
    assert dw.shape == (V, np.shape(dout)[-1]) and dw.dtype == np.float32
    np.testing.assert_array_equal(dw, in_order_sum(dout, ids, V))
    rdw = reference.embedding_backward(dout, ids, V)
    counts = np.bincount(np.asarray(ids).reshape(-1), minlength=V)[:, None]
    mag = np.abs(np.asarray(dout, np.float64)).max(initial=0.0)
    tol = TOL["embedding_grad"]
    assert_close(dw, rdw, rtol=tol["rtol"], atol=tol["atol"] * mag * np.maximum(counts, 1),
                 name="dweight")
    return dw


@given(N=rows(0, 400), C=features(1, 300), V=st.integers(1, 600),
       skew=st.sampled_from(["uniform", "few", "one", "zipf"]), seed=seeds)
def test_matches_reference(N, C, V, skew, seed):
    rng = np.random.default_rng(seed)
    if skew == "uniform":
        ids = rng.integers(0, V, N)
    elif skew == "few":
        ids = rng.integers(0, min(V, 3), N)
    elif skew == "one":
        ids = np.full(N, V - 1)
    else:
        ids = np.minimum(rng.zipf(1.3, N) - 1, V - 1)
    check_embedding_backward(rand(rng, (N, C)), ids, V)


def test_leading_dims_and_id_dtypes(rng):
    ids = rng.integers(0, 50, (4, 9))
    dout = rand(rng, (4, 9, 16))
    want = check_embedding_backward(dout, ids, 50)
    for dtype in (np.int32, np.uint16, np.int8):
        np.testing.assert_array_equal(ops.embedding_backward(dout, ids.astype(dtype), 50), want)
    np.testing.assert_array_equal(ops.embedding_backward(dout.astype(np.float64), ids, 50), want)
    np.testing.assert_array_equal(ops.embedding_backward(dout[..., ::-1][..., ::-1], ids.T.T, 50),
                                  want)


def test_empty_and_unused_rows(rng):
    assert np.array_equal(ops.embedding_backward(np.zeros((0, 5), np.float32),
                                                 np.zeros(0, np.int64), 3), np.zeros((3, 5)))
    assert ops.embedding_backward(np.zeros((0, 5), np.float32), np.zeros(0, np.int64), 0).shape \
        == (0, 5)
    assert ops.embedding_backward(np.zeros((4, 0), np.float32), np.arange(4), 6).shape == (6, 0)
    dw = check_embedding_backward(rand(rng, (3, 8)), np.array([7, 7, 2]), 10)
    assert not dw[[0, 1, 3, 4, 5, 6, 8, 9]].any()


def test_accumulate_into(rng):
    ids, dout = rng.integers(0, 30, 500), rand(rng, (500, 24))
    fresh = ops.embedding_backward(dout, ids, 30)
    dw = np.full((30, 24), 0.5, np.float32)
    assert _fast.embedding_backward_into(dw, dout, ids, True) is dw
    want = np.full((30, 24), 0.5, np.float32)
    np.add.at(want, ids, dout)                          # added row by row onto the old values
    np.testing.assert_array_equal(dw, want)
    _fast.embedding_backward_into(dw, dout, ids, False)
    np.testing.assert_array_equal(dw, fresh)


def test_twin_matches_finite_differences():
    """d/dweight sum(weight[ids] * dout), on the float64 twin."""
    rng = np.random.default_rng(8)
    V, C = 5, 3
    weight, ids, dout = rng.standard_normal((V, C)), np.array([[1, 4, 1], [0, 1, 4]]), \
        rng.standard_normal((2, 3, C))
    with float64_twins():
        got = reference.embedding_backward(dout, ids, V)
        assert_close(got, numeric_grad(lambda: float(np.sum(weight[ids] * dout)), weight),
                     **TOL["finite_difference_embedding"], name="dweight", dtype=None)


@pytest.mark.parametrize("shape,V", [((2, 7), 11), ((8, 128), 1000), ((3000,), 50)])
def test_vs_torch_autograd(rng, shape, V):
    torch = requires_torch()
    C = 24
    ids = rng.integers(0, V, shape)
    dout = rand(rng, shape + (C,))
    wt = to_torch(rand(rng, (V, C))).requires_grad_()
    torch.nn.functional.embedding(to_torch(ids), wt).backward(to_torch(dout))
    counts = np.bincount(ids.reshape(-1), minlength=V)[:, None]
    tol = TOL["embedding_grad_torch"]
    assert_close(ops.embedding_backward(dout, ids, V), wt.grad.numpy(), rtol=tol["rtol"],
                 atol=tol["atol"] * np.maximum(counts, 1), name="dweight vs torch")


# ---- threads, teams and SIMD levels --------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("skew", ["uniform", "one", "zipf"])
def test_bit_identical_for_every_thread_count(restore_threads, rng, n, skew):
    N, V, C = 20000, 3000, 64
    ids = {"uniform": rng.integers(0, V, N), "one": np.full(N, 17),
           "zipf": np.minimum(rng.zipf(1.2, N) - 1, V - 1)}[skew]
    dout = rand(rng, (N, C))
    fastattn.set_num_threads(1)
    one = ops.embedding_backward(dout, ids, V)
    fastattn.set_num_threads(n)
    np.testing.assert_array_equal(ops.embedding_backward(dout, ids, V), one)
    np.testing.assert_array_equal(one, in_order_sum(dout, ids, V))


def isa_checks():
    """Run in a child under each FASTATTN_CPU_ISA (and under small OpenMP teams)."""
    rng = np.random.default_rng(14)
    for N, V, C in ((1, 1, 1), (100, 7, 33), (5000, 800, 96), (3000, 20000, 16)):
        check_embedding_backward(rand(rng, (N, C)), rng.integers(0, V, N), V)


test_every_simd_level, test_correct_when_openmp_starts_fewer_threads = \
    child_isa_tests("test_ops_embedding")


# ---- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize("ids,pattern", [
    (np.array([0, 5, 2]), r"ids.*\[0, 5\).*5"),
    (np.array([0, -1, 2]), r"ids.*\[0, 5\).*-1"),
])
def test_ids_out_of_range(ids, pattern):
    with pytest.raises(ValueError, match=pattern):
        ops.embedding_backward(np.zeros((3, 4), np.float32), ids, 5)


@pytest.mark.parametrize("ids", [np.array([0.0, 1.0]), np.array([True, False]),
                                 np.array(["a", "b"])])
def test_ids_not_integers(ids):
    with pytest.raises(TypeError, match=r"ids.*integer.*dtype"):
        ops.embedding_backward(np.zeros((2, 4), np.float32), ids, 5)


def test_bad_shapes_and_sizes():
    with pytest.raises(ValueError, match=r"dout.*\(2, 3\).*\(2, 4\)"):
        ops.embedding_backward(np.zeros((2, 4), np.float32), np.zeros((2, 3), np.int64), 5)
    with pytest.raises(ValueError, match=r"dout.*\(3,\).*\(3,\)"):
        ops.embedding_backward(np.zeros(3, np.float32), np.zeros(3, np.int64), 5)
    with pytest.raises(ValueError, match=r"num_embeddings.*>= 0"):
        ops.embedding_backward(np.zeros((0, 4), np.float32), np.zeros(0, np.int64), -1)
    for bad in (2.0, True, "5"):
        with pytest.raises(TypeError, match=r"num_embeddings.*int"):
            ops.embedding_backward(np.zeros((1, 4), np.float32), np.zeros(1, np.int64), bad)
    with pytest.raises(TypeError, match=r"dout.*dtype"):
        ops.embedding_backward(np.zeros((1, 4), bool), np.zeros(1, np.int64), 3)
