"""Which kernels fastattn's OpenBLAS (scipy-openblas32) loads with.

OpenBLAS picks its kernels once, when the library loads; the OPENBLAS_CORETYPE environment
variable overrides the pick. On AMD Zen 4 (family 19h with AVX-512) OpenBLAS picks SkylakeX,
whose 512-bit kernels Zen 4 runs as two 256-bit halves. Its Haswell kernels run every GEMM
fastattn makes faster there (the FFN, the linear backward and the Transformer-base forward;
the kernels are fixed when OpenBLAS loads, so such a comparison takes one process per choice,
and the figures are in benchmarks/results/past-measurements.md).

So on Zen 4, unless OPENBLAS_CORETYPE is set, fastattn loads its OpenBLAS with
OPENBLAS_CORETYPE=Haswell and then takes the variable out of the environment again: child
processes, and libraries loaded later (NumPy's own OpenBLAS included), see the environment as
it was. Anywhere else OpenBLAS keeps its own pick. Set OPENBLAS_CORETYPE yourself (SkylakeX,
say) to choose the kernels. build_info()["blas_core"] names the kernels in use and
build_info()["blas_core_choice"] who chose them.

Nothing here imports NumPy or the kernels: it runs before either loads an OpenBLAS.
"""
import contextlib
import os
import sys

ENV = "OPENBLAS_CORETYPE"
# CPU (as cpu_name() names it) -> the OpenBLAS kernels fastattn loads on it
PREFERRED = {"AMD Zen 4": "Haswell"}

# who chose the kernels loaded: "OPENBLAS_CORETYPE" (the user), "fastattn (<cpu>)" or "OpenBLAS"
choice = "OpenBLAS"


def _fields(cpuinfo):
    """The first processor's fields of /proc/cpuinfo text, as {key: value}."""
    fields = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_name(cpuinfo):
    """"AMD Zen 4" for an AMD family 19h CPU with AVX-512 (Zen 3, the same family, has none;
    Zen 5 is family 1Ah), else None. cpuinfo: the text of /proc/cpuinfo."""
    f = _fields(cpuinfo)
    if f.get("vendor_id") != "AuthenticAMD" or f.get("cpu family") != "25":
        return None
    return "AMD Zen 4" if "avx512f" in f.get("flags", "").split() else None


def _read_cpuinfo():
    """The first processor's block of /proc/cpuinfo (the rest can be long: one per CPU); "" where
    there is none (not Linux: OpenBLAS keeps its own pick)."""
    lines = []
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if not line.strip() and lines:
                    break
                lines.append(line)
    except OSError:
        return ""
    return "".join(lines)


def preferred_core(cpuinfo, environ):
    """(core, choice) for loading OpenBLAS: core is the OPENBLAS_CORETYPE fastattn sets (None:
    leave the environment alone), choice who chooses (see `choice`)."""
    if environ.get(ENV):
        return None, ENV
    cpu = cpu_name(cpuinfo)
    if cpu in PREFERRED:
        return PREFERRED[cpu], f"fastattn ({cpu})"
    return None, "OpenBLAS"


@contextlib.contextmanager
def loading_openblas():
    """Around the first load of scipy-openblas32: OPENBLAS_CORETYPE set to the preferred core
    (see the module's note) while it loads, the environment restored after. A no-op when that
    library is already loaded (its kernels are chosen) or the user set the variable."""
    global choice
    if "scipy_openblas32" in sys.modules:
        core, choice = None, ENV if os.environ.get(ENV) else "OpenBLAS"
    else:
        core, choice = preferred_core(_read_cpuinfo(), os.environ)
    before = os.environ.get(ENV)                       # None, or set but empty
    if core is not None:
        os.environ[ENV] = core
    try:
        yield
    finally:
        if core is not None:
            if before is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = before
