"""Texts in, texts out with pretrained directories: Translator.translate equals the tokenizer's
decode of transformers' generate; fastattn translate / complete --model DIR and the file runner
on them (a directory transformers saves, and a quantized one Translator.save wrote)."""
import json
import warnings

import numpy as np
import pytest

from fastattn import cli, load_pretrained
from fastattn.runners import translate_file

from test_pretrained_tokenizer import build, models  # noqa: F401  (a session fixture)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXTS = ["the cat sat on the mat", "a dog", "", "the quick brown fox jumps over the dog",
         "12 cats and 3 dogs"]
MODEL = {"marian": "MarianMTModel", "nllb": "M2M100ForConditionalGeneration",
         "m2m100": "M2M100ForConditionalGeneration", "bart": "BartForConditionalGeneration",
         "mbart50": "MBartForConditionalGeneration"}


@pytest.fixture(scope="module", params=list(MODEL))
def model_dir(request, models, tmp_path_factory):    # noqa: F811
    """A directory with the tokenizer of kind `param` and random weights; transformers'
    model and tokenizer."""
    kind = request.param
    d = tmp_path_factory.mktemp(kind + "-model")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_tok = build(kind, models, d)
        cfg = transformers.AutoConfig.from_pretrained(d)
        torch.manual_seed(0)
        model = getattr(transformers, MODEL[kind])(cfg).eval()
        with torch.no_grad():                       # outputs that end at different lengths
            if hasattr(model, "final_logits_bias"):
                model.final_logits_bias.normal_()
        model.save_pretrained(d)
    return kind, d, model, hf_tok


def hf_translate(model, tok, texts, **kw):
    enc = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, bad_words_ids=[[model.config.pad_token_id]],
                             **kw)
    return tok.batch_decode(out, skip_special_tokens=True)


def test_translate_equals_transformers_decode(model_dir):
    kind, d, model, tok = model_dir
    tr = load_pretrained(d)
    texts = [t for t in TEXTS if t]
    kw = {}
    if kind in ("nllb", "m2m100", "mbart50"):
        lang = {"nllb": "fra_Latn", "m2m100": "fr", "mbart50": "fr_XX"}[kind]
        kw["tgt_lang"] = lang
        hf_kw = dict(forced_bos_token_id=tok.convert_tokens_to_ids(
            lang if kind != "m2m100" else f"__{lang}__"))
    else:
        hf_kw = {}
    for beams in (1, 3):
        ref = hf_translate(model, tok, texts, num_beams=beams, max_new_tokens=8, **hf_kw)
        got = tr.translate(texts, beam_size=beams, max_new_tokens=8, **kw)
        assert got == ref


def test_cli_translate_and_complete_with_model(model_dir, tmp_path, capsys):
    kind, d, model, tok = model_dir
    if kind != "marian":
        pytest.skip("one family is enough for the command line")
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "out.jsonl"
    assert cli.main(["translate", "--model", str(d), "--input", str(src), "--output", str(out),
                     "--max-new-tokens", "6", "--quiet"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    want = load_pretrained(d).translate([t for t in TEXTS if t], max_new_tokens=6)
    assert [r["output"] for r in rows if r["source"]] == want
    assert [r["source"] for r in rows] == TEXTS
    capsys.readouterr()
    assert cli.main(["complete", "--model", str(d), "--max-new-tokens", "6", "--method", "beam",
                     "--beam-size", "2", TEXTS[0], TEXTS[1]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == load_pretrained(d).translate(TEXTS[:2], max_new_tokens=6, beam_size=2)
    # a quantized copy Translator.save wrote: the same command, its own outputs
    q = tmp_path / "int8"
    load_pretrained(d, compute_type="int8").save(q)
    out2 = tmp_path / "out2.jsonl"
    assert cli.main(["translate", "--model", str(q), "--input", str(src), "--output", str(out2),
                     "--max-new-tokens", "6", "--quiet"]) == 0
    rows = [json.loads(line) for line in out2.read_text().splitlines()]
    assert [r["output"] for r in rows if r["source"]] == \
        load_pretrained(q).translate([t for t in TEXTS if t], max_new_tokens=6)


def test_cli_refusals(model_dir, tmp_path, capsys):
    kind, d, _, _ = model_dir
    if kind != "nllb":
        pytest.skip("one multilingual family is enough")
    src = tmp_path / "in.txt"
    src.write_text("a\n")
    out = str(tmp_path / "o.jsonl")
    assert cli.main(["translate", "--input", str(src), "--output", out]) == 2
    assert "required: RUN_DIR (or --model DIR)" in capsys.readouterr().err
    for argv, msg in [
        (["complete", "--model", str(d), "--tgt-lang", "xx_Xxxx", "a"], "xx_Xxxx"),
        (["complete", "--model", str(d), "--method", "sample", "a"], "transformers' greedy"),
        (["complete", "--model", str(tmp_path), "a"], "not a pretrained model directory"),
        (["complete", "--src-lang", "fra_Latn", "a"], "apply to a pretrained model"),
        (["translate", "--model", str(d), "--input", str(src), "--output", out,
          "--max-new-tokens", "5000"], "exceed the model's"),
    ]:
        assert cli.main(argv) == 1
        assert msg in capsys.readouterr().err


def test_file_runner_cuts_a_long_source(model_dir, tmp_path):
    kind, d, _, _ = model_dir
    if kind != "bart":
        pytest.skip("one family is enough")
    src = tmp_path / "in.txt"
    src.write_text("the cat " * 5000 + "\nthe dog\n")
    out = tmp_path / "out.jsonl"
    stats = translate_file(d, src, out, max_new_tokens=4, max_source_tokens=20, progress=False)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert stats["truncated"] == 1 and rows[0].get("truncated") is True
    tr = load_pretrained(d)
    ids, _ = tr.tokenizer.encode_batch(["the cat " * 5000], max_length=20)
    assert rows[0]["output"] == tr.tokenizer.decode(tr.generate(ids, max_new_tokens=4)[0])
    np.testing.assert_array_equal(ids.shape, (1, 20))


def test_dask_runner_and_shipped_state(model_dir, tmp_path):
    """The Dask runner on a pretrained directory (its workers read the directory), equal to the
    single-process runner; the state Ray and Dask ship names the directory, not the weights."""
    kind, d, _, _ = model_dir
    if kind != "marian":
        pytest.skip("one family is enough")
    from fastattn.runners import Translator, record, run_from_state, run_state
    from fastattn.runners.core import load_any
    run = load_any(str(d), compute_type="int8")
    state = run_state(run)
    assert state == {"pretrained": str(d), "compute_type": "int8"}
    again = run_from_state(state)
    want = [record(t, r) for t, r in zip(TEXTS, Translator.from_run(run, max_new_tokens=5)
                                         .translate(TEXTS))]
    assert [record(t, r) for t, r in zip(
        TEXTS, Translator.from_run(again, max_new_tokens=5).translate(TEXTS))] == want
    distributed = pytest.importorskip("distributed")
    db = pytest.importorskip("dask.bag")
    from fastattn.runners.dask import translate_bag
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        got = translate_bag(db.from_sequence(TEXTS, npartitions=2), str(d), client=client,
                            max_new_tokens=5).compute()
    assert got == [record(t, r) for t, r in zip(
        TEXTS, Translator.from_run(load_any(d), max_new_tokens=5).translate(TEXTS))]
