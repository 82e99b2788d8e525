"""Compile + link + run a tiny C program with the compiler setuptools will use.

A probe is built the way the extension will be: the sanitizer flags (FASTATTN_SANITIZE=1) go to
its compile and link, and the user's CFLAGS and LDFLAGS to its link as well as its compile
(setuptools links the extension with both; its executable linker gets neither by itself).
"""
import os
import shlex
import subprocess
import tempfile

from setuptools._distutils.ccompiler import new_compiler
from setuptools._distutils.sysconfig import customize_compiler

from . import sanitize


def compiler():
    cc = new_compiler()
    customize_compiler(cc)
    return cc


def run_c(source, compile_args=(), link_args=(), include_dirs=(), library_dirs=(), libraries=(),
          env=None):
    """Return (ok, stdout, error text) for compiling, linking and running `source`."""
    cc = compiler()
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(source)
        try:
            objs = cc.compile([src], output_dir=tmp,
                              extra_postargs=list(compile_args) + sanitize.compile_args(),
                              include_dirs=list(include_dirs))
            exe = os.path.join(tmp, "probe")
            env_link = (shlex.split(os.environ.get("LDFLAGS", ""))
                        + shlex.split(os.environ.get("CFLAGS", "")))
            cc.link_executable(objs, exe,
                               extra_postargs=list(link_args) + env_link + sanitize.link_args(),
                               library_dirs=list(library_dirs), libraries=list(libraries))
            out = subprocess.run([exe], capture_output=True, text=True, timeout=60,
                                 env=env if env is not None else sanitize.probe_env())
        except Exception as exc:  # CompileError, LinkError, timeouts: all mean "not usable"
            return False, "", str(exc)
        if out.returncode != 0:
            return False, out.stdout, out.stderr
        return True, out.stdout, ""
