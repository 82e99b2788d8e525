"""CharTokenizer: seed 001's character list, exact round trips, unknown characters."""
import functools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastattn.tokenizers import CharTokenizer
from tokenizer_texts import BPE_ALPHABET, BPE_TRAIN


@functools.lru_cache(maxsize=None)
def _char_tokenizer():
    return CharTokenizer().train(BPE_TRAIN)


def test_seed_char_vocabulary():
    tok = CharTokenizer(lowercase=True, specials=()).train("Where can I find a pizzeria?")
    # the seed's list leaves out the space and the "?"
    assert [c for c in tok.vocab.tokens if c not in " ?"] == list("acdefhinprwz")
    assert tok.vocab.tokens == sorted(tok.vocab.tokens)      # code point order


@given(st.text(alphabet=BPE_ALPHABET, max_size=60))
def test_char_round_trip(text):
    tok = _char_tokenizer()
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert tok.unk_id not in ids
    assert tok.decode(ids) == text


def test_char_unknown():
    tok = _char_tokenizer()
    assert tok.encode("aQ") == [tok.vocab.token_to_id("a"), tok.unk_id]
    with pytest.raises(ValueError, match="'Q'"):
        CharTokenizer(specials=()).train(BPE_TRAIN).encode("aQ")


def test_char_min_freq_and_vocab_size():
    text = "bacabad"                                 # a x3, b x2, c x1, d x1
    assert CharTokenizer(specials=()).train(text).vocab.tokens == ["a", "b", "c", "d"]
    assert CharTokenizer(specials=()).train(text, min_freq=2).vocab.tokens == ["a", "b"]
    # vocab_size counts the specials; most frequent kept, ties by first occurrence ("c" before
    # "d"), then code point order
    assert CharTokenizer().train(text, vocab_size=7).vocab.tokens == ["a", "b", "c"]
    assert CharTokenizer().train(text, vocab_size=5).vocab.tokens == ["a"]
    with pytest.raises(ValueError, match="vocab_size"):
        CharTokenizer().train(text, vocab_size=3)
    with pytest.raises(ValueError, match="min_freq"):
        CharTokenizer().train(text, min_freq=0)
