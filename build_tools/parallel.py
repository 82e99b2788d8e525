"""Compile the extension's C sources side by side: setuptools compiles the sources of one
extension one after another, and this project is one extension of some twenty files (a build
on a 2-core machine took twice as long as it needed to).

FASTATTN_BUILD_JOBS=N sets how many compile at once (default: the CPUs this process may use;
1: one after another, as setuptools does).
"""
import os
from concurrent.futures import ThreadPoolExecutor

from setuptools.command.build_ext import build_ext


def _jobs():
    value = os.environ.get("FASTATTN_BUILD_JOBS", "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise SystemExit(f"FASTATTN_BUILD_JOBS must be a whole number >= 1, got {value!r}")
        return int(value)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class BuildExt(build_ext):
    """build_ext whose compiler compiles an extension's sources in a pool of threads (each one
    a compiler process); the objects and their order are those of the serial build."""

    def build_extension(self, ext):
        jobs = _jobs()
        cc = self.compiler
        if jobs > 1 and hasattr(cc, "_setup_compile") and hasattr(cc, "_compile"):
            cc.compile = _parallel_compile(cc, jobs)
        return super().build_extension(ext)


def _parallel_compile(cc, jobs):
    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                extra_preargs=None, extra_postargs=None, depends=None):
        # as distutils' CCompiler.compile, the loop over the objects in a pool
        macros, objects, extra_postargs, pp_opts, build = cc._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = cc._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj):
            if obj in build:
                src, ext = build[obj]
                cc._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(min(jobs, max(1, len(objects)))) as pool:
            for _ in pool.map(one, objects):  # re-raises the first failure
                pass
        return objects
    return compile
