"""The runtime never imports the benchmark harness (fastattn.bench) or torch.

Each check runs in a fresh interpreter (this test process has imported both by now) and lists
the modules of interest left in sys.modules afterwards.
"""
import pytest

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
