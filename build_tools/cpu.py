"""Compiler flags and the per-ISA availability probe.

The build is portable: baseline x86-64 code plus hot kernel bodies compiled under
target("arch=x86-64-v3") and target("arch=x86-64-v4"), chosen at import. Each level is enabled only
if the compiler accepts that target attribute (compile + link + run of a probe). Knobs:
FASTATTN_DEBUG=1 (-O0 -g, Cython bounds checks), FASTATTN_SANITIZE=1 (ASan + UBSan, -O1, Cython
bounds checks; see sanitize.py), FASTATTN_WERROR=1, FASTATTN_NATIVE=1 (local benchmarking only:
adds -march=native). build_info() reports debug, sanitize and native builds.
"""
import os
import platform

from . import sanitize
from ._probe import run_c

BASE = ["-std=c11", "-ffp-contract=fast", "-fno-math-errno", "-fno-trapping-math",
        "-fvisibility=hidden",
        "-Wall", "-Wextra", "-Wno-unused-function", "-Wno-unused-parameter"]

ISA_PROBE = r"""
#include <stdio.h>
__attribute__((target("arch=%s"))) static float dot(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
int main(void) {
    float a[16], b[16];
    for (int i = 0; i < 16; i++) { a[i] = 1.0f; b[i] = 2.0f; }
    if (__builtin_cpu_supports("%s")) printf("%%g\n", dot(a, b, 16)); else printf("32\n");
    return 0;
}
"""


# AMX: compile + link only (the probe runs the tile code only if asked; no CPU here need have it)
AMX_PROBE = r"""
#include <immintrin.h>
#include <stdio.h>
#include <string.h>
__attribute__((target("amx-tile,amx-int8,amx-bf16"))) static void tiles(const void *cfg,
                                                                          void *c, const void *a,
                                                                          const void *b) {
    _tile_loadconfig(cfg);
    _tile_zero(0);
    _tile_loadd(1, a, 64);
    _tile_loadd(2, b, 64);
    _tile_dpbssd(0, 1, 2);
    _tile_dpbusd(0, 1, 2);
    _tile_dpbf16ps(0, 1, 2);
    _tile_stored(0, c, 64);
    _tile_release();
}
int main(int argc, char **argv) {
    static unsigned char cfg[64], a[1024], b[1024], c[1024];
    (void)argv;
    if (argc > 99) tiles(cfg, c, a, b);
    memset(c, 0, sizeof c);
    printf("ok\n");
    return 0;
}
"""


def _env(name):
    return os.environ.get(name, "") == "1"


def configure():
    debug = _env("FASTATTN_DEBUG")
    opt = ["-O0", "-g"] if debug else ["-O1"] if sanitize.enabled() else ["-O3"]
    args = BASE + opt + sanitize.compile_args()
    link = sanitize.link_args()
    macros = []
    if _env("FASTATTN_WERROR"):
        args.append("-Werror")
    if _env("FASTATTN_NATIVE"):
        args.append("-march=native")
        macros.append(("FA_NATIVE_BUILD", "1"))
    if debug:
        macros.append(("FA_DEBUG_BUILD", "1"))
    if sanitize.enabled():
        macros.append(("FA_SANITIZE_BUILD", "1"))
    if platform.machine().lower() in ("x86_64", "amd64"):
        for level, macro in (("x86-64-v3", "FA_HAVE_V3"), ("x86-64-v4", "FA_HAVE_V4")):
            ok, out, _ = run_c(ISA_PROBE % (level, level), compile_args=["-O2"])
            if ok and out.strip() == "32":
                macros.append((macro, "1"))
        ok, out, _ = run_c(AMX_PROBE, compile_args=["-O2"])
        if ok and out.strip() == "ok" and ("FA_HAVE_V4", "1") in macros:   # AMX code is v4 code
            macros.append(("FA_HAVE_AMX", "1"))
    return {"compile_args": args, "link_args": link, "define_macros": macros,
            "boundscheck": debug or sanitize.enabled()}
