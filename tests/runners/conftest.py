"""Fixtures of the runner tests: one small trained run for the whole session, one thread.

The runs and engines here use one fastattn thread: on a shared 2-core machine a two-thread
team waiting on a busy core made the tiny model's batches many times slower, and the
outputs do not depend on the thread count (tests/test_threads.py)."""
import pytest

import fastattn
from runner_util import train_tiny_run


@pytest.fixture(scope="session")
def run(tmp_path_factory):
    """The loaded trained run (fastattn.train.run.Run); its directory is run.path."""
    before = fastattn.get_num_threads()
    fastattn.set_num_threads(1)
    try:
        return train_tiny_run(tmp_path_factory.mktemp("runners") / "run")
    finally:
        fastattn.set_num_threads(before)


@pytest.fixture(scope="session")
def run_dir(run):
    return run.path


@pytest.fixture(autouse=True)
def single_thread():
    before = fastattn.get_num_threads()
    fastattn.set_num_threads(1)
    yield
    fastattn.set_num_threads(before)
