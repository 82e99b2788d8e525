"""The runtime never imports the benchmark harness (fastattn.bench) or torch, and the harness
and the command sit in layers: the CLI imports the harness (for ``fastattn bench``), the harness
never imports the CLI, and neither is on an import cycle.

The loading checks run in a fresh interpreter (this test process has imported both by now) and
list the modules of interest left in sys.modules afterwards. The layering checks read the static
import graph of the source (tests/import_graph.py: every import, lazy ones inside functions
included), so an import that only runs on some path is caught too.
"""
import textwrap

import pytest

import import_graph
from conftest import modules_loaded_by


def modules_after(code):
    """The harness and torch modules `code` leaves loaded in a fresh interpreter."""
    return modules_loaded_by(code, "torch", "fastattn.bench")


def test_import_fastattn_loads_neither_the_harness_nor_torch():
    assert modules_after("import fastattn; fastattn.build_info()") == []


@pytest.mark.parametrize("module", ["fastattn.nn", "fastattn.generate", "fastattn.io",
                                    "fastattn.tokenizers", "fastattn.ops", "fastattn.reference",
                                    "fastattn.cli"])
def test_runtime_modules_load_neither_the_harness_nor_torch(module):
    assert modules_after(f"import {module}") == []


def test_generate_with_a_model_loads_neither():
    assert modules_after("""
        import numpy as np
        from fastattn import nn
        m = nn.Seq2SeqTransformer(1, 1, 16, 2, 11, 13, 24, seed=0)
        m.generate(np.ones((2, 3), np.int64), max_new_tokens=3, start_id=1, method="beam",
                   beam_size=2)
        """) == []


@pytest.mark.parametrize("command", [["info"], ["demo", "--quick", "--seconds", "1", "--quiet"]])
def test_cli_info_and_demo_load_neither(command, tmp_path):
    if command[0] == "demo":
        command = command + ["--out", str(tmp_path)]
    assert modules_after(f"""
        import contextlib, io
        from fastattn import cli
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli.main({command!r}) == 0
        """) == []


def test_the_check_sees_the_harness_when_it_is_loaded():
    """The listing itself works: the bench command does load the harness."""
    loaded = modules_after("""
        import contextlib, io
        from fastattn import cli
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli.main(["bench", "--list"]) == 0
        """)
    assert "fastattn.bench" in loaded and "fastattn.bench.cases" in loaded


# ---- layering, from the source ------------------------------------------------------------------

HARNESS, COMMAND = "fastattn.bench", "fastattn.cli"


@pytest.fixture(scope="module")
def graph():
    return import_graph.import_graph()


def test_the_harness_never_imports_the_command(graph):
    """fastattn.bench sits above the CLI's building blocks (train_run, the runners), not above
    the CLI: the learning case trains through train_run, not cli.main."""
    offenders = {m: sorted(t for t in targets if import_graph.involves([t], COMMAND))
                 for m, targets in graph.items() if import_graph.involves([m], HARNESS)}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_only_the_command_imports_the_harness(graph):
    importers = sorted(m for m, targets in graph.items()
                       if not import_graph.involves([m], HARNESS)
                       and any(import_graph.involves([t], HARNESS) for t in targets))
    assert importers == [COMMAND]


def test_no_import_cycle_holds_the_command_or_the_harness(graph):
    cycles = [" -> ".join(c) for c in import_graph.shortest_cycles(graph)
              if import_graph.involves(c, COMMAND, HARNESS)]
    assert cycles == []


def test_the_graph_sees_lazy_imports_and_their_cycles(graph, tmp_path):
    """The checks above are not vacuous: the CLI's lazy import of the harness (inside a
    function) is an edge, and a cycle closed by function-level relative imports is found."""
    assert HARNESS in graph[COMMAND]
    pkg = tmp_path / "fastattn"
    (pkg / "bench").mkdir(parents=True)
    files = {"__init__.py": "", "cli.py": "def main():\n    from . import bench\n",
             "bench/__init__.py": "from .learning import run\n",
             "bench/learning.py": "def run():\n    from .. import cli\n    import fastattn.cli\n"}
    for name, text in files.items():
        (pkg / name).write_text(textwrap.dedent(text))
    small = import_graph.import_graph(str(pkg))
    assert small["fastattn.bench.learning"] == {COMMAND}
    assert import_graph.components(small) == [
        ["fastattn.bench", "fastattn.bench.learning", "fastattn.cli"]]
    assert import_graph.shortest_cycles(small) == [
        ["fastattn.bench", "fastattn.bench.learning", "fastattn.cli", "fastattn.bench"]]


def test_no_import_cycle_at_all(graph):
    """No module of fastattn imports one that imports it back, directly or through others
    (the compiled binding is a leaf)."""
    assert [" -> ".join(c) for c in import_graph.shortest_cycles(graph)] == []
    assert graph["fastattn._kernels"] == set()


# What the twin may reach: the shared checks, the weight kinds (QuantizedWeight is one class
# for both twins) and what they stand on, the kernel calls and the binding, never the ops
# above it nor the model layer.
TWIN_BELOW = {"fastattn._checks", "fastattn.kinds", "fastattn._fast", "fastattn._kernels",
              "fastattn._runtime", "fastattn._convert"}


def reachable(graph, module):
    seen, todo = set(), [module]
    while todo:
        for t in graph.get(todo.pop(), ()):
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def test_the_twin_depends_on_nothing_above_it(graph):
    assert reachable(graph, "fastattn.reference") <= TWIN_BELOW
    assert "fastattn.reference" not in reachable(graph, "fastattn.kinds")
    assert not reachable(graph, "fastattn._fast") & {"fastattn.ops", "fastattn.reference",
                                                     "fastattn.kinds", "fastattn.quant"}
