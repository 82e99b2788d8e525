"""Which OpenBLAS kernels fastattn loads (fastattn._blas_core): Haswell's on AMD Zen 4 unless
OPENBLAS_CORETYPE says otherwise, OpenBLAS's own pick elsewhere, the environment left as it
was."""
import textwrap

import pytest

from conftest import child_report, run_child
from fastattn import _blas_core

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512vl avx512_vnni

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
flags\t\t: fpu sse2 avx avx2
"""


def cpuinfo(vendor="AuthenticAMD", family=25, flags="fpu avx avx2 fma avx512f"):
    return f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nflags\t\t: {flags}\n"


def test_cpu_name_finds_zen4_only():
    assert _blas_core.cpu_name(ZEN4) == "AMD Zen 4"            # the first processor's fields
    assert _blas_core.cpu_name(cpuinfo()) == "AMD Zen 4"
    assert _blas_core.cpu_name(cpuinfo(flags="fpu avx avx2 fma")) is None     # Zen 3
    assert _blas_core.cpu_name(cpuinfo(family=26)) is None                     # Zen 5
    assert _blas_core.cpu_name(cpuinfo(family=23)) is None                     # Zen 1/2
    assert _blas_core.cpu_name(cpuinfo(vendor="GenuineIntel", family=6)) is None
    assert _blas_core.cpu_name(cpuinfo(flags="avx512fx")) is None   # whole flag names only
    assert _blas_core.cpu_name("") is None
    assert _blas_core.cpu_name("garbage without colons\n\n") is None


def test_preferred_core():
    assert _blas_core.preferred_core(ZEN4, {}) == ("Haswell", "fastattn (AMD Zen 4)")
    assert _blas_core.preferred_core(ZEN4, {"OPENBLAS_CORETYPE": "SkylakeX"}) == \
        (None, "OPENBLAS_CORETYPE")
    assert _blas_core.preferred_core(ZEN4, {"OPENBLAS_CORETYPE": ""}) == \
        ("Haswell", "fastattn (AMD Zen 4)")                      # empty: unset to OpenBLAS too
    intel = cpuinfo(vendor="GenuineIntel", family=6)
    assert _blas_core.preferred_core(intel, {}) == (None, "OpenBLAS")


CHILD = textwrap.dedent("""
    import json, os, sys
    if sys.argv[1] == "preloaded":
        import scipy_openblas32  # noqa: F401
    import fastattn
    info = fastattn.build_info()
    print(json.dumps({"core": info["blas_core"], "choice": info["blas_core_choice"],
                      "env": os.environ.get("OPENBLAS_CORETYPE")}))
""")


def child(env_value, mode="fresh"):
    env = {} if env_value is None else {"OPENBLAS_CORETYPE": env_value}
    return child_report(run_child(CHILD, mode, env=env, unset=("OPENBLAS_CORETYPE",)))


def this_cpu():
    return _blas_core.cpu_name(_blas_core._read_cpuinfo())


def test_import_chooses_and_leaves_the_environment_alone():
    report = child(None)
    assert report["env"] is None                   # set for the load only, then taken out
    if this_cpu() == "AMD Zen 4":
        assert report == {"core": "Haswell", "choice": "fastattn (AMD Zen 4)", "env": None}
    else:
        assert report["choice"] == "OpenBLAS"


def test_user_setting_wins():
    flags = _blas_core._fields(_blas_core._read_cpuinfo()).get("flags", "").split()
    if "avx2" not in flags:
        pytest.skip("OpenBLAS's Haswell kernels need AVX2")
    # on Zen 4 the opposite of fastattn's choice; elsewhere a choice all the same
    want = "SkylakeX" if this_cpu() == "AMD Zen 4" else "Haswell"
    assert child(want) == {"core": want, "choice": "OPENBLAS_CORETYPE", "env": want}


def test_an_empty_setting_is_restored():
    report = child("")
    assert report["env"] == ""
    if this_cpu() == "AMD Zen 4":
        assert report["choice"] == "fastattn (AMD Zen 4)" and report["core"] == "Haswell"


def test_an_openblas_loaded_before_fastattn_keeps_its_kernels():
    report = child(None, "preloaded")
    assert report["choice"] == "OpenBLAS" and report["env"] is None
    if this_cpu() == "AMD Zen 4":
        assert report["core"] != "Haswell"         # OpenBLAS's own pick: SkylakeX/Cooperlake
