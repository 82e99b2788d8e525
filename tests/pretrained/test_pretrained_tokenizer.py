"""fastattn.pretrained.load_tokenizer against transformers' own tokenizers (the oracle), on model
directories laid out as transformers saves them: tiny sentencepiece and byte-level BPE models
trained here on a few lines, wrapped in each family's tokenizer class, save_pretrained beside a
tiny config.json. Same ids and mask for a batch, same decoded text, the language codes, the
truncation and the text cut before it, and the directories it must refuse."""
import json
import shutil
import sys

import numpy as np
import pytest

from fastattn.pretrained import read_config
from fastattn.pretrained import tokenizer as tk
from fastattn.pretrained.tokenizer import load_tokenizer

LINES = """The quick brown fox jumps over the lazy dog.
Ein schneller brauner Fuchs springt über den faulen Hund.
Le renard brun rapide saute par-dessus le chien paresseux.
I have 3 apples and 12 oranges, costing $4.50 in total!
Wie geht es dir heute? Mir geht es gut, danke.
Où est la bibliothèque? Elle est à côté de la gare.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024.
Translation models turn sentences into other sentences.
Grüße aus München, Zürich und Köln — schön, oder?
Ça va très bien, merci beaucoup à vous.
The weather is nice today; let's go for a walk.
Das Wetter ist heute schön; lass uns spazieren gehen.""".splitlines()

TEXTS = ["Hello world!", "", "  extra   spaces  here ", "Grüße 123 ½ 😀 café",
         "a</s>b <unk> c x<mask>y <pad>", "Numbers 0 1 2 3 4 5 6 7 8 9 10 100 2024.",
         "\tTabs\nand newlines\r\n", "Où est la bibliothèque? Ça va très bien.",
         "日本語のテキスト",
         ">>fra<< The weather is nice", "eng_Latn fra_Latn __de__ en_XX inside", "don't , . ?"]

TINY = dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
            max_position_embeddings=64)


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """Two sentencepiece models (unigram, BPE) and a byte-level BPE (vocab.json, merges.txt)
    trained on LINES: the raw material of every directory below."""
    spm = pytest.importorskip("sentencepiece")
    tokenizers = pytest.importorskip("tokenizers")
    d = tmp_path_factory.mktemp("models")
    for name, kind in (("uni", "unigram"), ("bpe", "bpe")):
        spm.SentencePieceTrainer.train(sentence_iterator=iter(LINES * 3),
                                       model_prefix=str(d / name), vocab_size=120,
                                       model_type=kind, character_coverage=1.0, minloglevel=2)
    bl = tokenizers.ByteLevelBPETokenizer()
    bl.train_from_iterator(LINES * 3, vocab_size=400, min_frequency=2, show_progress=False,
                           special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    (d / "bytes").mkdir()
    bl.save_model(str(d / "bytes"))
    vocab = json.loads((d / "bytes" / "vocab.json").read_text())
    vocab["<mask>"] = len(vocab)
    (d / "bytes" / "vocab.json").write_text(json.dumps(vocab))
    return d


def pieces(spm, path):
    sp = spm.SentencePieceProcessor(model_file=str(path))
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def marian_vocab(pieces):
    """A Marian vocab.json: </s> 0, <unk> 1, the pieces, a language token, <pad> last."""
    vocab = {"</s>": 0, "<unk>": 1}
    for p in pieces + [">>fra<<"]:
        if p != "<s>":
            vocab.setdefault(p, len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


def save_config(d, family, vocab_size, **ids):
    transformers = pytest.importorskip("transformers")
    cls = {"marian": "MarianConfig", "m2m_100": "M2M100Config", "bart": "BartConfig",
           "mbart": "MBartConfig"}[family]
    getattr(transformers, cls)(vocab_size=vocab_size, **TINY, **ids).save_pretrained(d)


def build(kind, models, d):
    """A model directory of tokenizer class `kind` in d; returns transformers' tokenizer."""
    transformers = pytest.importorskip("transformers")
    spm = pytest.importorskip("sentencepiece")
    T = transformers
    src = d.parent / (d.name + "-src")
    src.mkdir()
    if kind == "marian":                      # OPUS-MT: two spm models, one joint vocab.json
        vocab = marian_vocab(pieces(spm, models / "uni.model") + pieces(spm, models / "bpe.model"))
        (src / "vocab.json").write_text(json.dumps(vocab))
        tok = T.MarianTokenizer(source_spm=str(models / "uni.model"),
                                target_spm=str(models / "bpe.model"), vocab=str(src / "vocab.json"))
        save_config(d, "marian", len(vocab), pad_token_id=vocab["<pad>"], eos_token_id=0,
                    decoder_start_token_id=vocab["<pad>"], forced_eos_token_id=0)
    elif kind == "marian-separate":           # separate_vocabs: target_vocab.json, target.spm
        vocab = marian_vocab(pieces(spm, models / "uni.model"))
        target = marian_vocab(pieces(spm, models / "bpe.model"))
        (src / "vocab.json").write_text(json.dumps(vocab))
        (src / "target_vocab.json").write_text(json.dumps(target))
        tok = T.MarianTokenizer(source_spm=str(models / "uni.model"),
                                target_spm=str(models / "bpe.model"), vocab=str(src / "vocab.json"),
                                target_vocab_file=str(src / "target_vocab.json"),
                                separate_vocabs=True)
        save_config(d, "marian", len(vocab), decoder_vocab_size=len(target),
                    share_encoder_decoder_embeddings=False, pad_token_id=vocab["<pad>"],
                    eos_token_id=0, decoder_start_token_id=vocab["<pad>"], forced_eos_token_id=0)
    elif kind == "m2m100":                    # vocab.json in fairseq's order + the spm model
        vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
        for p in pieces(spm, models / "bpe.model")[3:]:
            vocab.setdefault(p, len(vocab))
        (src / "vocab.json").write_text(json.dumps(vocab))
        codes = tk.M2M100_LANGUAGES["m2m100"]
        tok = T.M2M100Tokenizer(vocab_file=str(src / "vocab.json"),
                                spm_file=str(models / "bpe.model"),
                                additional_special_tokens=[f"__{c}__" for c in codes])
        save_config(d, "m2m_100", len(vocab) + len(codes) + 8)   # + 8 made-up words, as fairseq
    elif kind == "nllb":                      # converted from the spm model, + language codes
        from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES
        shutil.copy(models / "bpe.model", src / "sentencepiece.bpe.model")
        tok = T.NllbTokenizer.from_pretrained(str(src))
        tok.add_tokens(FAIRSEQ_LANGUAGE_CODES, special_tokens=True)
        tok.src_lang = "eng_Latn"
        save_config(d, "m2m_100", len(tok) + 2)
    elif kind in ("mbart", "mbart50"):
        shutil.copy(models / "uni.model", src / "sentencepiece.bpe.model")
        cls = T.MBartTokenizer if kind == "mbart" else T.MBart50Tokenizer
        tok = cls.from_pretrained(str(src))
        save_config(d, "mbart", len(tok))
    elif kind in ("bart", "bart-files"):      # byte-level BPE: vocab.json + merges.txt
        for f in ("vocab.json", "merges.txt"):
            shutil.copy(models / "bytes" / f, (src if kind == "bart" else d) / f)
        tok = T.BartTokenizer.from_pretrained(str(src if kind == "bart" else d))
        save_config(d, "bart", len(tok))
        if kind == "bart-files":              # as old BART directories: no tokenizer.json
            return tok
    tok.save_pretrained(d)
    return T.AutoTokenizer.from_pretrained(str(d))


KINDS = ["marian", "marian-separate", "m2m100", "nllb", "bart", "bart-files", "mbart", "mbart50"]
SRC_LANG = {"m2m100": "de", "nllb": "fra_Latn", "mbart": "ro_RO", "mbart50": "fr_XX"}


@pytest.fixture(scope="session")
def dirs(models, tmp_path_factory):
    """{kind: (directory, transformers' tokenizer)}, made once."""
    import warnings
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                 # Marian: "pip install sacremoses"
        for kind in KINDS:
            d = tmp_path_factory.mktemp(kind)
            out[kind] = (d, build(kind, models, d))
    return out


def ours(d):
    return load_tokenizer(d, read_config(d))


def oracle(hf, texts, **kw):
    enc = hf(texts, padding=True, **kw)
    return np.array(enc["input_ids"], np.int64), np.array(enc["attention_mask"]) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_encode_batch_equals_transformers(dirs, kind):
    d, hf = dirs[kind]
    tok = ours(d)
    ids, mask = tok.encode_batch(TEXTS)
    want_ids, want_mask = oracle(hf, TEXTS)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(mask, want_mask)
    assert ids.dtype == np.int64 and mask.dtype == bool
    assert (tok.pad_id, tok.eos_id) == (hf.pad_token_id, hf.eos_token_id)
    assert tok.vocab_size == len(hf) and ids.max() < tok.vocab_size
    assert tok.family == read_config(d).family


@pytest.mark.parametrize("kind", list(SRC_LANG))
def test_src_lang_and_lang_id(dirs, kind):
    d, hf = dirs[kind]
    tok = ours(d)
    code = SRC_LANG[kind]
    hf.src_lang = code
    try:
        want_ids, _ = oracle(hf, TEXTS[:4])
    finally:
        hf.src_lang = tok._src
    np.testing.assert_array_equal(tok.encode_batch(TEXTS[:4], src_lang=code)[0], want_ids)
    want = hf.get_lang_id(code) if kind == "m2m100" else hf.convert_tokens_to_ids(code)
    assert tok.lang_id(code) == want and code in tok.lang_codes
    with pytest.raises(ValueError, match=r"unknown src_lang 'xx_Zzzz' for this \w+Tokenizer: "
                                         r"it knows \d+ codes, e\.g\. "):
        tok.encode_batch(["a"], src_lang="xx_Zzzz")
    with pytest.raises(ValueError, match="unknown language code 'zz'"):
        tok.lang_id("zz")


def test_nllb_legacy_behaviour(dirs, tmp_path):
    """legacy_behaviour: the language code after </s>, as the old NLLB tokenizer put it."""
    transformers = pytest.importorskip("transformers")
    d = tmp_path / "nllb"
    shutil.copytree(dirs["nllb"][0], d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["legacy_behaviour"] = True
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    hf = transformers.AutoTokenizer.from_pretrained(str(d))
    np.testing.assert_array_equal(ours(d).encode_batch(TEXTS)[0], oracle(hf, TEXTS)[0])


@pytest.mark.parametrize("kind", ["marian", "bart"])
def test_no_language_codes(dirs, kind):
    tok = ours(dirs[kind][0])
    with pytest.raises(ValueError, match=f"{kind} models have no src_lang"):
        tok.encode_batch(["a"], src_lang="en")
    with pytest.raises(ValueError, match=f"{kind} models have no language code"):
        tok.lang_id("en")


@pytest.mark.parametrize("kind", KINDS)
def test_decode_equals_transformers(dirs, kind):
    d, hf = dirs[kind]
    tok = ours(d)
    rng = np.random.default_rng(0)
    rows = list(tok.encode_batch(TEXTS)[0])                     # with special tokens, padding
    top = read_config(d).decoder_vocab_size
    rows += [rng.integers(0, top, n) for n in (1, 5, 17, 40)]
    rows += [np.array([tok.eos_id, tok.pad_id]), np.array([], np.int64)]
    for row in rows:
        want = hf.decode([int(i) for i in row], skip_special_tokens=True)
        assert tok.decode(row) == want, list(row)
        assert tok.decode(list(row)) == want
    with pytest.raises(ValueError, match="outside the model's target vocabulary"):
        tok.decode([read_config(d).decoder_vocab_size])
    with pytest.raises(ValueError, match="one sequence of integer ids"):
        tok.decode(np.zeros((2, 3), np.int64))


@pytest.mark.parametrize("kind", ["m2m100", "nllb"])
def test_decode_ids_the_tokenizer_lacks(dirs, kind):
    """Ids inside the model's vocabulary but past the tokenizer's (M2M100's made-up words)."""
    d, hf = dirs[kind]
    tok = ours(d)
    ids = [5, 7, tok.vocab_size, read_config(d).decoder_vocab_size - 1, 9]
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_clean_up_tokenization_spaces(dirs, tmp_path):
    """clean_up_tokenization_spaces (configs of transformers 4 often set it): applied where
    transformers applies it (not to BPE models)."""
    transformers = pytest.importorskip("transformers")
    for kind in ("mbart", "m2m100"):
        d = tmp_path / kind
        shutil.copytree(dirs[kind][0], d)
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        cfg["clean_up_tokenization_spaces"] = True
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
        hf = transformers.AutoTokenizer.from_pretrained(str(d))
        tok = ours(d)
        for row in tok.encode_batch(TEXTS)[0]:
            assert tok.decode(row) == hf.decode([int(i) for i in row], skip_special_tokens=True)


@pytest.mark.parametrize("kind", KINDS)
def test_truncation_equals_transformers(dirs, kind):
    d, hf = dirs[kind]
    tok = ours(d)
    special = 1 if kind.startswith("marian") else 2
    for m in (special, special + 1, 5, 9, 30):
        got = tok.encode_batch(TEXTS, max_length=m)
        want = oracle(hf, TEXTS, truncation=True, max_length=m)
        np.testing.assert_array_equal(got[0], want[0], err_msg=f"max_length={m}")
        np.testing.assert_array_equal(got[1], want[1])
    with pytest.raises(ValueError, match=f"max_length must be an integer >= {special}"):
        tok.encode_batch(TEXTS, max_length=special - 1 if special > 1 else 0)


@pytest.mark.parametrize("kind", ["marian", "nllb", "bart"])
def test_long_texts_are_cut_before_tokenizing(dirs, kind, monkeypatch):
    """A long line costs only its window (module doc), and the kept tokens are unchanged: with
    spaces (cut on a space), without (as Chinese or Japanese: cut mid-word, 8 tokens' margin;
    here letters the tiny vocabularies know, which fuse no unknowns into one), and a long run
    of spaces (tokens "a b c"; under the cap, so the window grows until it is read whole)."""
    d, hf = dirs[kind]
    tok = ours(d)
    seen = []
    run = tok._pieces_batch
    monkeypatch.setattr(tok, "_pieces_batch", lambda texts: seen.extend(map(len, texts))
                        or run(texts))
    long = [" ".join(LINES) * 60, "GrüßeausMünchenundKöln" * 1500]
    for texts, m in ((long, 4), (long, 40), (["a" + " " * 20000 + "b c"], 4)):
        seen.clear()
        got = tok.encode_batch(texts, max_length=m)
        want = oracle(hf, texts, truncation=True, max_length=m)
        np.testing.assert_array_equal(got[0], want[0], err_msg=f"max_length={m}")
        np.testing.assert_array_equal(got[1], want[1])
        if texts is long:                      # the first window sufficed
            assert max(seen) <= tk._WINDOW * (m + tk._MARGIN) + tk._WINDOW_ADD
        elif kind != "bart":                   # byte-level BPE keeps spaces as tokens
            assert max(seen) == len(texts[0])


def test_invalid_text(dirs):
    tok = ours(dirs["nllb"][0])
    with pytest.raises(ValueError, match=r"texts\[1\] is not valid UTF-8 text: surrogates not "
                                         r"allowed at character 2"):
        tok.encode_batch(["fine", "ab\udcff"])
    with pytest.raises(ValueError, match=r"texts\[0\] is not valid UTF-8 \(invalid start byte"):
        tok.encode_batch([b"\xff"], max_length=8)
    np.testing.assert_array_equal(tok.encode_batch([b"Hello"])[0], tok.encode_batch(["Hello"])[0])
    with pytest.raises(TypeError, match="texts must be a list of strings"):
        tok.encode_batch("Hello")


def copy(dirs, kind, tmp_path):
    d = tmp_path / kind
    shutil.copytree(dirs[kind][0], d)
    return d


@pytest.mark.parametrize("kind, gone, needs", [
    ("marian", "target.spm", "source.spm, target.spm and vocab.json"),
    ("m2m100", "sentencepiece.bpe.model", "vocab.json and sentencepiece.bpe.model"),
    ("nllb", "tokenizer.json", "tokenizer.json"),
    ("mbart", "tokenizer.json", "tokenizer.json"),
    ("bart-files", "merges.txt", "tokenizer.json, or vocab.json and merges.txt")])
def test_missing_files(dirs, tmp_path, kind, gone, needs):
    d = copy(dirs, kind, tmp_path)
    (d / gone).unlink()
    if kind == "bart-files":
        gone = "tokenizer.json \\(nor merges.txt\\)"
    with pytest.raises(FileNotFoundError, match=f"no {gone}: a \\w+ reads {needs}"):
        ours(d)


@pytest.mark.parametrize("kind, file", [("marian", "vocab.json"), ("m2m100", "vocab.json"),
                                        ("nllb", "tokenizer.json"), ("bart", "tokenizer.json"),
                                        ("bart-files", "vocab.json")])
def test_tokenizer_of_another_model(dirs, tmp_path, kind, file):
    d = copy(dirs, kind, tmp_path)
    good = json.loads((d / "config.json").read_text())
    small = dict(good, vocab_size=good["vocab_size"] - 20)
    if "decoder_vocab_size" in good:                            # Marian's
        small["decoder_vocab_size"] = small["vocab_size"]
    for key in ("pad_token_id", "decoder_start_token_id", "eos_token_id",
                "forced_eos_token_id", "bos_token_id"):
        if (small.get(key) or 0) >= small["vocab_size"]:
            small[key] = 0 if key != "pad_token_id" else 1
    (d / "config.json").write_text(json.dumps(small))
    with pytest.raises(ValueError, match=rf"{file}: has token ids up to \d+, but config.json's "
                                         r"vocab_size is \d+: a tokenizer of another model"):
        ours(d)
    (d / "config.json").write_text(json.dumps(dict(good, pad_token_id=good["pad_token_id"] - 1)))
    with pytest.raises(ValueError, match=rf"{file}: gives the pad token id \d+, but config.json's"
                                         r" pad_token_id is \d+: a tokenizer of another model"):
        ours(d)


@pytest.mark.parametrize("text, match", [
    ("[1, 2]", "must hold a JSON object of token -> id, got list"),
    ('{"a": "1"}', r"must map each token to an integer id >= 0; 'a' -> '1'"),
    ('{"a": -1}', r"must map each token to an integer id >= 0"),
    ('{"a": true}', r"must map each token to an integer id >= 0"),
    ('{"a": 1, "a": 2}', "duplicate key"),
    ("{", "is not valid JSON")])
def test_bad_vocab_json(dirs, tmp_path, text, match):
    d = copy(dirs, "marian", tmp_path)
    (d / "vocab.json").write_text(text)
    with pytest.raises(ValueError, match=f"vocab.json.*{match}"):
        ours(d)


def test_files_past_the_size_caps_and_garbage(dirs, tmp_path, monkeypatch):
    d = copy(dirs, "m2m100", tmp_path)
    monkeypatch.setattr(tk, "_MAX_MODEL", 1000)
    with pytest.raises(ValueError, match=r"sentencepiece.bpe.model: is larger than 1000 bytes: "
                                         r"not a tokenizer file"):
        ours(d)
    monkeypatch.undo()
    (d / "sentencepiece.bpe.model").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="sentencepiece.bpe.model: is not a sentencepiece model"):
        ours(d)
    d = copy(dirs, "nllb", tmp_path)
    monkeypatch.setattr(tk, "_MAX_TOKENIZER_JSON", 1000)
    with pytest.raises(ValueError, match=r"tokenizer.json: is larger than"):
        ours(d)
    monkeypatch.undo()
    (d / "tokenizer.json").write_text('{"version": "1.0"}')
    with pytest.raises(ValueError, match="tokenizer.json: is not a tokenizers file"):
        ours(d)


def test_tokenizer_class_of_another_family(dirs, tmp_path):
    d = copy(dirs, "nllb", tmp_path)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps(dict(cfg, tokenizer_class="T5Tokenizer")))
    with pytest.raises(ValueError, match="tokenizer_class 'T5Tokenizer' is not one fastattn reads "
                                         "for m2m_100 models"):
        ours(d)
    cfg["tokenizer_class"] = "NllbTokenizerFast"                 # as transformers 4 saved it
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert ours(d).kind == "NllbTokenizer"


@pytest.mark.parametrize("kind, module", [("marian", "sentencepiece"), ("nllb", "tokenizers")])
def test_missing_package_says_which_extra(dirs, monkeypatch, kind, module):
    d = dirs[kind][0]
    monkeypatch.setitem(sys.modules, module, None)          # import fails as if not installed
    with pytest.raises(ImportError, match=rf"needs the {module} package: "
                                          r'pip install "fastattn\[hf\]"'):
        ours(d)
