"""Every SIMD path this CPU can run, forced with FASTATTN_CPU_ISA in a fresh interpreter (the level
is chosen once at import), checked against the NumPy twin inside that interpreter.

The child prints one JSON object: per op, the worst ratio |actual - expected| / tolerance
(tolerance = atol * scale + rtol * |expected|, with atol/rtol sent by this file), the largest
absolute difference, and the count of NaN/inf positions that differ. The parent asserts.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import fastattn
from tolerances import TOL
from grad_util import child_env

AVAILABLE = fastattn.build_info()["simd_available"]
ALL_LEVELS = ("generic", "avx2", "avx512")

CHILD = textwrap.dedent(r"""
    import json, math, sys
    import numpy as np
    import fastattn
    from fastattn import _fast, ops, reference

    want_isa, tol = sys.argv[1], json.loads(sys.argv[2])
    info = fastattn.build_info()
    assert info["simd"] == want_isa, f"simd is {info['simd']}, expected {want_isa}"
    rng = np.random.default_rng(7)

    def rand(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    report = {"simd": info["simd"]}

    def compare(name, actual, expected, rtol, atol):
        a = np.asarray(actual, np.float64)
        e = np.asarray(expected, np.float64)
        assert a.shape == e.shape, f"{name}: shape {a.shape} != {e.shape}"
        assert np.asarray(actual).dtype == np.float32, f"{name}: dtype {np.asarray(actual).dtype}"
        special = int(((np.isnan(a) != np.isnan(e)) | (np.isinf(a) != np.isinf(e))
                       | (np.isinf(e) & (a != e))).sum())
        fin = np.isfinite(a) & np.isfinite(e)
        diff = np.abs(a[fin] - e[fin])
        ratio = diff / (atol + rtol * np.abs(e[fin]))
        report[name] = {"ratio": float(ratio.max(initial=0.0)),
                        "max_abs": float(diff.max(initial=0.0)), "special": special}

    # this level's tile edges: query block BQ, key block BK, one row at a time up to R queries
    tiles = info["tiles"]
    BQ, BK = tiles["attention_block_q"], tiles["attention_block_k"]
    R = tiles["attention_rows_max_q"]
    BR = tiles["attention_backward_block_q"]

    # attention: odd sizes, partial query/key blocks, masks combined, Lq > Lk, return_weights,
    # the last one-row-at-a-time length and the first tiled one; dropout; the backward
    cases = [
        dict(B=2, H=3, Lq=BQ + 5, Lk=3 * BQ + 5, D=7, Dv=33, causal=True, mask="bool", kpm=True),
        dict(B=1, H=2, Lq=2 * BQ + 1, Lk=BK + 1, D=80, Dv=80, causal=True, mask="float",
             kpm=False),
        dict(B=3, H=1, Lq=1, Lk=BK + 8, D=64, Dv=16, causal=True, mask=None, kpm=True),
        dict(B=2, H=3, Lq=R, Lk=150, D=33, Dv=17, causal=True, mask="float", kpm=True),
        dict(B=2, H=3, Lq=R + 1, Lk=BQ + 1, D=33, Dv=17, causal=True, mask="float", kpm=True),
        dict(B=2, H=2, Lq=2 * BQ + 1, Lk=2 * BQ + 1, D=1, Dv=128, causal=False, mask="bool",
             kpm=False),
        # the backward's query blocks (BR rows) and key blocks (BQ keys), one (batch, head)
        dict(B=1, H=1, Lq=BR + 1, Lk=2 * BQ + 3, D=33, Dv=2 * BQ + 1, causal=True, mask=None,
             kpm=True),
    ]
    for i, c in enumerate(cases):
        q, k, v = (rand(c["B"], c["H"], c["Lq"], c["D"]), rand(c["B"], c["H"], c["Lk"], c["D"]),
                   rand(c["B"], c["H"], c["Lk"], c["Dv"]))
        kw = {"causal": c["causal"]}
        if c["mask"] == "bool":
            m = rng.random((c["Lq"], c["Lk"])) < 0.3
            m[3] = True                                             # one fully masked row
            kw["mask"] = m
        elif c["mask"] == "float":
            m = rng.standard_normal((c["B"], 1, c["Lq"], c["Lk"]))
            m[rng.random(m.shape) < 0.3] = -np.inf
            kw["mask"] = m
        if c["kpm"]:
            kw["key_padding_mask"] = rng.random((c["B"], c["Lk"])) < 0.2
        out, cache = ops.attention_forward(q, k, v, **kw)
        ref_out, ref_cache = reference.attention_forward(q, k, v, **kw)
        vmax = max(1.0, float(np.abs(v).max()))
        smax = max(1.0, float(np.abs(q.astype(np.float64) @ np.swapaxes(k, -1, -2)).max())
                   / math.sqrt(c["D"]))
        growth = max(1.0, smax / 50.0)
        t = tol["attention"]
        compare(f"attention{i}.out", out, ref_out, t["rtol"], t["atol"] * vmax * growth)
        t = tol["attention_lse"]
        compare(f"attention{i}.lse", cache["lse"], ref_cache["lse"], t["rtol"], t["atol"] * smax)
        _, w = ops.attention(q, k, v, return_weights=True, **kw)
        _, ref_w = reference.attention(q, k, v, return_weights=True, **kw)
        t = tol["attention_weights"]
        compare(f"attention{i}.weights", w, ref_w, t["rtol"] * growth, t["atol"] * growth)

        # dropout on the weights: the same elements dropped as the twin, bit for bit
        drop = dict(kw, dropout_p=0.3, seed=2**63 + i)
        _, w = ops.attention(q, k, v, return_weights=True, **drop)
        _, ref_w = reference.attention(q, k, v, return_weights=True, **drop)
        compare(f"attention{i}.dropout.weights", w, ref_w, t["rtol"] * growth,
                t["atol"] * growth / 0.7)
        report[f"attention{i}.dropout.weights"]["special"] += int(((w == 0) != (ref_w == 0)).sum())

        # backward (with and without dropout) on the kernel's own out and lse; atol = 4 eps32
        # (sqrt(terms) + largest |score|) x the largest sum of |terms| of the gradient, as in
        # test_ops_attention_backward.py
        terms = max(c["D"], c["Dv"], c["Lq"], c["Lk"])
        for extra in ({}, {"dropout_p": 0.3, "seed": 12345 + i}):
            kwb = dict(kw, **extra)
            o, cch = ops.attention_forward(q, k, v, **kwb)
            dout = rand(*o.shape)
            got = ops.attention_backward(dout, q, k, v, o, cch["lse"], **kwb)
            want = reference.attention_backward(dout, q, k, v, o, cch["lse"], **kwb)
            P = reference.attention(q, k, v, return_weights=True, **kw)[1].astype(np.float64)
            P /= 1.0 - extra.get("dropout_p", 0.0)
            ad, aq, ak, av, ao = (np.abs(np.asarray(a, np.float64)) for a in (dout, q, k, v, o))
            ds = P * (ad @ np.swapaxes(av, -1, -2) + (ad * ao).sum(-1, keepdims=True))
            mags = (ds @ ak / math.sqrt(c["D"]), np.swapaxes(ds, -1, -2) @ aq / math.sqrt(c["D"]),
                    np.swapaxes(P, -1, -2) @ ad)
            for name, g, e, m in zip(("dq", "dk", "dv"), got, want, mags):
                atol = 4.0 * float(np.finfo(np.float32).eps) * (math.sqrt(terms) + smax) * m.max()
                compare(f"attention{i}{'.dropout' if extra else ''}.{name}", g, e, 1e-4, atol)

    x = rand(33, 1025, scale=4.0)
    x[::5, ::3] = -np.inf
    x[7] = -np.inf
    t = tol["softmax"]
    compare("softmax", ops.softmax(x), reference.softmax(x), 2 * t["rtol"], t["atol"])
    compare("softmax.axis0", ops.softmax(x[:, :17], axis=0), reference.softmax(x[:, :17], axis=0),
            2 * t["rtol"], t["atol"])

    x, r, w, b = rand(29, 513, scale=2.0), rand(29, 513), rand(513), rand(513)
    y, cache = ops.layer_norm_forward(x, w, b, residual=r)
    ry, rcache = reference.layer_norm_forward(x, w, b, residual=r)
    t = tol["layer_norm"]
    compare("layer_norm", y, ry, t["rtol"],
            t["atol"] * (1 + float(np.abs(w).max()) + float(np.abs(b).max())))
    t = tol["layer_norm_mean"]
    compare("layer_norm.mean", cache["mean"], rcache["mean"], t["rtol"], t["atol"] * 10)
    t = tol["layer_norm_rstd"]
    compare("layer_norm.rstd", cache["rstd"], rcache["rstd"], t["rtol"], t["atol"])

    def dot_atol(x, w, bias, factor):
        mag = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
        if bias is not None:
            mag = mag + np.abs(bias)
        return factor * float(np.finfo(np.float32).eps) * math.sqrt(w.shape[1]) * float(mag.max())

    x, w, b = rand(131, 77), rand(65, 77, scale=0.2), rand(65)
    t = tol["linear"]
    compare("linear.gelu", ops.linear(x, w, b, activation="gelu"),
            reference.linear(x, w, b, activation="gelu"), t["rtol"], dot_atol(x, w, b, t["atol"]))
    x = np.linspace(-9, 9, 1001, dtype=np.float32)[:, None]
    compare("linear.gelu_range", ops.linear(x, np.eye(1, dtype=np.float32), activation="gelu"),
            reference.linear(x, np.eye(1), activation="gelu"), 1e-6, 2e-7)
    compare("linear.gelu_tanh_range",
            ops.linear(x, np.eye(1, dtype=np.float32), activation="gelu_tanh"),
            reference.linear(x, np.eye(1), activation="gelu_tanh"), 1e-5, 2e-7)

    # few-row paths: the skinny kernel (up to skinny_rows rows, row-major weight) and the packed
    # one (rows in register tiles of packed_tile_rows, features in panels)
    SK, RB, M = tiles["skinny_rows"], tiles["packed_tile_rows"], 2 * tiles["packed_panel"] + 5
    for n_rows in sorted({1, RB - 1, RB, RB + 1, SK, SK + 1}):
        x, w, b = rand(n_rows, 77), rand(M, 77, scale=0.2), rand(M)
        for act in (None, "relu", "gelu", "gelu_tanh"):
            expect = reference.linear(x, w, b, activation=act)
            compare(f"linear.rows{n_rows}.{act}", ops.linear(x, w, b, activation=act), expect,
                    t["rtol"], dot_atol(x, w, b, t["atol"]))
            y = np.empty((n_rows, M), np.float32)
            _fast.linear_packed_into(y, x, _fast.PackedWeight(w), b, ops.ACTIVATIONS[act])
            compare(f"linear_packed.rows{n_rows}.{act}", y, expect, t["rtol"],
                    dot_atol(x, w, b, t["atol"]))

    x = rand(300, 65)
    w1, b1, w2, b2 = rand(129, 65, scale=0.12), rand(129), rand(65, 129, scale=0.09), rand(65)
    t = tol["ffn"]
    h = reference.linear(x, w1, b1, activation="relu")
    atol = (dot_atol(x, w1, b1, t["atol"]) * float(np.abs(w2).sum(axis=1).max())
            + dot_atol(h, w2, b2, t["atol"]))
    compare("ffn.relu", ops.ffn(x, w1, b1, w2, b2, activation="relu"),
            reference.ffn(x, w1, b1, w2, b2, activation="relu"), t["rtol"], atol)

    print(json.dumps(report))
""")


def run_child(env_isa, code=CHILD, args=()):
    env = child_env({} if env_isa is None else {"FASTATTN_CPU_ISA": env_isa})
    if env_isa is None:
        env.pop("FASTATTN_CPU_ISA", None)
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("isa", ALL_LEVELS)
def test_isa_path_matches_reference(isa):
    if isa not in AVAILABLE:
        pytest.skip(f"{isa} is not available on this CPU/build (available: {AVAILABLE})")
    proc = run_child(isa, args=(isa, json.dumps(TOL)))
    assert proc.returncode == 0, f"child failed under FASTATTN_CPU_ISA={isa}:\n{proc.stderr}"
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report.pop("simd") == isa
    bad = {op: r for op, r in report.items() if r["ratio"] > 1.0 or r["special"]}
    assert not bad, (f"FASTATTN_CPU_ISA={isa}: ops outside tolerance (ratio > 1) or with NaN/inf "
                     f"in the wrong places: {json.dumps(bad, indent=1)}")


def test_each_level_reports_its_own_tiles():
    """A child forced to a level reports that level's tiles in build_info()["tiles"], the same
    as the parent's tiles_by_isa entry for it."""
    by_isa = fastattn.build_info()["tiles_by_isa"]
    assert set(by_isa) == set(AVAILABLE)
    for isa in AVAILABLE:
        proc = run_child(isa, "import json, fastattn; print(json.dumps(fastattn.build_info()))")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["tiles"] == by_isa[isa], isa


def test_default_isa_is_the_best_available():
    proc = run_child(None, "import fastattn; print(fastattn.build_info()['simd'])")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == AVAILABLE[-1]
    assert AVAILABLE[0] == "generic", "the baseline path must always be available"


def test_bogus_isa_refused_at_import():
    proc = run_child("bogus", "import fastattn")
    assert proc.returncode != 0
    assert "FASTATTN_CPU_ISA" in proc.stderr and "bogus" in proc.stderr, proc.stderr


def test_unsupported_isa_refused_at_import():
    missing = [name for name in ALL_LEVELS if name not in AVAILABLE]
    if not missing:
        pytest.skip("this CPU and build support every level; nothing to refuse")
    proc = run_child(missing[-1], "import fastattn")
    assert proc.returncode != 0
    assert "FASTATTN_CPU_ISA" in proc.stderr and missing[-1] in proc.stderr, proc.stderr
