"""pytest configuration for the benchmarks: collect ``bench_*.py`` files.

The project's pytest settings collect only ``test_*.py`` under ``tests/``; this hook lets
``pytest benchmarks/ --benchmark-only`` pick up the ``bench_*.py`` modules here as well.
"""
import pytest


def pytest_collect_file(file_path, parent):
    if file_path.suffix != ".py" or not file_path.name.startswith("bench_"):
        return None
    if parent.session.isinitpath(file_path):
        return None  # named on the command line: pytest's own collector already takes it
    return pytest.Module.from_parent(parent, path=file_path)
