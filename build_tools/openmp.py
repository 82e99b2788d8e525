"""OpenMP: flag table per compiler and a compile + link + run probe.

FASTATTN_NO_OPENMP=1 is the only way to build without OpenMP; otherwise a compiler without it
stops the build with a message saying what to install.
"""
import os
import sys

from ._probe import compiler, run_c

FLAGS = {  # compiler family -> (compile args, link args)
    "gcc": (["-fopenmp"], ["-fopenmp"]),
    "clang": (["-fopenmp"], ["-fopenmp"]),
    "msvc": (["/openmp"], []),
}

PROBE = r"""
#include <omp.h>
#include <stdio.h>
int main(void) {
    int n = 0;
    #pragma omp parallel num_threads(2) reduction(+:n)
    n += 1;
    printf("%d\n", n);
    return 0;
}
"""


def _family():
    cc = compiler()
    if cc.compiler_type == "msvc":
        return "msvc"
    exe = " ".join(getattr(cc, "compiler", []) or ["cc"])
    return "clang" if "clang" in exe else "gcc"


def configure():
    if os.environ.get("FASTATTN_NO_OPENMP", "") == "1":
        print("fastattn: building WITHOUT OpenMP (FASTATTN_NO_OPENMP=1)", file=sys.stderr)
        # the kernels' `#pragma omp` lines are then inert by design, not a mistake to warn of
        return {"compile_args": ["-Wno-unknown-pragmas"], "link_args": [], "define_macros": []}
    cargs, largs = FLAGS[_family()]
    ok, out, err = run_c(PROBE, compile_args=cargs, link_args=largs)
    if not ok or out.strip() != "2":
        raise SystemExit(
            "fastattn: the C compiler cannot build and run an OpenMP program "
            f"(flags {cargs}).\n{err}\n"
            "Install OpenMP support (gcc: it is built in; clang: install libomp-dev), "
            "or set FASTATTN_NO_OPENMP=1 to build a single-threaded fastattn."
        )
    return {"compile_args": cargs, "link_args": largs, "define_macros": [("FA_HAVE_OPENMP", "1")]}
