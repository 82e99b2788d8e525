"""fork() after a kernel call: GNU libgomp cannot start threads in a child forked from a process
whose OpenMP team already ran (the child waits forever on threads that were not copied), so a
child forked after fastattn started a team runs its kernels on one thread, reports one thread,
and refuses set_num_threads(n > 1) with a RuntimeError naming the cause and the fix (the
"spawn" or "forkserver" start method). A child forked before any team started keeps its count.

Each check runs in its own interpreter, in its own session, under a timeout: a hang fails the
test and its processes are killed, the suite goes on. Results in the child must equal the
parent's bit for bit (the summation order does not depend on the thread count).
"""
import json
import os
import signal
import subprocess
import sys

import pytest

import fastattn
from conftest import SIMD_LEVELS, child_env

TIMEOUT = 30        # seconds for a forked child (its work takes well under one)

_CHILD = r"""
import hashlib, json, multiprocessing, os, sys, time
import numpy as np
import fastattn
from fastattn import ops

WAIT = float(sys.argv[2])


def work(_=None):
    # a digest of attention (forward, backward), layer norm, linear and softmax outputs, at
    # sizes above every kernel's parallel grain, so that a team of 2 really starts
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 4, 96, 32), dtype=np.float32) for _ in range(3))
    out, cache = ops.attention_forward(q, k, v, causal=True)
    grads = ops.attention_backward(out, q, k, v, out, cache["lse"], causal=True)
    x = rng.standard_normal((384, 256), dtype=np.float32)
    w = rng.standard_normal((320, 256), dtype=np.float32)
    ln = ops.layer_norm(x, np.ones(256, np.float32), np.zeros(256, np.float32))
    digest = hashlib.sha256()
    for a in (out, cache["lse"], *grads, ln, ops.linear(x, w), ops.softmax(x)):
        digest.update(np.ascontiguousarray(a).tobytes())
    return digest.hexdigest()


def in_child():
    report = {"result": work(), "threads": fastattn.get_num_threads(),
              "build_info_threads": fastattn.build_info()["threads"]}
    try:
        fastattn.set_num_threads(2)
        report["set_2"] = "accepted"
        report["result_after_set_2"] = work()
    except RuntimeError as exc:
        report["set_2"] = str(exc)
    assert fastattn.set_num_threads(1) == 1   # one thread is always allowed
    return report


def fork_and_wait():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            data, code = json.dumps(in_child()).encode(), 0
        except BaseException as exc:
            data, code = json.dumps({"error": repr(exc)}).encode(), 1
        os.write(w, data)
        os._exit(code)
    os.close(w)
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            data = b""
            while chunk := os.read(r, 1 << 16):
                data += chunk
            return json.loads(data)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return {"hung": True}


def pool_map():
    pool = multiprocessing.get_context("fork").Pool(2)
    try:
        return {"results": pool.map_async(work, range(4)).get(timeout=WAIT)}
    except multiprocessing.TimeoutError:
        return {"hung": True}
    finally:
        pool.terminate()


fastattn.set_num_threads(2)
if sys.argv[1] == "after":
    work()
report = {"fork": fork_and_wait(), "pool": pool_map(), "expected": work(),
          "parent_threads": fastattn.get_num_threads()}
print(json.dumps(report))
"""


def run_fork_child(when, env=None):
    """_CHILD in a fresh interpreter in its own session (a hung grandchild is killed with it);
    -> its JSON report. when: "after" (fork after threaded kernel calls) or "before" (fork
    before any kernel call)."""
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, when, str(TIMEOUT)],
                            env=child_env({"OMP_NUM_THREADS": "2", **(env or {})}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=3 * TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"fork check hung past {3 * TIMEOUT} s (killed)")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)   # any forked child left behind
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, f"exit status {proc.returncode}:\n{out}\n{err}"
    return json.loads(out.strip().splitlines()[-1])


def assert_single_threaded_child(report):
    child = report["fork"]
    assert not child.get("hung"), "a child forked after a kernel call hung in its first call"
    assert "error" not in child, child
    assert child["result"] == report["expected"], "the forked child's results differ"
    assert child["threads"] == child["build_info_threads"] == 1, child
    assert "fork" in child["set_2"] and "spawn" in child["set_2"], child["set_2"]
    assert not report["pool"].get("hung"), "a fork Pool's workers hung in their first call"
    assert report["pool"]["results"] == [report["expected"]] * 4, report["pool"]
    assert report["parent_threads"] == 2, report   # the parent keeps its team


def test_fork_after_a_threaded_kernel_call_does_not_hang():
    assert_single_threaded_child(run_fork_child("after"))


def test_fork_before_any_kernel_call_keeps_the_threads():
    report = run_fork_child("before")
    child = report["fork"]
    assert not child.get("hung") and "error" not in child, child
    assert child["threads"] == 2 and child["set_2"] == "accepted", child
    assert child["result"] == child["result_after_set_2"] == report["expected"], child
    assert report["pool"]["results"] == [report["expected"]] * 4, report["pool"]


@pytest.mark.parametrize("isa", SIMD_LEVELS)
def test_fork_after_kernel_call_at_every_simd_level(isa):
    if isa not in fastattn.build_info()["simd_available"]:
        pytest.skip(f"{isa} is not available on this CPU/build")
    assert_single_threaded_child(run_fork_child("after", {"FASTATTN_CPU_ISA": isa}))


def test_fork_after_kernel_call_under_a_thread_limit():
    # OpenMP starts no second thread at all; the child behaves as after any team
    assert_single_threaded_child(run_fork_child("after", {"OMP_THREAD_LIMIT": "1"}))
