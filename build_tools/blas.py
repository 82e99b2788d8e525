"""BLAS: the OpenBLAS of the scipy-openblas32 package (symbols prefixed `scipy_`).

No rpath into the build environment: fastattn/__init__.py imports scipy_openblas32 first, which
loads the library into the process before the extension needs it.
"""
import scipy_openblas32


def configure():
    return {
        "include_dir": scipy_openblas32.get_include_dir(),
        "lib_dir": scipy_openblas32.get_lib_dir(),
        "library": scipy_openblas32.get_library(),
        "define_macros": [("BLAS_SYMBOL_PREFIX", "scipy_")],
    }
