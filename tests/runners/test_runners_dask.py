"""fastattn.runners.dask on a LocalCluster (2 worker processes, 1 thread each, started once for
the module): translate_bag and translate_dataframe equal the single-process runner, the model
is built once per worker process; a worker restarted mid-job loses nothing and repeats
nothing; bad options fail on the client. Skipped without Dask (``pip install
"fastattn[dask]"``)."""
import os

import pytest

from fastattn.runners import Translator, record
from runner_util import sentences
from runner_util import run, run_dir  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("single_thread")

dask = pytest.importorskip("dask")
db = pytest.importorskip("dask.bag")
distributed = pytest.importorskip("distributed")

from fastattn.runners.dask import translate_bag, translate_dataframe  # noqa: E402


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as c:
        yield c


def corpus(n, seed):
    texts = sentences(n, seed=seed)
    texts[3], texts[5] = "", " ".join(sentences(1, seed=seed, lo=300, hi=300))
    return texts


def expected(run, texts):
    return [record(t, r) for t, r in zip(texts, Translator.from_run(run).translate(texts))]


def worker_runs():
    from fastattn.runners import dask as runner
    return len(runner._RUNS)


def test_bag_and_dataframe_equal_the_single_process_runner(client, run, run_dir):
    texts = corpus(240, seed=31)
    got = translate_bag(db.from_sequence(texts, npartitions=6), run_dir).compute()
    assert got == expected(run, texts)
    assert got[3] == {"source": "", "output": ""} and got[5]["truncated"] is True
    assert sum(client.run(worker_runs).values()) == 2             # one model per process
    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe")
    df = dd.from_pandas(pd.DataFrame({"source": texts, "n": range(240)}), npartitions=4)
    out = translate_dataframe(df, run).compute()
    assert list(out["output"]) == [r["output"] for r in expected(run, texts)]
    assert list(out["n"]) == list(range(240)) and out["error"].isna().all()


def test_a_worker_restarted_mid_job_loses_and_repeats_nothing(client, run, run_dir):
    texts = corpus(600, seed=32)
    parts = translate_bag(db.from_sequence(texts, npartitions=24), run_dir).to_delayed()
    pids = set(client.run(os.getpid).values())
    futures = client.compute(parts)
    first = next(distributed.as_completed(futures))
    (victim,) = client.who_has(first)[first.key][:1]               # a worker holding results
    client.restart_workers([victim])
    got = [rec for part in client.gather(futures) for rec in part]
    assert len(pids & set(client.run(os.getpid).values())) == 1      # one process is new
    assert got == expected(run, texts)                            # every line once, in order


def test_bad_options_fail_on_the_client(client, run_dir):
    bag = db.from_sequence(["one"])
    for kw, match in [(dict(method="top"), "method must be one of"),
                      (dict(max_source_tokens=1), "max_source_tokens"),
                      (dict(threads=0), "threads must be an int >= 1")]:
        with pytest.raises(ValueError, match=match):
            translate_bag(bag, run_dir, **kw)
    with pytest.raises(TypeError, match="dask.bag.Bag"):
        translate_bag(["one"], run_dir)
