"""Process-wide runtime state: SIMD level (chosen once at import), thread count, build_info().

The thread count is resolved here once and passed to every kernel call; kernels never read the
environment. OMP_NUM_THREADS is honoured at import; set_num_threads() changes it later.

One thread pool: every kernel, the float32 GEMM engine included, runs on fastattn's own OpenMP
threads; there is no second pool (no BLAS library) to keep in step with it. The count is passed
to each call, so kernels may run from several Python threads at once.
"""
import os
import warnings

import numpy as np

from . import _kernels

ISA_NAMES = ("generic", "avx2", "avx512")  # index = fa_isa_t in csrc/fa_common.h
TILE_NAMES = (  # index = fa_tile_t in csrc/fastattn.h; the sizes themselves: csrc/fa_tiles.h
    "vector_width", "attention_block_q", "attention_block_k", "attention_rows_max_q",
    "attention_backward_block_q",
    "softmax_chunk", "packed_panel", "packed_tile_rows", "packed_tile_features",
    "row_block", "feature_align",
    "reduce_rows",
)
# index = fa_int8_path_t (fastattn.h); amx is the default where the CPU has the tiles and Linux
# grants them, products of fewer than 16 rows then on avx512vnni-quads (VNNI on the tiles'
# layout); amx-emulated is the same tile code emulated, for testing it on CPUs without AMX
INT8_PATHS = ("generic", "avx2", "avx512bw", "avx512vnni", "amx", "amx-emulated",
              "avx512vnni-quads")
# bf16 attention's code paths (csrc/fastattn.h, fa_attention_bf16_path): bf16 rounded, widened
# to float32 and multiplied with FMA (every level); vdpbf16ps in both passes (avx512 level,
# AVX512_BF16 CPU); vdpbf16ps in the decode steps' one-row pass only (the default on CPUs with
# AMX, whose vdpbf16ps is slower than their FMA in the tiles); the AMX tiles in the many-query
# pass (the default on CPUs with AMX-BF16 where Linux grants them, decode steps as
# avx512bf16-decode) and their emulation (tests)
ATTENTION_BF16_PATHS = ("fma", "avx512bf16", "avx512bf16-decode", "amx", "amx-emulated")
# index = fa_bf16_path_t (fastattn.h): the bfloat16 compute type's kernels, FMA tiles on rounded
# inputs (any level) or vdpbf16ps (AVX-512 level on a CPU with AVX512_BF16; the default there
# when faster), or the AMX tiles (the default on a CPU with AMX-BF16 where Linux grants them,
# for 3 rows or more; another summation order, reference._linear_bfloat16(order="amx")) and
# their emulation (tests)
BF16_PATHS = ("fma", "avx512bf16", "amx", "amx-emulated")
_state = {"threads": 1}


def _cpu_count():
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


HARD_MAX_THREADS = 1024


def _max_threads():
    """The most threads set_num_threads() accepts: 1024, or the CPUs available if more.

    More threads than CPUs only oversubscribe; the bound keeps a typo (or OMP_NUM_THREADS set to
    2**31 - 1) from asking OpenMP for a team it cannot allocate, which ends the process."""
    return max(HARD_MAX_THREADS, _cpu_count())


def _resolve_threads(n):
    """sklearn semantics: None = all CPUs, -1 = all, -2 = all but one, ...; 0 is an error."""
    if n is None:
        return _cpu_count()
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"set_num_threads: n must be an int or None, got {type(n).__name__}")
    if n == 0:
        raise ValueError("set_num_threads: n must be non-zero (None or -1 = all CPUs)")
    if n < 0:
        if _cpu_count() + 1 + n < 1:
            raise ValueError(f"set_num_threads: n={n} leaves no thread on {_cpu_count()} CPUs")
        return _cpu_count() + 1 + n
    if n > _max_threads():
        raise ValueError(f"set_num_threads: n={n} is above the maximum of {_max_threads()} "
                         f"threads (1024, or the CPUs available if more; this process has "
                         f"{_cpu_count()} CPUs)")
    return n


def set_num_threads(n=None):
    """Set the number of threads fastattn's kernels use.

    One OpenMP pool: the GEMM engine shares its tasks among the same threads. `OMP_NUM_THREADS`
    above the bound is clamped to it at import, with a RuntimeWarning. OpenMP may still start
    fewer threads than asked (`OMP_THREAD_LIMIT`, `OMP_DYNAMIC`): the kernels split their work
    over the threads actually started.

    In a process forked (`os.fork`, multiprocessing's "fork" start method) after the kernels had
    run on several threads, the kernels run on one thread and a count above 1 is a RuntimeError:
    GNU OpenMP cannot start threads there. Use the "spawn" or "forkserver" start method.

    Args:
        n: a positive count, at most 1024 (or the number of CPUs available, if that is
            larger). None (the default) or -1: all CPUs available; -2: all but one, and so on.

    Returns:
        The resolved count.

    Raises:
        TypeError: `n` is not an int or None.
        ValueError: `n` is 0, above the bound, or leaves no thread.
        RuntimeError: `n` asks for more than one thread in a child forked after the kernels
            had run on several threads.
    """
    count = _resolve_threads(n)
    if count > 1 and _kernels.forked_after_team():
        raise RuntimeError(
            f"set_num_threads: n={n} asks for {count} threads, but this process was forked "
            f"after fastattn's kernels had run on several OpenMP threads, and GNU OpenMP "
            f"(libgomp) cannot start threads in such a child (it would wait for them forever): "
            f"its kernels run on one thread. For multi-threaded workers use the 'spawn' or "
            f"'forkserver' start method (multiprocessing.get_context('spawn')), or fork before "
            f"the first kernel call")
    _state["threads"] = count
    return count


def _after_fork_in_child():
    """A child forked after the kernels ran a team runs them on one thread (csrc/cpu.c's fork
    handler already made the C side do so): say so in get_num_threads() and build_info()."""
    if _kernels.forked_after_team():
        _state["threads"] = 1


os.register_at_fork(after_in_child=_after_fork_in_child)


def get_num_threads():
    """The number of threads the kernels use.

    Returns:
        What `set_num_threads` set, else `OMP_NUM_THREADS` as read at import, else all
            CPUs (1 in a process forked after the kernels had run on several threads).
    """
    return _state["threads"]


def _forced_from_env(var, names, supports, cannot, available):
    """The index in `names` of the code path environment variable `var` forces, or -1 when
    unset. An unknown name is a ValueError; one that `supports(index)` refuses a RuntimeError
    saying who `cannot` run it and what is `available` (a callable)."""
    name = os.environ.get(var, "").strip().lower()
    if not name:
        return -1
    if name not in names:
        raise ValueError(f"{var}={name!r}: expected one of {', '.join(names)}")
    index = names.index(name)
    if not supports(index):
        raise RuntimeError(f"{var}={name}: {cannot} cannot run it "
                           f"(available: {', '.join(available())})")
    return index


def available_attention_bf16_paths():
    """bf16 attention's code paths this CPU, this build and the SIMD level in use can run."""
    return [name for i, name in enumerate(ATTENTION_BF16_PATHS)
            if _kernels.attention_bf16_supports(i)]
def available_bf16_paths():
    """bfloat16 compute paths this CPU, this build and the SIMD level in use can run."""
    return [name for i, name in enumerate(BF16_PATHS) if _kernels.bfloat16_supports(i)]


def available_int8_paths():
    """int8 code paths this CPU, this build and the SIMD level in use can run, lowest first."""
    return [name for i, name in enumerate(INT8_PATHS) if _kernels.int8_supports(i)]


def amx_info():
    """AMX: whether the CPU has AMX-INT8 / AMX-BF16, the OS enables tile state (XCR0), Linux
    granted this process tile data (ARCH_REQ_XCOMP_PERM: asked for only when
    FASTATTN_INT8_PATH=amx, as a grant makes the kernel refuse small signal stacks for the
    whole process), and whether the int8 and bf16 kernels use the tiles (only when forced)."""
    st = _kernels.amx_status()
    return {"int8": bool(st & 1), "bf16": bool(st & 2), "os_enabled": bool(st & 4),
            "permitted": bool(st & 8), "used": INT8_PATHS[_kernels.int8_path()] == "amx"}


QUANT_TILE_NAMES = ("int8_panel", "int8_group", "int8_tile_rows", "int8_row_block",
                    "int8_min_rows_per_thread", "bf16_panel", "bf16_packed_max_rows", "bfloat16_panel")


def quant_tiles():
    """The quantised kernels' sizes (csrc/quant.c) for the int8 path in use, as {name: int}."""
    return dict(zip(QUANT_TILE_NAMES, _kernels.quant_tiles()))


def gemm_info(isa=None):
    """The float32 GEMM engine's blocking at SIMD level `isa` (None = the level in use): the
    cache sizes it read (l1, l2, l3, bytes), its K block (k_block: the K values each pass of a
    register tile takes), its panel (features per packed panel) and register tile (tile_rows x
    tile_features); see csrc/gemm.c and docs/gemm.md."""
    level = _kernels.cpu_level() if isa is None else ISA_NAMES.index(isa)
    l1, l2, l3, kb = _kernels.gemm_info(level)
    t = tiles(ISA_NAMES[level])
    return {"l1": l1, "l2": l2, "l3": l3, "k_block": kb, "panel": t["packed_panel"],
            "tile_rows": t["packed_tile_rows"], "tile_features": t["packed_tile_features"]}


def available_isas():
    """ISA levels this CPU and this build can run, lowest first."""
    return [name for i, name in enumerate(ISA_NAMES) if _kernels.cpu_supports(i)]


def _threads_from_env():
    """OMP_NUM_THREADS (its first, outermost level) at import: a positive count, clamped with a
    RuntimeWarning to _max_threads(); anything else (unset, 0, not a number) means all CPUs."""
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if not (env.isdigit() and int(env) > 0):
        return None
    if int(env) > _max_threads():
        warnings.warn(f"fastattn: OMP_NUM_THREADS={env} is above the maximum of "
                      f"{_max_threads()} threads; using {_max_threads()}", RuntimeWarning,
                      stacklevel=2)
        return _max_threads()
    return int(env)


def tiles(isa=None):
    """Tile sizes and few-row thresholds of the kernels at SIMD level `isa` (a name from
    ISA_NAMES; None = the level in use), as {name: int}; see csrc/fa_tiles.h and fastattn.h."""
    level = _kernels.cpu_level() if isa is None else ISA_NAMES.index(isa)
    if _kernels.tile_count() != len(TILE_NAMES):
        raise RuntimeError("fastattn: _kernels and _runtime disagree on the tile table; rebuild")
    out = np.zeros(len(TILE_NAMES), np.int64)
    if _kernels.build_tiles(level, out) != 0:
        raise ValueError(f"tiles: this build has no {ISA_NAMES[level]} level")
    return {name: int(size) for name, size in zip(TILE_NAMES, out)}


def _paths():
    """Every code path csrc/paths.c chooses at import, in the order it chooses them (each later
    one at most the SIMD level chosen first): (environment variable that forces it, its names,
    supports(index), init(forced index or -1) -> 0 or -2 when Linux refused the AMX tiles a
    forced amx needs, available() names, what a refusal leaves)."""
    def level():
        return f"this CPU, this build or the SIMD level in use ({ISA_NAMES[_kernels.cpu_level()]})"
    return (
        ("FASTATTN_CPU_ISA", ISA_NAMES, _kernels.cpu_supports, _kernels.cpu_init,
         available_isas, lambda: "this CPU or this build", ""),
        ("FASTATTN_ATTENTION_BF16_PATH", ATTENTION_BF16_PATHS, _kernels.attention_bf16_supports,
         _kernels.attention_bf16_init, available_attention_bf16_paths, level, ""),
        ("FASTATTN_INT8_PATH", INT8_PATHS, _kernels.int8_supports, _kernels.int8_init,
         available_int8_paths, level, " to use the VNNI path"),
        ("FASTATTN_BF16_PATH", BF16_PATHS, _kernels.bfloat16_supports, _kernels.bfloat16_init,
         available_bf16_paths, level, ""),
    )


def init():
    """Choose every code path (one pass over _paths: the environment, then csrc/paths.c, which
    asks the CPU and the OS), then the thread count."""
    for var, names, supports, choose, available, cannot, instead in _paths():
        if choose(_forced_from_env(var, names, supports, cannot(), available)) == -2:
            raise RuntimeError(f"{var}=amx: Linux refused this process the AMX tile data "
                               f"(arch_prctl ARCH_REQ_XCOMP_PERM); unset it{instead}")
    set_num_threads(_threads_from_env())


def build_info():
    """What this build and this process run with.

    Returns:
        A dict: the compiler, whether OpenMP is on, the SIMD level chosen and those available,
            the int8 / bf16 paths, the GEMM engine's blocking and tiles, the threads, and the
            build's knobs (debug, native, sanitize).
    """
    return {
        "version": "0.1.0",
        "compiler": _kernels.build_compiler(),
        "openmp": bool(_kernels.openmp_enabled()),
        "native_build": bool(_kernels.build_native()),
        "debug_build": bool(_kernels.build_debug()),         # FASTATTN_DEBUG=1
        "sanitize_build": bool(_kernels.build_sanitize()),   # FASTATTN_SANITIZE=1
        "simd": ISA_NAMES[_kernels.cpu_level()],
        "simd_available": available_isas(),
        "int8_path": INT8_PATHS[_kernels.int8_path()],     # FASTATTN_INT8_PATH
        # a decode step's rows (fewer than 16): a default amx hands them to avx512vnni-quads
        "int8_path_few_rows": INT8_PATHS[_kernels.int8_path_rows(1)],
        "int8_paths_available": available_int8_paths(),
        # FASTATTN_ATTENTION_BF16_PATH
        "attention_bf16_path": ATTENTION_BF16_PATHS[_kernels.attention_bf16_path()],
        "attention_bf16_paths_available": available_attention_bf16_paths(),
        # compute_type="bfloat16": the CPU's bf16 dot products and the path its GEMMs run
        "bf16_dot_products": {"avx512_bf16": bool(_kernels.bfloat16_cpu_has_avx512bf16()),
                              "amx_bf16": bool(_kernels.amx_status() & 2)},
        "bf16_path": BF16_PATHS[_kernels.bfloat16_path()],  # FASTATTN_BF16_PATH
        # a decode step's rows (fewer than 3): a default amx hands them to a vector path
        "bf16_path_few_rows": BF16_PATHS[_kernels.bfloat16_path_rows(1)],
        "bf16_paths_available": available_bf16_paths(),
        "amx": amx_info(),
        "quant_tiles": quant_tiles(),                      # of the int8 path in use
        "tiles": tiles(),                                  # at the level in use ("simd")
        "gemm": gemm_info(),                               # the float32 engine's blocking
        "tiles_by_isa": {name: tiles(name) for name in available_isas()},
        "threads": get_num_threads() if _kernels.openmp_enabled() else 1,  # effective
        "max_threads": _max_threads(),   # the most set_num_threads() accepts
    }
