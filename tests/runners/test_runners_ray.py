"""fastattn.runners.ray on a local Ray (2 CPUs, started once for the module): translate_dataset's
outputs equal the single-process runner's, other columns kept; an actor killed mid-job is
restarted by Ray Data and every row still comes back exactly once; bad options are errors on
the driver before any actor starts. Skipped without Ray (``pip install "fastattn[ray]"``)."""
import glob
import os
import signal

import pytest

from fastattn.runners import Translator
from runner_util import sentences
from runner_util import run, run_dir  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("single_thread")

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")
pytest.importorskip("pyarrow")

from fastattn.runners.ray import translate_dataset  # noqa: E402

ACTOR = b"ray::MapWorker(MapBatches(_Translate))"


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


def corpus(n, seed):
    texts = sentences(n, seed=seed)
    texts[3], texts[5] = "", " ".join(sentences(1, seed=seed, lo=300, hi=300))
    return texts


def expected(run, texts, **kw):
    return {i: (r.output, r.error) for i, r in
            enumerate(Translator.from_run(run, **kw).translate(texts))}


def rows_of(ds):
    return {r["id"]: r for r in ds.take_all()}


def actor_pids():
    pids = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as f:
                if f.read().startswith(ACTOR):
                    pids.append(int(path.split("/")[2]))
        except OSError:
            pass
    return pids


def test_outputs_equal_the_single_process_runner(cluster, run, run_dir):
    texts = corpus(200, seed=21) + [None]
    ds = ray.data.from_items([{"id": i, "source": t, "keep": i * 2}
                              for i, t in enumerate(texts)])
    out = rows_of(translate_dataset(ds, run_dir, concurrency=2, num_cpus_per_worker=1,
                                    batch_size=40, too_long="skip"))
    want = expected(run, texts, too_long="skip")
    assert sorted(out) == list(range(len(texts)))
    assert {i: (r["output"], r["error"]) for i, r in out.items()} == want
    assert all(r["keep"] == i * 2 and r["source"] == texts[i] for i, r in out.items())
    assert out[3]["output"] == "" and out[5]["output"] is None
    assert "too long" in out[5]["error"] and "must be a str" in out[len(texts) - 1]["error"]


def test_an_actor_killed_mid_job_is_replaced_and_every_row_comes_back_once(cluster, run,
                                                                           run_dir):
    texts = corpus(1000, seed=22)
    ds = ray.data.from_items([{"id": i, "source": t} for i, t in enumerate(texts)])
    out = translate_dataset(ds, run, concurrency=2, batch_size=25)
    ids, outputs, killed, seen = [], {}, None, set()
    for batch in out.iter_batches(batch_format="pyarrow", batch_size=None):
        if killed is None:
            first = actor_pids()
            assert first, "no translating actor found"
            killed = first[0]
            os.kill(killed, signal.SIGKILL)
        seen.update(actor_pids())
        ids.extend(batch.column("id").to_pylist())
        outputs.update(zip(batch.column("id").to_pylist(), batch.column("output").to_pylist()))
    assert seen - set(first), "no actor was started in place of the killed one"
    assert sorted(ids) == list(range(len(texts)))                   # each exactly once
    assert outputs == {i: o for i, (o, _) in expected(run, texts).items()}


def test_bad_options_fail_on_the_driver(cluster, run_dir):
    ds = ray.data.from_items([{"source": "one"}])
    for kw, match in [(dict(method="top"), "method must be one of"),
                      (dict(batch_tokens=0), "batch_tokens"),
                      (dict(concurrency=0), "concurrency must be an int >= 1"),
                      (dict(num_cpus_per_worker=0), "num_cpus_per_worker"),
                      (dict(output_column="source"), "three names")]:
        with pytest.raises(ValueError, match=match):
            translate_dataset(ds, run_dir, **kw)
    with pytest.raises(TypeError, match="ray.data.Dataset"):
        translate_dataset([{"source": "one"}], run_dir)
