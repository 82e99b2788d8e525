"""One thread vs several: the kernels split work so that each output is computed by one thread in
one fixed order, so attention, softmax, layer norm, linear and FFN (the GEMM engine: one sum in
k order per element, whichever thread takes its task) must be bitwise identical.

Sizes are chosen above each kernel's parallel grain (and, for linear/ffn, few rows per thread
and many: one engine task per thread and several), so the multi-threaded paths really run.
"""
import textwrap
import threading

import numpy as np
import pytest

import fastattn
from conftest import TILES, assert_close, fewer_threads, run_checks, run_child, run_in_threads
from fastattn import _fast, kinds, ops, reference
from strategies import rand
from tolerances import TOL, dot_atol, ffn_atol

THREAD_COUNTS = [2, 3]   # 3 also exercises an uneven split (more threads than cores is fine)
# linear/ffn rows: few per thread (the FFN's products by the whole team), many (row blocks)
MIN_ROWS, ROW_BLOCK = 128, TILES["row_block"]
GEMM_ROWS = [MIN_ROWS // 2, max(THREAD_COUNTS) * MIN_ROWS + 1, 2 * ROW_BLOCK + 276]


def run_with(n, fn):
    assert fastattn.set_num_threads(n) == n
    assert fastattn.get_num_threads() == n
    assert fastattn.build_info()["threads"] == n
    return fn()


def assert_identical(fn, n):
    one = run_with(1, fn)
    many = run_with(n, fn)
    for a, b in zip(one if isinstance(one, tuple) else (one,),
                    many if isinstance(many, tuple) else (many,)):
        np.testing.assert_array_equal(a, b, err_msg=f"1 thread vs {n} threads")


def test_set_get_num_threads(restore_threads):
    for n in (1, 2, 3, 7):
        assert fastattn.set_num_threads(n) == n
        assert fastattn.get_num_threads() == n
    ncpu = fastattn.set_num_threads(None)
    assert ncpu >= 1 and fastattn.get_num_threads() == ncpu
    assert fastattn.set_num_threads(-1) == ncpu
    if ncpu > 1:
        assert fastattn.set_num_threads(-2) == ncpu - 1


@pytest.mark.parametrize("n", THREAD_COUNTS)
@pytest.mark.parametrize("case", ["plain", "causal", "masked", "padded_causal", "weights"])
def test_attention_identical(restore_threads, rng, n, case):
    B, H, Lq, Lk, D, Dv = 2, 3, 161, 203, 64, 40
    q, k, v = rand(rng, (B, H, Lq, D)), rand(rng, (B, H, Lk, D)), rand(rng, (B, H, Lk, Dv))
    kwargs = {}
    if case == "causal":
        kwargs["causal"] = True
    elif case == "masked":
        kwargs["mask"] = rng.random((B, 1, Lq, Lk)) < 0.3
    elif case == "padded_causal":
        kpm = rng.random((B, Lk)) < 0.2
        kpm[1] = True                                      # one batch element fully padded
        kwargs.update(key_padding_mask=kpm, causal=True,
                      mask=np.where(rng.random((Lq, Lk)) < 0.1, -np.inf, 0.5))

    def fn():
        if case == "weights":
            return ops.attention(q, k, v, causal=True, return_weights=True)
        out, cache = ops.attention_forward(q, k, v, **kwargs)
        return out, cache["lse"]
    assert_identical(fn, n)


@pytest.mark.parametrize("n", THREAD_COUNTS)
@pytest.mark.parametrize("case", ["plain", "causal", "masked", "padded_causal", "dropout",
                                  "one_head", "two_heads"])
def test_attention_backward_identical(restore_threads, rng, n, case):
    """dq, dk, dv bitwise the same for any team: with several (batch, head) pairs per thread
    each pair is one task; with fewer pairs than threads (one_head, two_heads with 3 threads) the
    work is split into key-block and query-block tasks, which must give the same bits as the
    single thread's one task per head."""
    B, H, Lq, Lk, D, Dv = 2, 3, 161, 203, 64, 40
    if case == "one_head":
        B, H = 1, 1
    elif case == "two_heads":
        B, H = 1, 2
    q, k, v = rand(rng, (B, H, Lq, D)), rand(rng, (B, H, Lk, D)), rand(rng, (B, H, Lk, Dv))
    dout = rand(rng, (B, H, Lq, Dv))
    kwargs = {"causal": case in ("causal", "padded_causal", "one_head", "two_heads")}
    if case == "masked":
        kwargs["mask"] = rng.random((B, 1, Lq, Lk)) < 0.3
    elif case == "padded_causal":
        kpm = rng.random((B, Lk)) < 0.2
        kpm[1] = True                                      # one batch element fully padded
        kwargs.update(key_padding_mask=kpm,
                      mask=np.where(rng.random((Lq, Lk)) < 0.1, -np.inf, 0.5))
    elif case in ("dropout", "one_head"):
        kwargs.update(dropout_p=0.2, seed=1234)
    out, cache = ops.attention_forward(q, k, v, **kwargs)
    assert_identical(lambda: ops.attention_backward(dout, q, k, v, out, cache["lse"], **kwargs),
                     n)
    if case == "dropout":
        assert_identical(lambda: ops.attention(q, k, v, return_weights=True, **kwargs), n)


@pytest.mark.parametrize("n", THREAD_COUNTS)
@pytest.mark.parametrize("C", [17, 512, 1025])
def test_softmax_identical(restore_threads, rng, n, C):
    x = rand(rng, (701, C), 3.0)
    x[::7, ::2] = -np.inf
    x[5] = -np.inf
    assert_identical(lambda: ops.softmax(x), n)
    assert_identical(lambda: ops.softmax(x[:64].T, axis=0), n)


@pytest.mark.parametrize("n", THREAD_COUNTS)
@pytest.mark.parametrize("C", [17, 512, 1025])
def test_layer_norm_identical(restore_threads, rng, n, C):
    x, r = rand(rng, (701, C)) + np.float32(1e3), rand(rng, (701, C))
    w, b = rand(rng, (C,)), rand(rng, (C,))

    def fn():
        y, cache = ops.layer_norm_forward(x, w, b, residual=r)
        return y, cache["mean"], cache["rstd"]
    assert_identical(fn, n)


@pytest.mark.parametrize("n", THREAD_COUNTS)
@pytest.mark.parametrize("N", GEMM_ROWS)
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_linear_identical(restore_threads, rng, n, N, activation):
    x, w, b = rand(rng, (N, 96)), rand(rng, (257, 96), 0.1), rand(rng, (257,))
    assert_identical(lambda: ops.linear(x, w, b, activation=activation), n)


@pytest.mark.parametrize("n", THREAD_COUNTS)
@pytest.mark.parametrize("N", GEMM_ROWS)
def test_ffn_identical(restore_threads, rng, n, N):
    x = rand(rng, (N, 64))
    w1, b1, w2, b2 = rand(rng, (256, 64), 0.125), rand(rng, (256,)), \
        rand(rng, (64, 256), 0.0625), rand(rng, (64,))
    for act in ("relu", "gelu"):
        assert_identical(lambda: ops.ffn(x, w1, b1, w2, b2, activation=act), n)


# Larger teams over few rows per thread: the engine's tasks (blocks of rows x groups of panels)
# shared by 4 and 8 threads; dropout's keep bits follow the (row, feature) of each tile.
GRID_CASES = [(4, 2 * MIN_ROWS + 5), (8, 3 * MIN_ROWS + 7), (8, 7 * MIN_ROWS + 1)]


@pytest.mark.parametrize("n, N", GRID_CASES)
def test_linear_and_ffn_row_and_feature_grid(restore_threads, rng, n, N):
    x, w, b = rand(rng, (N, 96)), rand(rng, (257, 96), 0.1), rand(rng, (257,))
    assert_identical(lambda: ops.linear(x, w, b, activation="gelu"), n)
    w1, b1, w2, b2 = rand(rng, (258, 96), 0.1), rand(rng, (258,)), \
        rand(rng, (96, 258), 0.06), rand(rng, (96,))
    assert_identical(lambda: ops.ffn(x, w1, b1, w2, b2), n)
    one, one_pre = run_with(1, lambda: ops.ffn_forward(x, w1, b1, w2, b2, activation="gelu",
                                                       dropout_p=0.25, seed=7))
    many, many_pre = run_with(n, lambda: ops.ffn_forward(x, w1, b1, w2, b2, activation="gelu",
                                                         dropout_p=0.25, seed=7))
    ref, ref_pre = reference.ffn_forward(x, w1, b1, w2, b2, activation="gelu", dropout_p=0.25,
                                         seed=7)
    np.testing.assert_array_equal(many_pre["pre"], one_pre["pre"])
    np.testing.assert_array_equal(many, one)
    # the kept units scaled by 1 / (1 - p): the twin's tolerance grows with them
    assert_close(many, ref, rtol=TOL["ffn"]["rtol"],
                 atol=ffn_atol(x, w1, b1, w2 / (1 - 0.25), b2, "gelu"),
                 name="ffn dropout vs the twin")


# ---- fewer threads than asked for ----------------------------------------------------------------
# OpenMP may start a smaller team than num_threads(n) requests: OMP_THREAD_LIMIT caps it,
# OMP_DYNAMIC lets the runtime choose. Every kernel must split its work over the team actually
# started; outputs are pre-filled with NaN so a row or column left unwritten cannot pass.

def small_team_checks():
    """Run in a child under a capped or dynamic OpenMP: each kernel, at sizes on both sides of
    its parallel splits, against the twin."""
    assert fastattn.set_num_threads(2) == 2
    rng = np.random.default_rng(3)
    tiles = fastattn.build_info()["tiles"]
    SKINNY = 8                                   # a few rows: under a register tile's

    def normal(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def nan(*shape):
        return np.full(shape, np.nan, np.float32)

    def check(name, actual, expected, tol):
        assert_close(actual, expected, tol, tol, name, dtype=None)

    x = normal(1000, 512, scale=3.0)
    check("softmax", ops.softmax(x), reference.softmax(x), 1e-5)

    x, r, w, b = normal(1000, 512), normal(1000, 512), normal(512), normal(512)
    y = nan(1000, 512)
    _fast.layer_norm_into(y, x, w, b, 1e-5, r)
    check("layer_norm", y, reference.layer_norm(x, w, b, residual=r), 1e-4)
    check("layer_norm (public)", ops.layer_norm(x, w, b), reference.layer_norm(x, w, b), 1e-4)

    # the engine with a few rows, few and many rows per thread (for a team of 2)
    for n in (SKINNY, 2 * MIN_ROWS - 1, 2 * MIN_ROWS + 88):
        x, w, b = normal(n, 512), normal(2048, 512, scale=0.05), normal(2048)
        y = nan(n, 2048)
        _fast.linear_into(y, x, w, b, ops.ACTIVATIONS["gelu"])
        check(f"linear {n} rows", y, reference.linear(x, w, b, activation="gelu"), 1e-4)
        check(f"linear {n} rows (public)", ops.linear(x, w), reference.linear(x, w), 1e-4)

    for n in (SKINNY, 2 * MIN_ROWS - 1, 2 * MIN_ROWS + 88):
        x = normal(n, 256)
        w1, b1 = normal(1024, 256, scale=0.06), normal(1024)
        w2, b2 = normal(256, 1024, scale=0.03), normal(256)
        y = nan(n, 256)
        _fast.ffn_into(y, x, w1, b1, w2, b2, ops.ACTIVATIONS["relu"])
        check(f"ffn {n} rows", y, reference.ffn(x, w1, b1, w2, b2), 1e-4)

    x, w, b = normal(3, 512), normal(2048, 512, scale=0.05), normal(2048)
    y = nan(3, 2048)
    _fast.linear_packed_into(y, x, kinds.pack_panels(w), b, ops.ACTIVATIONS["relu"])
    check("linear_packed", y, reference.linear(x, w, b, activation="relu"), 1e-4)

    for Lq in (1, tiles["attention_rows_max_q"] + 1):   # one row at a time; query blocks
        q, k, v = normal(2, 3, Lq, 32), normal(2, 3, 100, 32), normal(2, 3, 100, 24)
        out = nan(2, 3, Lq, 24)
        _fast.attention_into(out, q, k, v, None, None, True, 32 ** -0.5)
        check(f"attention Lq={Lq}", out, reference.attention(q, k, v, causal=True), 1e-4)

    # the backward: one task per (batch, head), and the split for fewer heads than threads;
    # outputs NaN-prefilled through the binding
    for B, H in ((2, 3), (1, 1)):
        q, k, v, dout = normal(B, H, 150, 32), normal(B, H, 170, 32), normal(B, H, 170, 24), \
            normal(B, H, 150, 24)
        out, cache = ops.attention_forward(q, k, v, causal=True, dropout_p=0.1, seed=9)
        grads = [nan(*q.shape), nan(*k.shape), nan(*v.shape)]
        fastattn._kernels.attention_backward(*grads, dout, out, cache["lse"].reshape(-1), q, k,
                                             v, None, None, 32 ** -0.5, True, 0.1, 9, 2)
        want = reference.attention_backward(dout, q, k, v, out, cache["lse"], causal=True,
                                            dropout_p=0.1, seed=9)
        for name, g, w in zip(("dq", "dk", "dv"), grads, want):
            check(f"attention_backward B={B} H={H} {name}", g, w, 1e-4)


@fewer_threads()
def test_kernels_correct_when_openmp_starts_fewer_threads(env):
    run_checks("test_threads", "small_team_checks", env)


@pytest.mark.parametrize("value", ["2147483647", "100000"])
def test_huge_omp_num_threads_is_clamped_at_import(value):
    """OMP_NUM_THREADS beyond set_num_threads' bound: clamped with a warning at import, and the
    kernels then run (a team of that size used to end the process inside libgomp)."""
    code = textwrap.dedent("""
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import fastattn
        import numpy as np
        from conftest import assert_close
        from fastattn import ops, reference
        bound = fastattn.build_info()["max_threads"]
        assert fastattn.get_num_threads() == bound, fastattn.get_num_threads()
        assert any("OMP_NUM_THREADS" in str(w.message) and issubclass(w.category, RuntimeWarning)
                   for w in caught), [str(w.message) for w in caught]
        x = np.random.default_rng(0).standard_normal((2000, 64)).astype(np.float32)
        assert_close(ops.softmax(x), reference.softmax(x), 1e-5, 1e-7, dtype=None)
        print("ok")
    """)
    proc = run_child(code, env={"OMP_NUM_THREADS": value})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


def test_concurrent_python_threads_linear_ffn(restore_threads, rng):
    """Eight Python threads run linear and ffn at once (each kernel call releases the GIL and
    starts its own OpenMP team): each gets the twin's result."""
    fastattn.set_num_threads(2)
    cases = []
    for i in range(8):
        n = (3, 20, 300, 600)[i % 4]                      # a few rows to several tasks each
        x, w, b = rand(rng, (n, 96)), rand(rng, (257, 96), 0.1), rand(rng, (257,))
        w1, b1 = rand(rng, (192, 96), 0.1), rand(rng, (192,))
        w2, b2 = rand(rng, (96, 192), 0.07), rand(rng, (96,))
        cases.append((x, w, b, w1, b1, w2, b2))
    expect = [(reference.linear(x, w, b, activation="gelu"), reference.ffn(x, w1, b1, w2, b2))
              for x, w, b, w1, b1, w2, b2 in cases]
    atols = [(dot_atol(x, w, bias=b), ffn_atol(x, w1, b1, w2, b2, "relu", slope=1.0))
             for x, w, b, w1, b1, w2, b2 in cases]
    start = threading.Barrier(len(cases))

    def work(i):
        x, w, b, w1, b1, w2, b2 = cases[i]
        start.wait()
        for _ in range(20):
            assert_close(ops.linear(x, w, b, activation="gelu"), expect[i][0],
                         TOL["linear"]["rtol"], atols[i][0], name=f"linear, thread {i}")
            assert_close(ops.ffn(x, w1, b1, w2, b2), expect[i][1], TOL["ffn"]["rtol"],
                         atols[i][1], name=f"ffn, thread {i}")
    run_in_threads(work, len(cases))
