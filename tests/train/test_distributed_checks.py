"""What the ranks of a data-parallel run check of each other (fastattn.train.distributed).

At the start of fit(comm=...): the same model (config, parameters), precision, training
settings and data on every rank, or the same ValueError on every rank naming the first key
that differs and each rank's value. The watchdog: once it has said "ending every rank", the
job's exit status is not 0, even when the late rank arrives and the run could finish. More
threads than CPUs on a machine: one warning on rank 0. ``fastattn train`` under mpiexec:
an option given to one rank differently is refused on every rank, not overridden.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from fastattn.train import distributed
from test_distributed import LIMIT, MPIEXEC, WORKER, needs_mpi
from train_util import words

pytestmark = pytest.mark.usefixtures("single_thread")

TASKSET = shutil.which("taskset")
needs_taskset = pytest.mark.skipif(TASKSET is None or not hasattr(os, "sched_getaffinity"),
                                   reason="needs taskset and sched_getaffinity (Linux)")
# each rank's command ends by printing its own exit status, so a test sees every rank's
EACH_STATUS = ["sh", "-c", '"$@"; status=$?; echo "exit status $status" >&2; exit $status',
               "sh"]


def launch(*ranks, threads="1", cpus=None, timeout=LIMIT + 30):
    """mpiexec with one program per rank group (`ranks`: argument lists, joined by ':' as
    MPMD), OMP_NUM_THREADS=threads (None: unset), under taskset -c cpus when given."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    cmd = [TASKSET, "-c", cpus] if cpus is not None else []
    cmd.append(MPIEXEC)
    for i, args in enumerate(ranks):
        cmd += ([":"] if i else []) + list(args)
    t0 = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - t0


def worker(scenario, out, options):
    return ["-n", "2", sys.executable, WORKER, scenario, str(out), json.dumps(options)]


def cli(*args, n=1):
    return ["-n", str(n), *EACH_STATUS, sys.executable, "-m", "fastattn.cli", *args]


def pairs_file(tmp_path):
    data = tmp_path / "pairs.tsv"
    data.write_text("".join(f"{w}\t{w[::-1]}\n" for w in words(60, lo=2, hi=6)))
    return data


# ---- without MPI -------------------------------------------------------------------------------

def test_oversubscription_names_the_machine_the_numbers_and_the_fix():
    # (machine, CPUs the rank may run on, its threads), one row per rank
    assert distributed.oversubscription([("a", (0, 1), 1), ("a", (0, 1), 1)]) is None
    assert distributed.oversubscription([("a", (0, 1), 2), ("b", (0, 1), 2)]) is None
    text = distributed.oversubscription([("a", (0, 1), 2), ("a", (0, 1), 2)])
    assert "2 ranks on a" in text and "2 threads each" in text and "2 CPUs" in text
    assert "at most 1 thread" in text and "OMP_NUM_THREADS" in text
    text = distributed.oversubscription([("a", (0,), 1)] * 3)
    assert "3 ranks on a" in text and "1 CPU" in text and "fewer ranks: at most 1 on it" in text
    # a launcher that binds each rank to one CPU: 2 threads on it are too many
    text = distributed.oversubscription([("a", (0,), 2), ("a", (1,), 2)])
    assert text is not None and "2 CPUs" in text


def test_first_difference_names_the_key_and_each_ranks_value():
    same = {"activation": "relu", "emb_size": 32}
    assert distributed.first_difference([same, dict(same), dict(same)]) is None
    key, text = distributed.first_difference(
        [same, dict(same, emb_size=64), dict(same, activation="gelu", emb_size=64)])
    assert key == "activation"
    assert text == "ranks 0-1: 'relu'; rank 2: 'gelu'"
    key, text = distributed.first_difference([same, {"activation": "relu"}])
    assert key == "emb_size" and text == "rank 0: 32, rank 1: (none)"
    many = [same] * 5 + [dict(same, emb_size=16)] + [same] * 2
    assert distributed.first_difference(many)[1] == "ranks 0-4, 6-7: 32; rank 5: 16"


# ---- under mpiexec -----------------------------------------------------------------------------

@needs_mpi
@pytest.mark.parametrize("rank1, key, values", [
    (dict(model=dict(activation="gelu")), "activation", ("'relu'", "'gelu'")),
    (dict(dropout=0.3), "dropout", ("0.0", "0.3")),
    (dict(model=dict(emb_size=64)), "emb_size", ("32", "64")),
    (dict(model=dict(num_decoder_layers=2)), "num_decoder_layers", ("1", "2")),
    (dict(precision="bf16"), "precision", ("'fp32'", "'bf16'")),
    (dict(clip_norm=1.0), "clip_norm", ("0.5", "1.0")),
    (dict(lr=1e-3), "lr at step 1", ("0.003", "0.001")),
], ids=["activation", "dropout", "d_model", "layers", "precision", "clip_norm", "lr"])
def test_ranks_that_differ_raise_the_same_error_everywhere(tmp_path, rank1, key, values):
    done, seconds = launch(worker("fit", tmp_path, dict(rank1=rank1)))
    assert done.returncode != 0
    assert seconds < LIMIT
    errors = [(tmp_path / f"rank{r}.error").read_text() for r in (0, 1)]
    assert errors[0] == errors[1], errors                  # the same error on every rank
    assert errors[0].startswith("ValueError: fit: the ranks differ"), errors[0]
    assert f"{key}: rank 0: {values[0]}, rank 1: {values[1]}" in errors[0], errors[0]
    assert "MPIR_" not in done.stderr                      # not the MPI library's error
    assert not any(tmp_path.glob("rank*.npz"))             # no rank trained


@needs_mpi
def test_a_callable_schedule_is_compared_by_its_rates(tmp_path):
    # its repr holds an address, which differs between processes: the rates are compared
    ramp = dict(schedule=dict(ramp=1e-3), max_steps=2)
    done, _ = launch(worker("fit", tmp_path, ramp))
    assert done.returncode == 0, done.stderr
    other = tmp_path / "other"
    other.mkdir()
    done, _ = launch(worker("fit", other, dict(ramp, rank1=dict(schedule=dict(ramp=2e-3)))))
    assert done.returncode != 0
    assert "lr at step 1: rank 0: 0.001, rank 1: 0.002" in (other / "rank0.error").read_text()


@needs_mpi
def test_a_watchdog_that_fired_ends_the_job_with_a_failure_even_if_the_rank_arrives(tmp_path):
    # rank 1 arrives at the last step's all-reduce 1.5 s late, past the 1 s deadline, while
    # rank 0's watchdog is still saying so: the job must not then end with status 0
    done, seconds = launch(worker("stall", tmp_path, dict(stall=1.5, comm_timeout=1,
                                                          max_steps=3)))
    assert "waited more than 1 s" in done.stderr and "ending every rank" in done.stderr
    assert done.returncode != 0, done.stderr
    assert seconds < LIMIT
    assert not (tmp_path / "rank0.npz").exists()            # rank 0 ended with the message


@needs_mpi
@needs_taskset
def test_more_threads_than_cpus_is_one_warning_on_rank_0(tmp_path):
    done, _ = launch(worker("fit", tmp_path, dict(max_steps=1)), cpus="0")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("RuntimeWarning") == 1, done.stderr
    assert "2 ranks on" in done.stderr and "1 thread each" in done.stderr
    assert "1 CPU" in done.stderr and "fewer ranks" in done.stderr
    if len(os.sched_getaffinity(0)) >= 2:
        done, _ = launch(worker("fit", tmp_path, dict(max_steps=1)), cpus="0,1")
        assert done.returncode == 0, done.stderr
        assert "RuntimeWarning" not in done.stderr, done.stderr


@needs_mpi
@needs_taskset
def test_fastattn_train_warns_in_one_line_when_the_ranks_share_too_few_cpus(tmp_path):
    args = ["train", str(pairs_file(tmp_path)), "--out", str(tmp_path / "run"), "--model",
            "tiny", "--tokenizer", "char", "--steps", "1", "--valid", "0", "--quiet"]
    done, _ = launch(cli(*args, n=2), threads=None, cpus="0")
    assert done.stderr.count("exit status 0") == 2, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if "CPU" in ln]
    assert len(lines) == 1 and lines[0].startswith("fastattn train: warning: 2 ranks on"), \
        done.stderr
    assert "Warning" not in done.stderr                    # the CLI's line, not warnings'


@needs_mpi
def test_fastattn_train_refuses_options_that_differ_between_ranks(tmp_path):
    out = tmp_path / "run"
    common = ["train", str(pairs_file(tmp_path)), "--out", str(out), "--model", "tiny",
              "--tokenizer", "char", "--steps", "1", "--quiet"]
    done, seconds = launch(cli(*common, "--lr", "0.001"), cli(*common, "--lr", "0.002"))
    assert done.returncode != 0
    assert seconds < LIMIT
    assert done.stderr.count("exit status 1") == 2, done.stderr       # every rank failed
    assert "Traceback" not in done.stderr
    assert "--lr: rank 0: 0.001, rank 1: 0.002" in done.stderr, done.stderr
    assert not out.exists()                                # refused before anything is written
    # an option given to one rank only is refused the same way
    done, _ = launch(cli(*common), cli(*common, "--dropout", "0.2"))
    assert done.stderr.count("exit status 1") == 2, done.stderr
    assert "--dropout: rank 0: (not given), rank 1: 0.2" in done.stderr, done.stderr


TRAIN_RUN = """
import sys
from mpi4py import MPI
from fastattn.train import read_pairs
from fastattn.train.run import train_run
rank = MPI.COMM_WORLD.Get_rank()
try:
    train_run(read_pairs(sys.argv[1]), sys.argv[2], model="tiny", tokenizer="char", steps=1,
              valid=0.0, lr=[1e-3, 2e-3][rank], progress=False, comm=MPI.COMM_WORLD)
except ValueError as exc:
    print(f"rank {rank} raised: {exc}", file=sys.stderr)
    sys.exit(1)
"""


@needs_mpi
def test_train_run_refuses_settings_that_differ_between_ranks(tmp_path):
    out = tmp_path / "run"
    done, _ = launch(["-n", "2", sys.executable, "-c", TRAIN_RUN, str(pairs_file(tmp_path)),
                      str(out)])
    assert done.returncode != 0
    expected = "train_run: the ranks differ in lr: rank 0: 0.001, rank 1: 0.002"
    assert done.stderr.count(expected) == 2, done.stderr          # on every rank
    assert not out.exists()
