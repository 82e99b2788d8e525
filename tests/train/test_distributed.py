"""Data-parallel fit() and ``fastattn train`` over MPI (fastattn.train.distributed).

Without MPI: the flat gradient buffer, the batch split, the launcher detection and the
missing extra's error. With mpi4py and mpiexec (the mpi extra and an MPI; skipped without):
2 ranks of one thread each against one process with the same global batches (losses and
weights to float32 rounding: see EQUAL_TOL), an exact resume under mpiexec, a rank that
raises or hangs ending the job with its error within a time limit, and the command.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import fastattn
from fastattn import optim
from fastattn.cli import main
from fastattn.train import distributed, fit
from fastattn.train.run import load_run
from conftest import assert_close, modules_loaded_by
from mpi_worker import INJECTED, model_for, run_kwargs, task
from tolerances import TOL
from train_util import char_tokenizer, tiny_model, untimed, words

pytestmark = pytest.mark.usefixtures("single_thread")

MPIEXEC = shutil.which("mpiexec")
try:
    import mpi4py  # noqa: F401
    HAVE_MPI4PY = True
except ImportError:
    HAVE_MPI4PY = False
# (the sanitizer build's CI pass preloads its runtime into every process: not into mpiexec's)
needs_mpi = pytest.mark.skipif(
    not (MPIEXEC and HAVE_MPI4PY) or fastattn.build_info().get("sanitize_build", False),
    reason='needs mpi4py and mpiexec (pip install "fastattn[mpi]" mpich), on a plain build')
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_worker.py")
LIMIT = 60          # seconds a failing job may take to end every rank

# 2 ranks against one process, same global batches, 6 steps of AdamW at lr 3e-3: the losses
# agree to float32 rounding, and so do the weights (the gradients' rows are summed in two parts,
# then across the ranks, where one process sums them at once), except the biases of the key
# projections: their gradient is zero in exact arithmetic (a softmax does not change when one
# constant is added to all of a query's scores), so what is computed is rounding noise, which
# Adam's normalised step turns into moves of up to lr in either direction, in one process as on
# two. They do not change what the model computes: its outputs are compared instead.
EQUAL_TOL = TOL["data_parallel"]


def mpirun(n, *args, timeout=120, module=False):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    head = [sys.executable, "-m", "fastattn.cli"] if module else [sys.executable, WORKER]
    t0 = time.monotonic()
    done = subprocess.run([MPIEXEC, "-n", str(n), *head, *args], env=env, capture_output=True,
                          text=True, timeout=timeout)
    return done, time.monotonic() - t0


def read_rank(out, rank):
    with np.load(os.path.join(out, f"rank{rank}.npz")) as z:
        data = {k: z[k] for k in z.files}
    with open(os.path.join(out, f"rank{rank}.json")) as f:
        steps = json.load(f)
    weights = {k[2:]: v for k, v in data.items() if k.startswith("w.")}
    return data["losses"], weights, steps


def one_process(options):
    options = dict(options)
    dropout = options.pop("dropout", 0.0)
    kw = run_kwargs(options)
    model = model_for(kw, dropout)
    history = fit(model, task(), **kw)
    return np.array(history.losses), model.state_dict()


# ---- without MPI -------------------------------------------------------------------------------

def test_flat_grads_are_the_gradients_and_a_step_with_them_equals_one_without():
    tok = char_tokenizer()
    src = np.array([[tok.start_id, 4, 5, 6, tok.end_id]] * 3)
    tgt = np.array([[tok.start_id, 6, 5, 4, tok.end_id]] * 3)
    plain, flat_model = tiny_model(tok), tiny_model(tok)
    for m in (plain, flat_model):
        m.train()
    flat = flat_model.flat_grads()
    assert flat.dtype == np.float32 and flat.ndim == 1
    assert flat_model.flat_grads() is flat                      # kept
    for m in (plain, flat_model):
        opt = optim.AdamW(m, lr=1e-2)
        for _ in range(2):
            opt.zero_grad()
            m.loss(src, tgt, label_smoothing=0.1, backward=True)
            optim.clip_grad_norm(m, 0.5)
            opt.step()
    for (k, a), (k2, b) in zip(plain.state_dict().items(), flat_model.state_dict().items()):
        assert k == k2 and np.array_equal(a, b), k
    # every parameter gets a gradient in one process too: 2 ranks update the same set
    assert [k for k, _ in plain.named_grads()] == [k for k, _ in plain.named_parameters()]
    for (_, g), (_, p) in zip(flat_model.named_grads(), flat_model.named_parameters()):
        assert g.base is flat and g.shape == p.shape
    assert np.any(flat != 0)
    flat_model.zero_grad()
    assert not np.any(flat)


def test_flat_grads_keep_the_gradients_accumulated_before():
    tok = char_tokenizer()
    m = tiny_model(tok).train()
    src = np.array([[tok.start_id, 4, 5, tok.end_id]])
    m.loss(src, src, backward=True)
    before = {k: g.copy() for k, g in m.named_grads()}
    m.flat_grads()
    after = dict(m.named_grads())
    for k, g in before.items():
        assert np.array_equal(after[k], g)


def test_shard_cuts_a_batch_into_consecutive_parts_one_per_rank():
    batch = np.arange(10, 17)
    parts = [distributed.shard(batch, r, 3) for r in range(3)]
    assert [p.tolist() for p in parts] == [[10, 11, 12], [13, 14], [15, 16]]
    assert [distributed.shard(batch[:1], r, 2).tolist() for r in range(2)] == [[10], []]


def test_world_is_none_without_a_launcher_and_names_the_extra_without_mpi4py(monkeypatch):
    for var in (*distributed._SIZE_VARIABLES, "PMIX_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert distributed.launched_size() is None and distributed.world() is None
    monkeypatch.setenv("PMI_SIZE", "1")
    assert distributed.world() is None                    # mpiexec -n 1: one process
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(ImportError, match=r'fastattn\[mpi\]'):
        distributed.world()


def test_fastattn_train_under_a_launcher_without_mpi4py_says_which_extra(
        monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    data = tmp_path / "pairs.tsv"
    data.write_text("ab\tba\n")
    assert main(["train", str(data), "--out", str(tmp_path / "run")]) == 1
    assert 'pip install "fastattn[mpi]"' in capsys.readouterr().err


def test_fit_with_a_communicator_of_one_process_is_the_plain_run():
    class One:
        def Get_size(self):
            return 1

    options = dict(max_steps=3)
    kw = run_kwargs(options)
    a = fit(model_for(kw), task(), **kw)
    b = fit(model_for(kw), task(), comm=One(), **kw)
    assert untimed(a) == untimed(b)
    with pytest.raises(TypeError, match="mpi4py communicator"):
        fit(model_for(kw), task(), comm="world", **kw)
    with pytest.raises(ValueError, match="comm_timeout"):
        fit(model_for(kw), task(), comm_timeout=0, **kw)


# ---- under mpiexec -----------------------------------------------------------------------------

@needs_mpi
@pytest.mark.parametrize("options", [dict(max_steps=6), dict(max_steps=6, batch_tokens=12)],
                         ids=["batches-of-pairs", "one-or-two-pairs-a-batch"])
def test_two_ranks_equal_one_process_with_the_global_batch(tmp_path, options):
    # batch_tokens=12: a batch of one pair leaves rank 1 nothing to do that step
    done, _ = mpirun(2, "fit", str(tmp_path), json.dumps(options))
    assert done.returncode == 0, done.stderr
    losses, weights, steps = read_rank(tmp_path, 0)
    losses1, weights1, steps1 = read_rank(tmp_path, 1)
    # every rank holds the same weights and the same global losses, bit for bit
    assert np.array_equal(losses, losses1)
    for k in weights:
        assert np.array_equal(weights[k], weights1[k]), k
    assert all(r["ranks"] == 2 and r["allreduce_seconds"] >= 0 for r in steps)
    ref_losses, ref_weights = one_process(options)
    assert len(losses) == len(ref_losses) == options["max_steps"]
    assert_close(losses, ref_losses, **EQUAL_TOL["loss"], name="losses", dtype=None)
    if "batch_tokens" not in options:
        assert losses[-1] < losses[0]                      # it trains
    C = model_for(run_kwargs({})).emb_size
    for k, ref in ref_weights.items():
        mine, ref = weights[k].copy(), ref.copy()
        if k.endswith("in_proj_bias"):                  # (q, k, v) biases: the k part aside
            mine[C:2 * C] = ref[C:2 * C] = 0.0
        worst = float(np.max(np.abs(mine - ref)))
        assert worst <= EQUAL_TOL["weight_atol"], (k, worst)
    models = []
    for w in (weights, ref_weights):
        m = model_for(run_kwargs({}))
        m.load_state_dict(w)
        models.append(m.eval())
    tok = run_kwargs({})["src_tokenizer"]
    src, _ = tok.encode_batch([s for s, _ in task()[:8]], add_start_end=True)
    tgt, _ = tok.encode_batch([t for _, t in task()[:8]], add_start_end=True)
    a, b = (m(src, tgt[:, :-1]) for m in models)
    assert_close(a, b, **EQUAL_TOL["logits"], name="logits")
    # the tokens of each step are the global batch's, as one process counts them
    ref_steps = fit(model_for(run_kwargs(options)), task(), **run_kwargs(options)).steps
    assert [r["tokens"] for r in steps] == [r["tokens"] for r in ref_steps]


@needs_mpi
def test_a_resume_under_mpiexec_continues_exactly(tmp_path):
    whole, part = tmp_path / "whole", tmp_path / "part"
    for d in (whole, part):
        d.mkdir()
    common = dict(dropout=0.1, checkpoint_every=3)
    done, _ = mpirun(2, "fit", str(whole), json.dumps(dict(
        common, max_steps=6, checkpoint_dir=str(whole / "ck"))))
    assert done.returncode == 0, done.stderr
    done, _ = mpirun(2, "fit", str(part), json.dumps(dict(
        common, max_steps=3, checkpoint_dir=str(part / "ck"))))
    assert done.returncode == 0, done.stderr
    done, _ = mpirun(2, "fit", str(part), json.dumps(dict(
        common, max_steps=6, checkpoint_dir=str(part / "ck"), resume=True)))
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        a_losses, a_weights, _ = read_rank(whole, rank)
        b_losses, b_weights, b_steps = read_rank(part, rank)
        assert [r["step"] for r in b_steps][-3:] == [4, 5, 6]
        assert np.array_equal(a_losses[-3:], b_losses[-3:])
        for k in a_weights:
            assert np.array_equal(a_weights[k], b_weights[k]), (rank, k)
    # on another number of ranks (here one process) the run goes on from the same step
    kw = run_kwargs(dict(max_steps=8, checkpoint_dir=str(part / "ck"), resume=True))
    history = fit(model_for(kw, dropout=0.1), task(), **kw)
    assert [r["step"] for r in history.steps] == list(range(1, 9))
    assert np.array_equal(history.losses[:6], read_rank(part, 0)[0])


@needs_mpi
def test_a_rank_that_raises_ends_every_rank_with_its_error(tmp_path):
    done, seconds = mpirun(2, "raise", str(tmp_path), timeout=LIMIT + 30)
    assert done.returncode != 0
    assert seconds < LIMIT
    assert INJECTED in done.stderr and "rank 1 of 2" in done.stderr
    assert not os.path.exists(tmp_path / "rank0.npz")     # rank 0 did not finish either


@needs_mpi
def test_a_rank_that_hangs_ends_the_job_at_the_deadline(tmp_path):
    done, seconds = mpirun(2, "hang", str(tmp_path), json.dumps(dict(comm_timeout=2)),
                           timeout=LIMIT + 30)
    assert done.returncode != 0
    assert seconds < LIMIT
    assert "waited more than 2 s" in done.stderr
    assert not os.path.exists(tmp_path / "rank0.npz")


@needs_mpi
def test_fastattn_train_under_mpiexec_writes_one_run_and_resumes(tmp_path):
    data = tmp_path / "pairs.tsv"
    data.write_text("".join(f"{w}\t{w[::-1]}\n" for w in words(200, lo=2, hi=8)))
    out = tmp_path / "run"
    args = ["train", str(data), "--out", str(out), "--model", "tiny", "--tokenizer", "char",
            "--batch-tokens", "256", "--valid", "0.1", "--eval-every", "2",
            "--exact-sample", "4", "--quiet"]
    done, _ = mpirun(2, *args, "--steps", "4", module=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("run written to") == 1        # rank 0 alone reports
    for name in ("config.json", "model.safetensors", "history.jsonl", "checkpoints"):
        assert (out / name).exists(), name
    records = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and all(r["ranks"] == 2 for r in steps)
    assert [r["step"] for r in records if r["kind"] == "eval"] == [2, 4]
    done, _ = mpirun(2, *args, "--steps", "6", "--resume", module=True)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "step"] == list(range(1, 7))
    run = load_run(out)
    assert run.complete(["abc"], max_new_tokens=4)[0] is not None


def test_the_train_dp_benchmark_splits_the_cores_then_scales_out():
    from fastattn.bench.dp_cases import dp_configs

    assert dp_configs(2) == [(1, 2), (2, 1), (1, 1)]
    assert dp_configs(16)[:5] == [(1, 16), (2, 8), (4, 4), (8, 2), (16, 1)]
    assert dp_configs(16)[5:] == [(1, 1), (2, 1), (4, 1), (8, 1)]


@needs_mpi
def test_the_train_dp_worker_reports_rank_0s_figures():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "fastattn.bench.dp_worker",
                           "--model", "tiny", "--steps", "1", "--batch-tokens", "64",
                           "--words", "6", "--allreduce", "1"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1                                # rank 0 alone prints
    out = json.loads(lines[0])
    assert out["ranks"] == 2 and out["threads"] == 1 and out["steps"] == 1
    assert out["tokens_per_s"] > 0 and out["allreduce_ms"] > 0
    assert out["flat_bytes"] >= out["grad_bytes"] > 0


def test_the_core_install_never_imports_mpi4py():
    assert modules_loaded_by("import fastattn.train, fastattn.cli\n"
                             "from fastattn.train import distributed", "mpi4py") == []
