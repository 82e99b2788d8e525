"""Tokenizer files: save/load round trips, and files that are not what save() wrote."""
import json

import pytest

import fastattn.tokenizers as ftok
from fastattn.tokenizers import BPETokenizer, CharTokenizer, NotFittedError, WordTokenizer
from tokenizer_texts import BPE_TRAIN, GOT, SEASHELLS


@pytest.mark.parametrize("make", [
    lambda: WordTokenizer(lowercase=False).train(GOT, vocab_size=20),
    lambda: CharTokenizer(specials=("<pad>", "<unk>")).train(BPE_TRAIN),
    lambda: BPETokenizer().train(BPE_TRAIN, num_merges=150),
    lambda: BPETokenizer(),
])
def test_save_load_round_trip(tmp_path, make):
    tok = make()
    path = tmp_path / "tok.json"
    tok.save(path)
    back = ftok.load(path)
    assert type(back) is type(tok)
    assert back.to_dict() == tok.to_dict() and back == tok
    assert type(tok).load(str(path)) == tok
    if tok.is_fitted:
        assert back.vocab == tok.vocab
        for text in BPE_TRAIN:
            assert back.encode(text) == tok.encode(text)
    else:
        with pytest.raises(NotFittedError):
            back.encode("x")


def test_load_bad_files(tmp_path):
    path = tmp_path / "tok.json"
    WordTokenizer().train(GOT).save(path)
    with pytest.raises(ValueError, match="holds a WordTokenizer, not a BPETokenizer"):
        BPETokenizer.load(path)
    d = json.loads(path.read_text())
    for change, pattern in [({"format": "other"}, "not a fastattn tokenizer"),
                            ({"class": "Pickle"}, "unknown tokenizer class 'Pickle'"),
                            ({"config": {"bogus": 1}}, "does not build"),
                            ({"tokens": ["a", "a"]}, "'a' is given twice"),
                            ({"tokens": [1]}, "tokens must be a list of str")]:
        (tmp_path / "bad.json").write_text(json.dumps({**d, **change}))
        with pytest.raises(ValueError, match=pattern):
            ftok.load(tmp_path / "bad.json")
    bpe = BPETokenizer().train([SEASHELLS], num_merges=3).to_dict()
    bpe["merges"].append(["q", "z"])
    (tmp_path / "bad.json").write_text(json.dumps(bpe))
    with pytest.raises(ValueError, match="bad merge"):
        ftok.load(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text("not json")
    with pytest.raises(ValueError, match="not a JSON tokenizer file"):
        ftok.load(tmp_path / "bad.json")
