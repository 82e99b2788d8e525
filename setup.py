"""Build the one extension, fastattn._kernels (Cython binding + csrc/*.c).

All probing (OpenMP, compiler flags) lives in build_tools/; this file only assembles it. No BLAS:
every float32 product is fastattn's own GEMM engine (csrc/gemm.c).
"""
import glob
import os
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_tools import cpu, openmp  # noqa: E402
from build_tools.parallel import BuildExt  # noqa: E402

omp = openmp.configure()
flags = cpu.configure()

ext = Extension(
    "fastattn._kernels",
    sources=["fastattn/_kernels.pyx"] + sorted(glob.glob("csrc/*.c")),
    include_dirs=["csrc", numpy.get_include()],
    define_macros=flags["define_macros"] + omp["define_macros"],
    extra_compile_args=flags["compile_args"] + omp["compile_args"],
    extra_link_args=flags["link_args"] + omp["link_args"],
)

setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=cythonize(
        [ext],
        compiler_directives={
            "language_level": 3,
            "boundscheck": flags["boundscheck"],
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
            "nonecheck": False,
            "embedsignature": True,
        },
    ),
)
