"""The ``fastattn`` command.

    fastattn info                         build and runtime facts (compiler, OpenMP, BLAS, SIMD)
    fastattn bench [--threads N] [--repeat N] [--case NAME ...] [--json PATH] [--quick] [--list]
                                          ops vs the NumPy twin vs torch, as a Markdown table,
                                          then the performance targets (PASS / MISS)
    fastattn demo                         a few-second causal attention: ops vs reference

Also runnable as ``python -m fastattn.cli``. Exit status: 0 on success, 2 on a usage error.
"""
import argparse
import json
import sys
import time

import numpy as np


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help text may be finished only when it is shown
    (``finish_help()`` runs then): the bench command's help names the harness's cases and
    defaults, and the harness is imported only for that help or the command itself, so
    ``fastattn info`` and ``fastattn demo`` import neither it nor torch."""

    finish_help = None

    def format_help(self):
        if self.finish_help is not None:
            self.finish_help()
        return super().format_help()


def _bench_help(repeat, cases):
    """Fill in the help of the bench options `repeat` and `cases` (argparse Actions) from the
    harness: its default counts and its cases."""
    from . import bench

    repeat.help = (f"timed calls per implementation (default {bench.DEFAULT_REPEAT}, "
                   f"{bench.QUICK_REPEAT} with --quick); the NumPy twin gets "
                   f"{bench.DEFAULT_NUMPY_REPEAT} ({bench.QUICK_NUMPY_REPEAT} with --quick)")
    also = " ".join(c for c in bench.CASES if c not in bench.DEFAULT_CASES)
    cases.help = f"cases to run (default: {' '.join(bench.DEFAULT_CASES)}); also: {also}"


def _parser():
    parser = _Parser(
        prog="fastattn", description="Fast CPU Transformer kernels: build facts, benchmarks, demo.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=_Parser)

    sub.add_parser("info", help="print compiler, OpenMP, BLAS, SIMD level and threads",
                   description="Print fastattn.build_info() as 'key: value' lines.")

    b = sub.add_parser("bench", help="benchmark ops vs the NumPy twin vs torch",
                       description="Time fastattn.ops against fastattn.reference (NumPy) and "
                                   "torch, interleaved, and print a Markdown table of medians "
                                   "followed by the performance targets.")
    b.add_argument("--threads", type=_positive_int, metavar="N",
                   help="threads for fastattn, torch and NumPy's BLAS (default: fastattn's "
                        "current count, i.e. OMP_NUM_THREADS or all CPUs)")
    repeat = b.add_argument("--repeat", type=_positive_int, metavar="N",
                            help="timed calls per implementation")
    # Case names are checked by the command (_bench), not by choices=: the parser does not
    # import the harness.
    cases = b.add_argument("--case", dest="cases", action="extend", nargs="+", metavar="NAME",
                           help="cases to run")
    b.add_argument("--json", metavar="PATH", help="also write rows and targets as JSON to PATH")
    b.add_argument("--quick", action="store_true", help="fewer repeats (a rough look)")
    b.add_argument("--list", action="store_true", help="list the cases and exit")
    b.set_defaults(subparser=b)
    b.finish_help = lambda: _bench_help(repeat, cases)

    sub.add_parser("demo", help="causal attention with ops and with the NumPy reference",
                   description="A few-second demonstration: causal attention on a small random "
                               "problem with fastattn.ops and fastattn.reference; prints the "
                               "largest difference and the time of each.")
    return parser


def _info(args):
    import fastattn

    info = fastattn.build_info()
    width = max(map(len, info))
    for key, value in info.items():
        if isinstance(value, (list, tuple)):
            value = ", ".join(map(str, value))
        elif isinstance(value, bool):
            value = "yes" if value else "no"
        print(f"{key + ':':{width + 1}} {value}")
    return 0


def _bench(args):
    import os

    from . import bench

    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        args.subparser.error(f"argument --json: no such directory for {args.json!r}")  # exit 2
    unknown = [c for c in args.cases or () if c not in bench.CASES]
    if unknown:  # as argparse words an invalid choice; exit 2
        args.subparser.error(f"argument --case: invalid choice: {unknown[0]!r} (choose from "
                             f"{', '.join(map(repr, bench.CASES))})")

    if args.list:
        for name, case in bench.CASES.items():
            extra = "" if name in bench.DEFAULT_CASES else "  (not run by default)"
            print(f"{name:18} {case.title}{extra}")
        return 0
    repeat = args.repeat or (bench.QUICK_REPEAT if args.quick else bench.DEFAULT_REPEAT)
    numpy_repeat = bench.QUICK_NUMPY_REPEAT if args.quick else bench.DEFAULT_NUMPY_REPEAT
    started = time.perf_counter()
    rows = bench.run(args.cases, repeat=repeat, threads=args.threads,
                     numpy_repeat=numpy_repeat,
                     progress=lambda name: print(f"running {name} ...", file=sys.stderr,
                                                 flush=True))
    elapsed = time.perf_counter() - started
    targets = bench.check_targets(rows)
    print(bench.describe_environment(rows[0]["threads"] if rows else None))
    print(f"medians of {repeat} interleaved calls (NumPy twin: {min(numpy_repeat, repeat)}); "
          f"speedup = other's time / fastattn's time")
    print()
    print(bench.format_table(rows))
    lines = bench.format_targets(targets)
    if lines:
        print()
        print("targets:")
        print(lines)
    print()
    print(f"bench took {elapsed:.1f} s")
    if args.json:
        import fastattn

        payload = {"environment": fastattn.build_info(), "torch": bench.torch_version(),
                   "numpy": np.__version__, "repeat": repeat, "numpy_repeat": numpy_repeat,
                   "elapsed_s": elapsed, "rows": rows, "targets": targets}
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=2)
            f.write("\n")
    return 0


def _demo(args):
    import fastattn
    from fastattn import ops, reference

    B, H, L, D = 2, 4, 256, 64
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, L, D), dtype=np.float32) for _ in range(3))

    def best_of(fn, n):
        out, best = None, float("inf")
        for _ in range(n):
            t0 = time.perf_counter()
            out = fn()
            best = min(best, time.perf_counter() - t0)
        return out, best * 1e3

    fast, fast_ms = best_of(lambda: ops.attention(q, k, v, causal=True), 5)
    ref, ref_ms = best_of(lambda: reference.attention(q, k, v, causal=True), 2)
    diff = float(np.max(np.abs(fast.astype(np.float64) - ref)))
    print(f"causal attention, q k v of shape (B, H, L, D) = ({B}, {H}, {L}, {D}), float32, "
          f"{fastattn.get_num_threads()} threads, simd {fastattn.build_info()['simd']}")
    print(f"  fastattn.ops.attention        {fast_ms:9.3f} ms   (C + OpenMP, tiled)")
    print(f"  fastattn.reference.attention  {ref_ms:9.3f} ms   (NumPy, float64)")
    print(f"  speedup                       {ref_ms / fast_ms:9.1f}x")
    print(f"  max |ops - reference|         {diff:9.2e}")
    return 0


def main(argv=None):
    """Entry point of the ``fastattn`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    return {"info": _info, "bench": _bench, "demo": _demo}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
