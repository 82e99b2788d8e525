"""Every SIMD path this CPU can run, forced with FASTATTN_CPU_ISA in a fresh interpreter (the level
is chosen once at import), checked against the NumPy twin inside that interpreter.

isa_checks runs in the child: every op at this level's tile edges, compared with assert_close
at the table's tolerances (tolerances.py); it reports every op outside them, then fails. The
parent asserts that the child ran at the level asked for and exited cleanly.
"""
import numpy as np
import pytest

import fastattn
from conftest import SIMD_LEVELS, assert_close, child_report, run_child, run_isa_checks
from fastattn import _fast, kinds, ops, reference
from tolerances import (TOL, attention_grad_atol, attention_grad_magnitudes, attention_tols,
                        dot_atol, ffn_atol, layer_norm_atol, max_score)

AVAILABLE = fastattn.build_info()["simd_available"]


def isa_checks():
    """Run in a child under each FASTATTN_CPU_ISA: attention (forward, weights, dropout,
    backward), softmax, layer norm, linear (the few-row paths too) and ffn against the twin."""
    info = fastattn.build_info()
    rng = np.random.default_rng(7)

    def rand(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    failures = []

    def check(name, actual, expected, rtol, atol):
        try:
            assert_close(actual, expected, rtol, atol, name)
        except AssertionError as exc:
            failures.append(str(exc))

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
        t_out, t_w, t_lse = attention_tols(q, k, v, None)
        out, cache = ops.attention_forward(q, k, v, **kw)
        ref_out, ref_cache = reference.attention_forward(q, k, v, **kw)
        check(f"attention{i}.out", out, ref_out, **t_out)
        check(f"attention{i}.lse", cache["lse"], ref_cache["lse"], **t_lse)
        _, w = ops.attention(q, k, v, return_weights=True, **kw)
        _, ref_w = reference.attention(q, k, v, return_weights=True, **kw)
        check(f"attention{i}.weights", w, ref_w, **t_w)

        # dropout on the weights: the same elements dropped as the twin, bit for bit
        drop = dict(kw, dropout_p=0.3, seed=2**63 + i)
        _, w = ops.attention(q, k, v, return_weights=True, **drop)
        _, ref_w = reference.attention(q, k, v, return_weights=True, **drop)
        check(f"attention{i}.dropout.weights", w, ref_w, t_w["rtol"], t_w["atol"] / 0.7)
        dropped = int(((w == 0) != (ref_w == 0)).sum())
        if dropped:
            failures.append(f"attention{i}.dropout.weights: {dropped} elements dropped by one "
                            "twin only")

        # backward (with and without dropout) on the kernel's own out and lse, as in
        # test_ops_attention_backward.py
        terms = max(c["D"], c["Dv"], c["Lq"], c["Lk"])
        smax = max_score(q, k, None)
        for extra in ({}, {"dropout_p": 0.3, "seed": 12345 + i}):
            kwb = dict(kw, **extra)
            o, cch = ops.attention_forward(q, k, v, **kwb)
            dout = rand(*o.shape)
            got = ops.attention_backward(dout, q, k, v, o, cch["lse"], **kwb)
            want = reference.attention_backward(dout, q, k, v, o, cch["lse"], **kwb)
            mags = attention_grad_magnitudes(dout, q, k, v, o, **kwb)
            for name, g, e, m in zip(("dq", "dk", "dv"), got, want, mags):
                check(f"attention{i}{'.dropout' if extra else ''}.{name}", g, e,
                      TOL["attention_grad"]["rtol"], attention_grad_atol(m, terms, smax))

    x = rand(33, 1025, scale=4.0)
    x[::5, ::3] = -np.inf
    x[7] = -np.inf
    t = TOL["softmax"]
    check("softmax", ops.softmax(x), reference.softmax(x), 2 * t["rtol"], t["atol"])
    check("softmax.axis0", ops.softmax(x[:, :17], axis=0), reference.softmax(x[:, :17], axis=0),
          2 * t["rtol"], t["atol"])

    x, r, w, b = rand(29, 513, scale=2.0), rand(29, 513), rand(513), rand(513)
    y, cache = ops.layer_norm_forward(x, w, b, residual=r)
    ry, rcache = reference.layer_norm_forward(x, w, b, residual=r)
    check("layer_norm", y, ry, TOL["layer_norm"]["rtol"], layer_norm_atol(w, b))
    t = TOL["layer_norm_mean"]
    check("layer_norm.mean", cache["mean"], rcache["mean"], t["rtol"], t["atol"] * 10)
    t = TOL["layer_norm_rstd"]
    check("layer_norm.rstd", cache["rstd"], rcache["rstd"], t["rtol"], t["atol"])

    x, w, b = rand(131, 77), rand(65, 77, scale=0.2), rand(65)
    t = TOL["linear"]
    check("linear.gelu", ops.linear(x, w, b, activation="gelu"),
          reference.linear(x, w, b, activation="gelu"), t["rtol"], dot_atol(x, w, bias=b))
    x = np.linspace(-9, 9, 1001, dtype=np.float32)[:, None]
    check("linear.gelu_range", ops.linear(x, np.eye(1, dtype=np.float32), activation="gelu"),
          reference.linear(x, np.eye(1), activation="gelu"), 1e-6, 2e-7)
    check("linear.gelu_tanh_range",
          ops.linear(x, np.eye(1, dtype=np.float32), activation="gelu_tanh"),
          reference.linear(x, np.eye(1), activation="gelu_tanh"), 1e-5, 2e-7)
    check("linear.silu_range", ops.linear(x, np.eye(1, dtype=np.float32), activation="silu"),
          reference.linear(x, np.eye(1), activation="silu"), 1e-6, 2e-7)

    # few rows on the engine, the weight as given (packed by the call) and packed: rows around
    # the register tiles of packed_tile_rows, features in panels; the same bits both ways
    RB, M = tiles["packed_tile_rows"], 2 * tiles["packed_panel"] + 5
    for n_rows in sorted({1, RB - 1, RB, RB + 1, 2 * RB + 1}):
        x, w, b = rand(n_rows, 77), rand(M, 77, scale=0.2), rand(M)
        for act in (None, "relu", "gelu", "gelu_tanh", "silu"):
            expect = reference.linear(x, w, b, activation=act)
            check(f"linear.rows{n_rows}.{act}", ops.linear(x, w, b, activation=act), expect,
                  t["rtol"], dot_atol(x, w, bias=b))
            y = np.empty((n_rows, M), np.float32)
            _fast.linear_packed_into(y, x, kinds.pack_panels(w), b, ops.ACTIVATIONS[act])
            check(f"linear_packed.rows{n_rows}.{act}", y, expect, t["rtol"],
                  dot_atol(x, w, bias=b))
            np.testing.assert_array_equal(y, ops.linear(x, w, b, activation=act))

    x = rand(300, 65)
    w1, b1, w2, b2 = rand(129, 65, scale=0.12), rand(129), rand(65, 129, scale=0.09), rand(65)
    check("ffn.relu", ops.ffn(x, w1, b1, w2, b2, activation="relu"),
          reference.ffn(x, w1, b1, w2, b2, activation="relu"), TOL["ffn"]["rtol"],
          ffn_atol(x, w1, b1, w2, b2, "relu", slope=1.0))

    assert not failures, (f"FASTATTN_CPU_ISA={info['simd']}: ops outside tolerance or with "
                          "NaN/inf in the wrong places:\n" + "\n".join(failures))


@pytest.mark.parametrize("isa", SIMD_LEVELS)
def test_isa_path_matches_reference(isa):
    run_isa_checks(isa, "test_dispatch")


def test_each_level_reports_its_own_tiles():
    """A child forced to a level reports that level's tiles in build_info()["tiles"], the same
    as the parent's tiles_by_isa entry for it."""
    by_isa = fastattn.build_info()["tiles_by_isa"]
    assert set(by_isa) == set(AVAILABLE)
    code = "import json, fastattn; print(json.dumps(fastattn.build_info()))"
    for isa in AVAILABLE:
        info = child_report(run_child(code, env={"FASTATTN_CPU_ISA": isa}))
        assert info["tiles"] == by_isa[isa], isa


def test_default_isa_is_the_best_available():
    proc = run_child("import fastattn; print(fastattn.build_info()['simd'])",
                     unset=("FASTATTN_CPU_ISA",))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == AVAILABLE[-1]
    assert AVAILABLE[0] == "generic", "the baseline path must always be available"


def test_bogus_isa_refused_at_import():
    proc = run_child("import fastattn", env={"FASTATTN_CPU_ISA": "bogus"})
    assert proc.returncode != 0
    assert "FASTATTN_CPU_ISA" in proc.stderr and "bogus" in proc.stderr, proc.stderr


def test_unsupported_isa_refused_at_import():
    missing = [name for name in SIMD_LEVELS if name not in AVAILABLE]
    if not missing:
        pytest.skip("this CPU and build support every level; nothing to refuse")
    proc = run_child("import fastattn", env={"FASTATTN_CPU_ISA": missing[-1]})
    assert proc.returncode != 0
    assert "FASTATTN_CPU_ISA" in proc.stderr and missing[-1] in proc.stderr, proc.stderr
