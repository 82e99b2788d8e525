"""The API every tokenizer shares (fastattn.tokenizers.base): batches, padding and truncation,
special ids, bad arguments, use before training, text that spells a special token."""
import numpy as np
import pytest

from fastattn.tokenizers import BPETokenizer, CharTokenizer, NotFittedError, WordTokenizer
from tokenizer_texts import GOT


def test_encode_batch_shapes_padding_mask():
    tok = WordTokenizer().train(GOT)
    texts = ["you win", "", "the true enemy won't wait"]
    ids, mask = tok.encode_batch(texts)
    assert ids.shape == mask.shape == (3, 5)
    assert ids.dtype == np.int64 and mask.dtype == np.bool_
    for b, t in enumerate(texts):
        n = len(tok.encode(t))
        assert ids[b, :n].tolist() == tok.encode(t)
        assert (ids[b, n:] == tok.pad_id).all()
        assert not mask[b, :n].any() and mask[b, n:].all()
    assert tok.decode_batch(ids) == ["you win", "", "the true enemy won't wait"]

    ids, mask = tok.encode_batch(texts, add_start_end=True)
    assert ids.shape == (3, 7)
    assert (ids[:, 0] == tok.start_id).all()
    assert ids[0, :4].tolist() == [tok.start_id] + tok.encode("you win") + [tok.end_id]
    assert ids[1, :2].tolist() == [tok.start_id, tok.end_id] and mask[1, 2:].all()
    assert (~mask).sum(axis=1).tolist() == [4, 2, 7]

    empty_ids, empty_mask = tok.encode_batch([])
    assert empty_ids.shape == empty_mask.shape == (0, 0) and empty_ids.dtype == np.int64


def test_encode_batch_truncation():
    tok = WordTokenizer().train(GOT)
    texts = ["the true enemy won't wait", "you"]
    ids, mask = tok.encode_batch(texts, max_length=3)
    assert ids.shape == (2, 3)
    assert ids[0].tolist() == tok.encode(texts[0])[:3]
    assert mask[1].tolist() == [False, True, True]
    ids, mask = tok.encode_batch(texts, add_start_end=True, max_length=4)
    assert ids.shape == (2, 4)
    assert ids[0].tolist() == [tok.start_id] + tok.encode(texts[0])[:2] + [tok.end_id]
    assert ids[1].tolist() == [tok.start_id, tok.encode("you")[0], tok.end_id, tok.pad_id]
    ids, _ = tok.encode_batch(texts, add_start_end=True, max_length=2)
    assert ids.tolist() == [[tok.start_id, tok.end_id]] * 2
    with pytest.raises(ValueError, match="max_length"):
        tok.encode_batch(texts, add_start_end=True, max_length=1)
    with pytest.raises(ValueError, match="max_length"):
        tok.encode_batch(texts, max_length=0)


def test_encode_batch_needs_pad_and_start_end():
    with pytest.raises(ValueError, match="<pad>"):
        WordTokenizer(specials=()).train(GOT).encode_batch(["you"])
    tok = BPETokenizer(specials=("<pad>", "<unk>")).train(GOT, num_merges=10)
    assert tok.start_id is None and tok.end_id is None
    ids, mask = tok.encode_batch(["you", "you win"])
    assert ids.shape == (2, len(tok.encode("you win")))
    with pytest.raises(ValueError, match="<start>"):
        tok.encode_batch(["you"], add_start_end=True)


def test_special_ids():
    tok = CharTokenizer(specials=("<unk>", "<pad>", "<mask>")).train("ab")
    assert (tok.unk_id, tok.pad_id, tok.start_id, tok.end_id) == (0, 1, None, None)
    assert tok.vocab.tokens == ["a", "b"] and tok.vocab_size == 5
    assert tok.decode([2, 3, 1, 4, 0]) == "ab"               # every special dropped
    none = CharTokenizer(specials=()).train("ab")
    assert (none.pad_id, none.unk_id, none.start_id, none.end_id) == (None,) * 4
    assert none.encode("ba") == [1, 0]


@pytest.mark.parametrize("make", [
    lambda: WordTokenizer().train(GOT), lambda: CharTokenizer().train(GOT),
    lambda: BPETokenizer().train(GOT, num_merges=20)])
def test_bad_input(make):
    tok = make()
    for bad in [None, 3, b"bytes", ["a"]]:
        with pytest.raises(TypeError, match="text must be str"):
            tok.encode(bad)
    n = tok.vocab_size
    with pytest.raises(ValueError, match=f"token id {n} "):
        tok.decode([4, n])
    with pytest.raises(ValueError, match="token id -3 "):
        tok.decode(np.array([4, -3]))
    with pytest.raises(TypeError):
        tok.decode(["a"])
    with pytest.raises(TypeError):
        tok.decode([1.0])
    with pytest.raises(TypeError):
        tok.decode("abc")
    with pytest.raises(ValueError, match="decode_batch"):
        tok.decode(np.zeros((2, 2), np.int64))
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        tok.encode_batch(["a", 2])
    with pytest.raises(TypeError, match="list of str"):
        tok.encode_batch("abc")
    assert tok.decode(np.array(tok.encode("you"), np.int32)) == tok.decode(tok.encode("you"))


@pytest.mark.parametrize("tok", [WordTokenizer(), CharTokenizer(), BPETokenizer()])
def test_not_trained(tok):
    for call in [lambda: tok.encode("a"), lambda: tok.decode([0]),
                 lambda: tok.encode_batch(["a"]), lambda: tok.vocab_size]:
        with pytest.raises(NotFittedError, match=r"not trained; call train\(texts\) first"):
            call()
    with pytest.raises(TypeError, match=r"texts\[1\] must be str"):
        tok.train(["a", 1], vocab_size=10)
    assert not tok.is_fitted
    assert tok.pad_id == 0                                   # known before training


@pytest.mark.parametrize("cls,size", [(WordTokenizer, 20), (CharTokenizer, 20),
                                      (BPETokenizer, 40)])      # BPE's base alone is 33
def test_train_is_the_one_verb(cls, size):
    texts = GOT * 3
    tok = cls()
    assert tok.train(texts, vocab_size=size) is tok and tok.is_fitted
    assert tok.vocab_size == size              # the whole vocabulary, specials included
    assert cls().train(texts, size).vocab == tok.vocab    # vocab_size is the second argument
    assert not hasattr(tok, "fit")
    with pytest.raises(ValueError, match="vocab_size"):
        cls().train(texts, vocab_size=3)        # smaller than the specials (and BPE's base)
    with pytest.raises(TypeError, match="vocab_size"):
        cls().train(texts, vocab_size=float(size))


def test_text_clashing_with_special_is_refused():
    with pytest.raises(ValueError, match="'x'.*special"):
        CharTokenizer(specials=("x",)).train("axb")
    with pytest.raises(ValueError, match="'PAD'.*special"):
        WordTokenizer(lowercase=False, specials=("PAD",)).train("a PAD")
