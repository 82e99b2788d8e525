"""The build really has what DESIGN requires: OpenMP on, an ISA reported, no BLAS library
linked (every float32 product is the GEMM engine's); and build_info() reports the build kind,
the kernels' tile sizes and the engine's blocking."""

import numpy as np
import pytest

import fastattn
from fastattn import kinds


def test_openmp_enabled():
    # a build without OpenMP exists only on request (FASTATTN_NO_OPENMP=1); this one must have it
    assert fastattn.build_info()["openmp"] is True


def test_no_blas_library_is_linked_or_reported():
    import sys
    info = fastattn.build_info()
    assert not any("blas" in key for key in info), sorted(info)
    assert "scipy_openblas32" not in sys.modules
    if sys.platform.startswith("linux"):
        with open("/proc/self/maps") as f:
            mapped = f.read()
        lib = fastattn._kernels.__file__
        assert lib in mapped
        # the extension needs no BLAS symbols: its own dynamic section names none
        with open(lib, "rb") as f:
            assert b"cblas_sgemm" not in f.read()


def test_simd_level_reported():
    info = fastattn.build_info()
    assert info["simd_available"], "no SIMD level at all"
    assert info["simd"] in info["simd_available"]
    assert set(info["simd_available"]) <= {"generic", "avx2", "avx512"}
    assert "generic" in info["simd_available"]


def test_threads_and_fields():
    info = fastattn.build_info()
    assert isinstance(info["threads"], int) and info["threads"] >= 1
    assert info["threads"] == fastattn.get_num_threads()
    assert info["version"] == fastattn.__version__
    assert info["compiler"]
    assert info["native_build"] in (False, True)


def test_positional_encoding_seed000_position0():
    # seed 000: d_model = 6, position 0 -> sin(0) = 0 on even features, cos(0) = 1 on odd
    pe = fastattn.positional_encoding(1, 6)
    assert pe.shape == (1, 6) and pe.dtype == np.float32
    assert pe[0].tolist() == [0, 1, 0, 1, 0, 1]
    np.testing.assert_array_equal(fastattn.positional_encoding(9, 7),
                                  fastattn.reference.positional_encoding(9, 7))


def test_build_kind_reported():
    info = fastattn.build_info()
    assert info["debug_build"] in (False, True) and info["sanitize_build"] in (False, True)
    assert info["max_threads"] >= 1024


def test_tiles_reported_for_every_level():
    """build_info()["tiles"]: the tile sizes and few-row thresholds the tests aim at, for the
    level in use, and tiles_by_isa for every level this process can run."""
    info = fastattn.build_info()
    assert info["tiles"] == info["tiles_by_isa"][info["simd"]]
    assert set(info["tiles_by_isa"]) == set(info["simd_available"])
    for isa, t in info["tiles_by_isa"].items():
        assert set(t) == set(fastattn._runtime.TILE_NAMES)
        assert all(isinstance(v, int) and v > 0 for v in t.values()), t
        # vector registers: 128, 256 and 512 bits of float32
        assert t["vector_width"] == {"generic": 4, "avx2": 8, "avx512": 16}[isa]
        assert t["attention_block_q"] % t["vector_width"] == 0
        assert t["attention_rows_max_q"] < t["attention_block_q"]
        assert t["softmax_chunk"] % t["vector_width"] == 0
        assert t["packed_panel"] % t["packed_tile_features"] == 0
        assert t["row_block"] > t["packed_tile_rows"]


def test_tiles_match_what_the_kernels_do():
    t = fastattn.build_info()["tiles"]
    panel = t["packed_panel"]
    for M, K in ((1, 3), (panel, 5), (panel + 1, 7)):
        packed = kinds.pack_panels(np.zeros((M, K), np.float32))
        assert packed.size == -(-M // panel) * panel * K


def test_build_jobs_setting(monkeypatch):
    """FASTATTN_BUILD_JOBS (build_tools/parallel.py): a whole number >= 1, else the build stops
    naming the variable; unset, the CPUs the build may use."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "build_tools" / "parallel.py"
    if not path.exists():  # an installed copy without the source tree
        pytest.skip("build_tools/ is not beside the tests")
    spec = importlib.util.spec_from_file_location("_fa_build_parallel", path)
    parallel = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parallel)
    monkeypatch.setenv("FASTATTN_BUILD_JOBS", "3")
    assert parallel._jobs() == 3
    for bad in ("0", "-1", "two", "1.5"):
        monkeypatch.setenv("FASTATTN_BUILD_JOBS", bad)
        with pytest.raises(SystemExit, match="FASTATTN_BUILD_JOBS"):
            parallel._jobs()
    monkeypatch.delenv("FASTATTN_BUILD_JOBS")
    assert parallel._jobs() >= 1
