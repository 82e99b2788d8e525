"""The build really has what DESIGN requires: OpenMP on, OpenBLAS found, an ISA reported."""
import numpy as np

import fastattn


def test_openmp_enabled():
    # a build without OpenMP exists only on request (FASTATTN_NO_OPENMP=1); this one must have it
    assert fastattn.build_info()["openmp"] is True


def test_blas_is_openblas():
    info = fastattn.build_info()
    assert "openblas" in info["blas"].lower(), info["blas"]
    assert info["blas_threads"] >= 1


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
