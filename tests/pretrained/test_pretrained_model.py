"""fastattn.load_pretrained against transformers on models it makes (tiny, trained briefly on
a toy task so that the outputs depend on the source): teacher-forced logits, greedy and beam search
under transformers' rules, gradients of a training step, converted (quantized) directories."""
import json
import subprocess
import sys

import numpy as np
import pytest

from fastattn.pretrained import load_pretrained
from test_pretrained_weights import CLASSES

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=120, d_model=48, encoder_layers=2, decoder_layers=2,
             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=96,
             decoder_ffn_dim=96, max_position_embeddings=64, dropout=0.0,
             attention_dropout=0.0, activation_dropout=0.0)
FAMILIES = list(CLASSES)
# the bound on teacher-forced logits against transformers (float32)
LOGITS_RTOL = 1e-4
# gradients: float32 sums over the batch and the vocabulary in two orders (torch's autograd,
# fastattn's kernels); about 1e-5 relative seen on these models, bounded with room
GRAD_RTOL = 1e-3
# and an absolute floor, relative to the model's largest gradient: a hundred float32 epsilons
GRAD_ATOL = 1e-5


def make(path, family, seed=0, steps=200, **extra):
    """A transformers model of `family`, trained briefly to copy its source (so that its
    outputs depend on the source and end at different lengths), saved to path."""
    cfg_cls, model_cls = (getattr(transformers, n) for n in CLASSES[family])
    ids = dict(pad_token_id=119, decoder_start_token_id=119, eos_token_id=0) \
        if family == "marian" else dict(decoder_start_token_id=0)
    ids.update(extra)
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**SMALL, **ids))
    cfg = model.config
    if hasattr(model, "final_logits_bias"):
        with torch.no_grad():
            model.final_logits_bias.normal_(std=0.1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        src = np.full((32, 10), cfg.pad_token_id)
        tgt = np.full((32, 11), cfg.pad_token_id)
        tgt[:, 0] = cfg.decoder_start_token_id
        for i in range(32):
            words = rng.integers(3, 110, rng.integers(1, 9))
            src[i, :len(words) + 1] = list(words) + [cfg.eos_token_id]
            tgt[i, 1:len(words) + 2] = list(words) + [cfg.eos_token_id]
        labels = torch.tensor(tgt[:, 1:])
        labels[labels == cfg.pad_token_id] = -100
        loss = model(input_ids=torch.tensor(src),
                     attention_mask=torch.tensor(src != cfg.pad_token_id),
                     decoder_input_ids=torch.tensor(tgt[:, :-1]), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval().save_pretrained(path)
    return model


def batch(tr, B=8, S=10, seed=1):
    rng = np.random.default_rng(seed)
    a = tr.arch
    src = rng.integers(3, 110, (B, S))
    lengths = rng.integers(2, S + 1, B)
    lengths[0] = S
    for i, n in enumerate(lengths):
        src[i, n - 1] = a.eos_id
        src[i, n:] = a.pad_id
    return src


def hf_generate(model, src, pad, **kw):
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor(src), attention_mask=torch.tensor(src != pad),
                             do_sample=False, bad_words_ids=[[pad]], **kw).numpy()
    rows = []
    for r in out[:, 1:].tolist():                     # without the start token and padding
        while r and r[-1] == pad:
            r.pop()
        rows.append(r)
    return rows


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    model = make(path, request.param)
    return model, load_pretrained(path), path


def test_teacher_forced_logits_equal_transformers(pair):
    model, tr, _ = pair
    src = batch(tr)
    rng = np.random.default_rng(2)
    tgt = rng.integers(3, 110, (src.shape[0], 7))
    tgt[:, 0] = tr.arch.decoder_start_id
    tgt[3, 4:] = tr.arch.pad_id                           # padding at the end of a target
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(src), attention_mask=torch.tensor(src != tr.arch.pad_id),
                    decoder_input_ids=torch.tensor(tgt)).logits.numpy()
    got = tr.logits(src, tgt)
    assert got.shape == ref.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=LOGITS_RTOL, atol=LOGITS_RTOL * np.abs(ref).max())


@pytest.mark.parametrize("beams", [1, 4])
def test_generate_equals_transformers(pair, beams):
    model, tr, _ = pair
    pad = tr.arch.pad_id
    src = np.concatenate([batch(tr, seed=s) for s in (1, 2, 3)])      # 24 rows with padding
    ref = hf_generate(model, src, pad, num_beams=beams, max_new_tokens=12)
    got = tr.generate(src, beam_size=beams, max_new_tokens=12)
    same = sum(a == b for a, b in zip(got, ref))
    assert same >= 0.95 * len(ref), (got, ref)
    assert any(len(r) < 12 for r in ref)                 # the end token was met somewhere


@pytest.mark.parametrize("early_stopping, length_penalty",
                         [(True, 1.0), ("never", 2.0), (False, 0.0), (False, -1.0)])
def test_beam_rules_equal_transformers(pair, early_stopping, length_penalty):
    model, tr, _ = pair
    pad = tr.arch.pad_id
    src = np.concatenate([batch(tr, seed=s) for s in (4, 5)])
    ref = hf_generate(model, src, pad, num_beams=3, max_new_tokens=9,
                      early_stopping=early_stopping, length_penalty=length_penalty)
    got = tr.generate(src, beam_size=3, max_new_tokens=9, early_stopping=early_stopping,
                      length_penalty=length_penalty)
    assert sum(a == b for a, b in zip(got, ref)) >= 0.95 * len(ref), (got, ref)


@pytest.mark.parametrize("family", ["marian", "bart"])
def test_untied_tables_each_read(tmp_path, family):
    """tie_word_embeddings false: transformers 5 gives the encoder, the decoder and the output
    projection a table each (saved apart from model.shared); each is read where it is used."""
    model = make(tmp_path, family, steps=0, tie_word_embeddings=False)
    sd = model.state_dict()
    assert not torch.equal(sd["model.encoder.embed_tokens.weight"],
                           sd["model.decoder.embed_tokens.weight"])
    tr = load_pretrained(tmp_path)
    src = batch(tr)
    tgt = src[:, :5].copy()
    tgt[:, 0] = tr.arch.decoder_start_id
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(src), attention_mask=torch.tensor(src != tr.arch.pad_id),
                    decoder_input_ids=torch.tensor(tgt)).logits.numpy()
    np.testing.assert_allclose(tr.logits(src, tgt), ref, rtol=LOGITS_RTOL,
                               atol=LOGITS_RTOL * np.abs(ref).max())


def test_forced_first_token_as_nllb_target_language(tmp_path):
    model = make(tmp_path, "m2m_100", steps=0)
    tr = load_pretrained(tmp_path)
    src = batch(tr)
    for beams in (1, 4):
        ref = hf_generate(model, src, tr.arch.pad_id, num_beams=beams, max_new_tokens=8,
                          forced_bos_token_id=77)
        got = tr.generate(src, beam_size=beams, max_new_tokens=8, forced_bos_id=77)
        assert all(r[0] == 77 for r in got)
        assert sum(a == b for a, b in zip(got, ref)) >= 0.95 * len(ref)


def test_forced_eos_at_max_length_and_pad_never_generated(tmp_path):
    model = make(tmp_path, "bart", steps=0, forced_eos_token_id=2)
    tr = load_pretrained(tmp_path)
    with torch.no_grad():                              # make the pad id the likeliest token
        model.final_logits_bias[0, tr.arch.pad_id] = 50.0
    tr.model.generator.bias[tr.arch.pad_id] = 50.0
    src = batch(tr)
    got = tr.generate(src, max_new_tokens=6)
    assert all(tr.arch.pad_id not in r for r in got)
    assert all(r[-1] == 2 for r in got)                # forced at the last position
    assert got == hf_generate(model, src, tr.arch.pad_id, max_new_tokens=6)


def test_training_gradients_equal_transformers(pair):
    """One teacher-forced loss and its gradients: fastattn's copies of a tied table sum to
    transformers' one gradient."""
    model, tr, path = pair
    src = batch(tr, B=4)
    rng = np.random.default_rng(3)
    tgt = rng.integers(3, 110, (4, 7))
    tgt[:, 0] = tr.arch.decoder_start_id
    tgt[2, 5:] = tr.arch.pad_id
    fa = load_pretrained(path).model.train()
    fa.zero_grad()
    loss = fa.loss(src, tgt, backward=True)
    hf = type(model).from_pretrained(path).train()
    labels = torch.tensor(tgt[:, 1:])
    labels[labels == tr.arch.pad_id] = -100
    out = hf(input_ids=torch.tensor(src), attention_mask=torch.tensor(src != tr.arch.pad_id),
             decoder_input_ids=torch.tensor(tgt[:, :-1]), labels=labels)
    out.loss.backward()
    assert loss == pytest.approx(out.loss.item(), rel=LOGITS_RTOL)
    g = dict(fa.named_grads())
    hg = {k: v.grad.numpy() for k, v in hf.named_parameters() if v.grad is not None}

    scale = max(np.abs(v).max() for v in hg.values())

    def close(a, b, name):     # entries far below the largest gradient: float32 noise of it
        np.testing.assert_allclose(a, b, rtol=GRAD_RTOL, atol=GRAD_ATOL * scale, err_msg=name)

    q = hg["model.decoder.layers.1.encoder_attn.q_proj.weight"]
    close(g["transformer.decoder.layers.1.multihead_attn.in_proj_weight"][:48], q, "q_proj")
    close(g["transformer.encoder.layers.0.linear1.weight"],
          hg["model.encoder.layers.0.fc1.weight"], "fc1")
    shared = g["src_tok_emb.embedding.weight"] + g["tgt_tok_emb.embedding.weight"] + \
        g["generator.weight"]
    close(shared, hg["model.shared.weight"], "shared")
    if tr.arch.positions == "learned":
        close(g["tgt_pos_emb.weight"], hg["model.decoder.embed_positions.weight"], "positions")
        close(g["src_emb_norm.weight"], hg["model.encoder.layernorm_embedding.weight"], "ln")


@pytest.mark.parametrize("compute_type", ["int8", "bfloat16"])
def test_converted_directory_loads_without_the_libraries(pair, tmp_path, compute_type):
    model, tr, path = pair
    out = tmp_path / "converted"
    q = load_pretrained(path, compute_type=compute_type)
    q.save(out)
    assert (out / "fastattn-pretrained.json").exists()
    back = load_pretrained(out)
    assert back.compute_type == compute_type and back.arch == tr.arch
    src = batch(tr)
    np.testing.assert_array_equal(back.logits(src, src[:, :5]), q.logits(src, src[:, :5]))
    code = ("import sys; sys.modules.update(dict.fromkeys(['transformers', 'torch', "
            "'sentencepiece', 'tokenizers'])); import numpy as np; "
            "from fastattn import load_pretrained; "
            f"t = load_pretrained({str(out)!r}); "
            "print(t.generate(np.array([[5, 6, t.arch.eos_id]]), max_new_tokens=3))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("[[")


def test_int8_logits_close_to_float32(pair):
    _, tr, path = pair
    q = load_pretrained(path, compute_type="int8")
    src = batch(tr)
    ref = tr.logits(src, src[:, :6])
    got = q.logits(src, src[:, :6])
    # int8 weights with per-row scales: about 1% of the logits' spread on these tiny models
    assert np.abs(got - ref).max() <= 0.05 * np.abs(ref).max()


def test_hostile_directories(tmp_path):
    make(tmp_path, "marian", steps=0)
    tr = load_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        load_pretrained(tmp_path / "config.json")
    with pytest.raises(ValueError, match="compute_type must be one of"):
        load_pretrained(tmp_path, compute_type="int4")
    gen = tmp_path / "generation_config.json"
    gen.write_text(json.dumps({"num_beams": "four"}))
    with pytest.raises(ValueError, match="generation_config.json: num_beams = 'four'"):
        load_pretrained(tmp_path)
    gen.write_text(json.dumps({"forced_bos_token_id": 500}))
    with pytest.raises(ValueError, match="forced_bos_token_id = 500 is outside the vocabulary"):
        load_pretrained(tmp_path)
    gen.unlink()
    out = tmp_path / "conv"
    tr.save(out)
    manifest = out / "fastattn-pretrained.json"
    raw = json.loads(manifest.read_text())
    raw["architecture"]["d_model"] = 64
    manifest.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="fastattn-pretrained.json: the architecture "
                                         "contradicts model.safetensors"):
        load_pretrained(out)
    manifest.write_text("{}")
    with pytest.raises(ValueError, match="not a manifest Translator.save wrote"):
        load_pretrained(out)


def test_generate_argument_checks(pair):
    _, tr, _ = pair
    src = batch(tr, B=2)
    with pytest.raises(ValueError, match="beam_size must be an int >= 1"):
        tr.generate(src, beam_size=0)
    with pytest.raises(ValueError, match="beam_size must be an int >= 1 and <= 120"):
        tr.generate(src, beam_size=10 ** 6)
    with pytest.raises(ValueError, match="exceed the model's 64 positions"):
        tr.generate(src, max_new_tokens=65)
    with pytest.raises(ValueError, match="early_stopping must be True, False or 'never'"):
        tr.generate(src, early_stopping=1)
    with pytest.raises(ValueError, match="src_ids must be"):
        tr.generate(src.astype(float))
    with pytest.raises(ValueError, match="src_ids: 65 tokens exceed"):
        tr.logits(np.ones((1, 65), int), np.ones((1, 2), int))
    assert tr.generate(src[:0]) == []
    assert tr.generate(src, max_new_tokens=0) == [[], []]
