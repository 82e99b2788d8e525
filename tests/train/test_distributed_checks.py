"""What the ranks of a data-parallel run check of each other (fastattn.train.distributed).

The watchdog: once it has said "ending every rank", the job's exit status is not 0, even
when the late rank arrives and the run could finish.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

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


# ---- under mpiexec -----------------------------------------------------------------------------

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
