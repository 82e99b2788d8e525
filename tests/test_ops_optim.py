"""The optimiser ops: adamw_step / adam_step against torch.optim.AdamW / Adam over 20 steps,
grad_norm and clip_grads against torch.nn.utils, the kernels against the float64 twin, every
SIMD path, thread counts (bit-identical) and bad input."""
import numpy as np
import pytest
from conftest import assert_close, child_isa_tests, requires_torch
from strategies import rand as _rand
from tolerances import TOL, scaled

import fastattn
from fastattn import ops, reference


def rand(rng, shape, scale=1.0):
    """float32 normal data as an array, 0-d included (a 0-d result is kept an ndarray)."""
    return np.array(_rand(rng, shape, scale), np.float32)

# odd sizes: vector tails of every level, a 0-d and a one-element tensor, more than one
# sum-of-squares block (8192 floats), and above the threads' grain
SHAPES = [(3, 5), (17,), (129, 33), (1,), (), (1000,), (7, 11, 13), (40000,)]
STEPS = 20
NORM_TWIN = TOL["grad_norm_twin"]["rtol"]
CLIP = TOL["clip_grads"]


def make_state(rng, shapes, scale=1.0):
    params = [rand(rng, s, scale) for s in shapes]
    return params, [np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params]


def torch_run(cls, params, grads_per_step, **kw):
    """torch's optimiser `cls` over copies of params, one step per list of grads."""
    torch = requires_torch()
    tp = [torch.tensor(p.copy(), requires_grad=True) for p in params]
    opt = cls(tp, **kw)
    for grads in grads_per_step:
        for t, g in zip(tp, grads):
            t.grad = torch.tensor(g)
        opt.step()
    return [t.detach().numpy() for t in tp], opt


CONFIGS = [
    ("adamw", dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)),
    ("adamw", dict(lr=3e-3, betas=(0.3, 0.95), eps=1e-6, weight_decay=0.1)),   # lerp, w >= 0.5
    ("adamw", dict(lr=1e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0)),
    ("adam", dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)),
    ("adam", dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.05)),   # L2 decay
]


@pytest.mark.parametrize("kind, hyper", CONFIGS, ids=[f"{k}-{i}" for i, (k, _) in
                                                      enumerate(CONFIGS)])
@pytest.mark.parametrize("torch_path", ["default", "fused"])
def test_matches_torch_over_20_steps(rng, kind, hyper, torch_path):
    torch = requires_torch()
    cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
    step_fn = ops.adamw_step if kind == "adamw" else ops.adam_step
    ref_fn = reference.adamw_step if kind == "adamw" else reference.adam_step
    params, m, v = make_state(rng, SHAPES)
    ref_p, ref_m, ref_v = ([a.copy() for a in params], [a.copy() for a in m],
                           [a.copy() for a in v])
    grads = [[rand(rng, s, 10.0 ** rng.integers(-4, 2)) for s in SHAPES] for _ in range(STEPS)]
    kw = dict(fused=True) if torch_path == "fused" else {}
    try:
        theirs, opt = torch_run(cls, params, grads, **hyper, **kw)
    except RuntimeError as exc:                               # fused not built for CPU
        pytest.skip(f"torch {torch_path} path unavailable: {exc}")
    ours = [p.copy() for p in params]
    for step, g in enumerate(grads, start=1):
        step_fn(ours, g, m, v, step=step, **hyper)
        ref_fn(ref_p, g, ref_m, ref_v, step=step, **hyper)
    # each tensor (and the moments too) within optim_torch, atol relative to max(1, max|p|)
    tstate = [opt.state[p] for p in opt.param_groups[0]["params"]]
    for name, xs, ys in ((f"ops.{kind}_step vs torch {torch_path}", ours, theirs),
                         (f"reference.{kind}_step vs torch {torch_path}", ref_p, theirs),
                         ("exp_avg", m, [s["exp_avg"].numpy() for s in tstate]),
                         ("exp_avg_sq", v, [s["exp_avg_sq"].numpy() for s in tstate])):
        for i, (a, b) in enumerate(zip(xs, ys)):
            assert_close(a, b, **scaled(TOL["optim_torch"], b, 1.0),
                         name=f"{name}: tensor {i} {b.shape}", dtype=None)


@pytest.mark.parametrize("fn", ["adamw_step", "adam_step"])
def test_one_step_matches_twin_closely(rng, fn):
    """Per step, the float32 kernel is the float64 twin rounded (a few ulps)."""
    params, m, v = make_state(rng, SHAPES)
    m = [rand(rng, p.shape, 0.1) for p in params]
    v = [np.array(np.abs(rand(rng, p.shape, 0.01))) for p in params]
    g = [rand(rng, p.shape) for p in params]
    twin = [[a.copy() for a in xs] for xs in (params, m, v)]
    getattr(ops, fn)(params, g, m, v, step=7, lr=1e-2, weight_decay=0.02)
    getattr(reference, fn)(twin[0], g, twin[1], twin[2], step=7, lr=1e-2, weight_decay=0.02)
    for name, xs, ys in zip(("params", "exp_avg", "exp_avg_sq"), (params, m, v), twin):
        for i, (a, b) in enumerate(zip(xs, ys)):
            assert_close(a, b, **scaled(TOL["optim_twin"], b, 1.0),
                         name=f"{name}: tensor {i} {b.shape}", dtype=None)


def test_single_arrays_and_lists_agree(rng):
    p, g = rand(rng, (31, 7)), rand(rng, (31, 7))
    m, v = np.zeros_like(p), np.zeros_like(p)
    p2, m2, v2 = p.copy(), m.copy(), v.copy()
    ops.adamw_step(p, g, m, v, step=1, lr=0.1)
    ops.adamw_step([p2], (g,), [m2], [v2], step=1, lr=0.1)
    for a, b in ((p, p2), (m, m2), (v, v2)):
        np.testing.assert_array_equal(a, b)


def test_first_step_moves_every_weight_by_lr(rng):
    """Adam's first step with weight_decay 0: m_hat / sqrt(v_hat) = sign(g), so p moves by
    lr (up to eps), whatever the gradient's size."""
    p, g = rand(rng, 500), rand(rng, 500) * np.float32(1e3)
    before = p.copy()
    ops.adam_step(p, g, np.zeros_like(p), np.zeros_like(p), step=1, lr=0.01)
    assert_close(before - p, 0.01 * np.sign(g), **TOL["adam_first_step"], name="first step",
                 dtype=None)


# ---- grad_norm and clip_grads ------------------------------------------------------------------

def test_grad_norm_matches_torch_and_twin(rng):
    torch = requires_torch()
    grads = [rand(rng, s, 3.0) for s in SHAPES]
    total = ops.grad_norm(grads)
    assert isinstance(total, float)
    assert total == pytest.approx(reference.grad_norm(grads), rel=NORM_TWIN)
    tt = torch.nn.utils.get_total_norm([torch.tensor(g) for g in grads])
    assert_close(total, float(tt), **TOL["grad_norm_torch"], name="norm vs torch", dtype=None)
    assert ops.grad_norm([]) == 0.0
    assert ops.grad_norm(grads[2]) == pytest.approx(
        float(np.linalg.norm(grads[2].astype(np.float64))), rel=NORM_TWIN)
    # other dtypes and layouts are converted, not refused (nothing is written): the same bits
    # as the float32 C-contiguous copy (the transpose's elements in its own order; the
    # original's order sums differently in the last bit on some SIMD levels)
    assert ops.grad_norm([grads[2].T.astype(np.float64)]) == \
        ops.grad_norm([np.ascontiguousarray(grads[2].T)])


@pytest.mark.parametrize("max_norm", [0.5, 1e6, float("inf"), 0.0])
def test_clip_grads_matches_torch(rng, max_norm):
    torch = requires_torch()
    grads = [rand(rng, s, 2.0) for s in SHAPES]
    ref = [g.copy() for g in grads]
    tg = [torch.tensor(g.copy(), requires_grad=False) for g in grads]
    tparams = [torch.zeros_like(t, requires_grad=True) for t in tg]
    for p, g in zip(tparams, tg):
        p.grad = g
    their_total = float(torch.nn.utils.clip_grad_norm_(tparams, max_norm))
    before = [g.copy() for g in grads]
    total = ops.clip_grads(grads, max_norm)
    ref_total = reference.clip_grads(ref, max_norm)
    assert_close(total, their_total, **TOL["grad_norm_torch"], name="total vs torch", dtype=None)
    assert total == pytest.approx(ref_total, rel=NORM_TWIN)
    for g, r, t, b in zip(grads, ref, tparams, before):
        assert_close(g, t.grad.numpy(), **CLIP, name="clipped vs torch")
        assert_close(g, r, **CLIP, name="clipped vs twin")
        if not total > max_norm:
            np.testing.assert_array_equal(g, b)        # untouched: not even multiplied by 1
    if total > max_norm:
        norm = TOL["clipped_norm"]                        # approx: max(rel x |expected|, abs)
        assert ops.grad_norm(grads) == pytest.approx(min(max_norm, total), rel=norm["rtol"],
                                                     abs=norm["atol"])


def test_clip_grads_nonfinite_total_as_torch():
    g = [np.array([1.0, np.nan], np.float32), np.array([2.0], np.float32)]
    assert np.isnan(ops.clip_grads(g, 1.0))
    assert np.isnan(g[0]).all() and np.isnan(g[1]).all()       # torch multiplies by NaN too
    g = [np.array([1.0, np.inf], np.float32), np.array([2.0], np.float32)]
    assert ops.clip_grads(g, 1.0) == np.inf
    assert g[1][0] == 0.0 and g[0][0] == 0.0 and np.isnan(g[0][1])   # * 0, inf * 0 = NaN


# ---- threads -----------------------------------------------------------------------------------

def test_one_and_two_threads_bit_identical(restore_threads, rng):
    shapes = [(300000,), (129, 33), (5,)]
    results = {}
    for n in (1, 2, 3):
        fastattn.set_num_threads(n)
        r = np.random.default_rng(5)
        params, m, v = make_state(r, shapes)
        for step in range(1, 4):
            g = [rand(r, s) for s in shapes]
            ops.adamw_step(params, g, m, v, step=step, lr=1e-2)
        norm = ops.grad_norm(g + params)
        clipped = [a.copy() for a in g]
        total = ops.clip_grads(clipped, 1.0)
        results[n] = (params, m, v, norm, clipped, total)
    for n in (2, 3):
        for a, b in zip(results[1], results[n]):
            if isinstance(a, list):
                for x, y in zip(a, b):
                    np.testing.assert_array_equal(x, y, err_msg=f"1 vs {n} threads")
            else:
                assert a == b, f"1 vs {n} threads: {a!r} != {b!r}"


# ---- bad input ---------------------------------------------------------------------------------

def _state(n=4):
    return [np.zeros(n, np.float32) for _ in range(4)]


def test_bad_arrays():
    p, g, m, v = _state()
    kw = dict(step=1, lr=1e-3)
    with pytest.raises(TypeError, match=r"params\[0\] must be float32, got dtype float64"):
        ops.adamw_step([p.astype(np.float64)], [g], [m], [v], **kw)
    with pytest.raises(TypeError, match=r"grads\[0\] must be float32"):
        ops.adamw_step([p], [g.astype(np.float16)], [m], [v], **kw)
    with pytest.raises(ValueError, match=r"exp_avg\[0\] must be C-contiguous"):
        ops.adamw_step([p], [g], [np.zeros(8, np.float32)[::2]], [v], **kw)
    ro = v.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"exp_avg_sq\[0\] is read-only"):
        ops.adamw_step([p], [g], [m], [ro], **kw)
    gro = g.copy()
    gro.flags.writeable = False
    ops.adamw_step([p], [gro], [m], [v], **kw)                 # grads are only read
    with pytest.raises(ValueError, match="same shape"):
        ops.adamw_step([p], [np.zeros(5, np.float32)], [m], [v], **kw)
    with pytest.raises(ValueError, match="as many"):
        ops.adamw_step([p, p.copy()], [g], [m], [v], **kw)
    with pytest.raises(ValueError, match=r"params\[0\] and exp_avg\[0\] share memory"):
        ops.adamw_step([p], [g], [p], [v], **kw)
    with pytest.raises(TypeError, match="must be a NumPy array"):
        ops.adamw_step([p.tolist()], [g], [m], [v], **kw)
    with pytest.raises(TypeError, match="a list of them"):
        ops.adam_step({"a": p}, [g], [m], [v], **kw)
    with pytest.raises(ValueError, match=r"grads\[0\] is read-only"):
        ops.clip_grads([gro], 1.0)
    with pytest.raises(TypeError, match="float32"):
        ops.clip_grads([g.astype(np.float64)], 1.0)


@pytest.mark.parametrize("kw, err, match", [
    (dict(step=0), ValueError, "step must be >= 1"),
    (dict(step=1.0), TypeError, "step must be an int"),
    (dict(step=True), TypeError, "step must be an int"),
    (dict(lr=float("nan")), ValueError, "lr must be finite"),
    (dict(lr=-1e-3), ValueError, "lr must be >= 0"),
    (dict(lr="0.1"), TypeError, "lr must be a real number"),
    (dict(betas=(0.9, 1.0)), ValueError, r"betas\[1\] must be in \[0, 1\)"),
    (dict(betas=(0.9,)), ValueError, "betas must be a pair"),
    (dict(eps=-1.0), ValueError, "eps must be >= 0"),
    (dict(weight_decay=float("inf")), ValueError, "weight_decay must be finite"),
])
def test_bad_hyper_parameters(kw, err, match):
    p, g, m, v = _state()
    args = dict(step=1, lr=1e-3)
    args.update(kw)
    for fn in (ops.adamw_step, ops.adam_step):
        with pytest.raises(err, match=match):
            fn([p], [g], [m], [v], **args)


def test_bad_max_norm():
    g = [np.ones(3, np.float32)]
    with pytest.raises(ValueError, match="max_norm must be >= 0"):
        ops.clip_grads(g, -1.0)
    with pytest.raises(ValueError, match="max_norm must be >= 0"):
        ops.clip_grads(g, float("nan"))
    with pytest.raises(TypeError, match="max_norm must be a real number"):
        ops.clip_grads(g, None)


# ---- every SIMD path, and a team smaller than asked for -----------------------------------------

def isa_checks():
    """Run in a child under each FASTATTN_CPU_ISA (and small OpenMP teams), on a team of 2: the
    steps' p, m and v, grad_norm and clip_grads' total and the clipped grads against the twin
    (the table's optim_twin, grad_norm_twin and clip_grads entries), at sizes around the vector
    tails and above the threads' grain."""
    fastattn.set_num_threads(2)
    rng = np.random.default_rng(13)
    shapes = [(1,), (3,), (15,), (17,), (33, 31), (70001,)]

    def check(name, a, b, tol):
        assert_close(a, b, **scaled(tol, b, 1.0), name=name, dtype=None)

    for fn in ("adamw_step", "adam_step"):
        p = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        m = [(rng.standard_normal(s) * 0.1).astype(np.float32) for s in shapes]
        v = [(rng.random(s) * 0.01).astype(np.float32) for s in shapes]
        g = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        twin = [[a.copy() for a in xs] for xs in (p, m, v)]
        getattr(ops, fn)(p, g, m, v, step=3, lr=1e-2, weight_decay=0.05)
        getattr(reference, fn)(twin[0], g, twin[1], twin[2], step=3, lr=1e-2, weight_decay=0.05)
        for name, a, b in zip(("p", "m", "v"), (p, m, v), twin):
            for x, y in zip(a, b):
                check(f"{fn}.{name} {x.shape}", x, y, TOL["optim_twin"])
    g = [(rng.standard_normal(s) * 3).astype(np.float32) for s in shapes]
    check("grad_norm", ops.grad_norm(g), reference.grad_norm(g), TOL["grad_norm_twin"])
    r = [a.copy() for a in g]
    check("clip_grads.total", ops.clip_grads(g, 1.0), reference.clip_grads(r, 1.0),
          TOL["grad_norm_twin"])
    for x, y in zip(g, r):
        check(f"clip_grads {x.shape}", x, y, CLIP)


test_every_isa_path, test_fewer_threads_than_asked = \
    child_isa_tests("test_ops_optim", num_threads=None)


# ---- the benchmark case and its target ---------------------------------------------------------

def test_adamw_bench_sizes_are_transformer_base():
    from fastattn.bench import cases
    shapes = cases.transformer_base_shapes()
    n = sum(int(np.prod(s)) for s in shapes)
    assert 62e6 < n < 64e6                     # ~63M: nn.Transformer() + a 37000 x 512 embedding
    assert cases.CASES["adamw"].nbytes == 7 * 4 * n
    assert "adamw" in cases.OP_CASES and "adamw" in cases.DEFAULT_CASES


def test_copy_probe_is_timed_with_the_case(monkeypatch):
    """A case with copy_probe gets a memory copy timed interleaved with it: copy_gbps and
    share_of_copy = fastattn GB/s / copy GB/s in its row, which the adamw target reads."""
    from fastattn import bench
    from fastattn.bench import cases, runner

    def build(rng):
        return {"p": [np.array(rng.standard_normal(100000), np.float32)]}

    def impl(i):
        p = [a.copy() for a in i["p"]]
        m, v = [np.zeros_like(a) for a in p], [np.zeros_like(a) for a in p]
        return lambda: (ops.adamw_step(p, i["p"], m, v, step=1, lr=1e-3), p[0])[1]

    case = cases.Case("adamw", "tiny adamw", build, {"fastattn": impl}, nbytes=7 * 4 * 100000)
    case.copy_probe = True
    monkeypatch.setitem(cases.CASES, "adamw", case)
    (row,) = runner.run(["adamw"], repeat=2, threads=1)
    assert row["copy_runs"] == 2 and row["copy_gbps"] > 0
    assert_close(row["share_of_copy"], row["fastattn_gbps"] / row["copy_gbps"],
                 **TOL["float64_figure"], name="share of copy", dtype=None)
    assert any("memory copy" in n for n in row["notes"])
    (target,) = [t for t in bench.check_targets([row]) if t["case"] == "adamw"]
    assert target["status"] == ("PASS" if row["share_of_copy"] >= 0.8 else "MISS")
    row["share_of_copy"] = 0.5
    (target,) = [t for t in bench.check_targets([row]) if t["case"] == "adamw"]
    assert target["status"] == "MISS" and "50% of the copy" in target["detail"]
    (target,) = [t for t in bench.check_targets([]) if t["case"] == "adamw"]
    assert target["status"] == "SKIP"
