"""Compile + link + run a tiny C program with the compiler setuptools will use."""
import os
import subprocess
import tempfile

from setuptools._distutils.ccompiler import new_compiler
from setuptools._distutils.sysconfig import customize_compiler


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
            objs = cc.compile([src], output_dir=tmp, extra_postargs=list(compile_args),
                              include_dirs=list(include_dirs))
            exe = os.path.join(tmp, "probe")
            cc.link_executable(objs, exe, extra_postargs=list(link_args),
                               library_dirs=list(library_dirs), libraries=list(libraries))
            out = subprocess.run([exe], capture_output=True, text=True, timeout=60, env=env)
        except Exception as exc:  # CompileError, LinkError, timeouts: all mean "not usable"
            return False, "", str(exc)
        if out.returncode != 0:
            return False, out.stdout, out.stderr
        return True, out.stdout, ""
