"""The corpus-runner bench cases are registered (not run by default) and their targets read
the rows as documented: overhead of translate_file over generate, Ray over threads."""
from fastattn import bench
from fastattn.bench import runner
from fastattn.bench.cases import RUNNER_CASE_NAMES


def row(case, fast=None, numpy=None, status=None):
    r = runner.empty_row(bench.CASES[case], 2)
    for impl, ms in (("fastattn", fast), ("numpy", numpy)):
        if ms is not None:
            r[f"{impl}_times_ms"] = [ms]
    if status:
        r["fastattn_status"] = status
    return runner.finish_row(bench.CASES[case], r)


def targets(rows):
    return {t["case"]: t for t in bench.check_targets(rows) if t["case"] in RUNNER_CASE_NAMES}


def test_registered_but_not_default():
    assert RUNNER_CASE_NAMES == ("runner", "runner_ray")
    assert not set(RUNNER_CASE_NAMES) & set(bench.DEFAULT_CASES)
    assert all(bench.CASES[n].implementations == ("fastattn", "numpy")
               for n in RUNNER_CASE_NAMES)


def test_targets():
    t = targets([row("runner", fast=1080.0, numpy=1000.0),
                 row("runner_ray", fast=1000.0, numpy=880.0)])
    assert t["runner"]["status"] == "PASS" and "+8.0%" in t["runner"]["detail"]
    assert t["runner_ray"]["status"] == "MISS" and t["runner_ray"]["detail"].startswith("0.88x")
    t = targets([row("runner", fast=1200.0, numpy=1000.0),
                 row("runner_ray", numpy=880.0, status="n/a: needs Ray")])
    assert t["runner"]["status"] == "MISS"
    assert t["runner_ray"]["status"] == "SKIP" and "needs Ray" in t["runner_ray"]["detail"]
    assert targets([])["runner"]["status"] == "SKIP"
