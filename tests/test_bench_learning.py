"""The learning case's fastattn side trains as ``fastattn train`` does, without the harness
importing the command's module: the same call of train_run (pairs, run directory, settings,
progress) as the command line LearningSetup.train_args, and one tiny run end to end.

Exact match and timings are never asserted: they live in ``fastattn bench --case learning``.
"""
import inspect
import os

import pytest

from fastattn import cli
from fastattn.bench import learning
from fastattn.train import run as train_run_module


class _Stop(Exception):
    """Raised by the recording train_run: the call is all the test needs."""


@pytest.fixture
def train_calls(monkeypatch):
    """train_run replaced by one that records its call, bound to the real signature with its
    defaults (so that an argument left out and the same default given compare equal), and
    stops there."""
    signature = inspect.signature(train_run_module.train_run)
    calls = []

    def record(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        arguments["pairs"] = list(arguments["pairs"])
        calls.append(arguments)
        raise _Stop

    monkeypatch.setattr(train_run_module, "train_run", record)
    return calls


def test_learning_trains_with_the_settings_of_fastattn_train(tmp_path, train_calls):
    setup = learning.LearningSetup("sort", 3, n_train=40, n_test=5, steps=7, lr=3e-4)
    with pytest.raises(_Stop):
        learning.fastattn_learning(setup, str(tmp_path))
    tsv, out = str(tmp_path / "train.tsv"), str(tmp_path / "run")
    with pytest.raises(_Stop):
        cli.main(setup.train_args(tsv, out))
    harness, command = train_calls
    assert [tuple(p) for p in harness["pairs"]] == setup.train
    assert {k: (type(v), v) for k, v in harness.items()} == \
        {k: (type(v), v) for k, v in command.items()}
    assert harness["out"] == out and harness["data"] == tsv
    assert harness["progress"] == "json" and harness["tokenizer"] == "word"
    assert (harness["steps"], harness["lr"], harness["seed"]) == (7, 3e-4, 3)


def test_train_args_are_the_setups_settings():
    setup = learning.LearningSetup()
    args = cli._parser().parse_args(setup.train_args("pairs.tsv", "run"))
    for name, value in setup.train_settings().items():
        assert getattr(args, name) == value, name
    assert args.quiet and args.data == "pairs.tsv" and args.out == "run"


def test_learning_runs_end_to_end_on_a_tiny_budget(tmp_path):
    setup = learning.LearningSetup("reverse", 0, n_train=60, n_test=4, steps=3,
                                   batch_tokens=512)
    result = learning.fastattn_learning(setup, str(tmp_path))
    assert 0.0 <= result["exact"] <= 1.0 and result["seconds"] > 0
    assert os.path.isfile(os.path.join(result["run_dir"], train_run_module.FILES["model"]))
