"""WordTokenizer: seed 000's word-level vocabulary (23 types), the splitting rules, encode and
decode, min_freq and the size cap."""
import pytest

from fastattn.tokenizers import WordTokenizer
from tokenizer_texts import GOT, GOT_VOCAB


def test_seed_word_vocabulary_has_23_types():
    # The seed lists "Know", "He", "When", "The"... capitalised but counts 23: that count needs
    # lowercasing ("The" and "the" are one type; the text's "know" is the seed's "Know").
    tok = WordTokenizer(lowercase=True, specials=()).train(GOT)
    assert tok.vocab_size == 23
    assert tok.vocab.tokens == [w.lower() for w in GOT_VOCAB]   # first-occurrence order
    assert WordTokenizer(lowercase=False, specials=()).train(GOT).vocab_size == 24  # + "The"
    with_specials = WordTokenizer().train(GOT)
    assert with_specials.vocab_size == 27
    assert with_specials.vocab.token_to_id("i") == 4


def test_word_splitting_rules():
    tok = WordTokenizer().train(GOT)
    # seed 001: "Where can I find a pizzeria?" -> [where, can, i, find, a, pizzeria]
    assert tok.tokenize("Where can I find a pizzeria?") == [
        "where", "can", "i", "find", "a", "pizzeria"]
    assert tok.tokenize("The true enemy won't wait") == ["the", "true", "enemy", "won't", "wait"]
    assert tok.tokenize("'quoted' \"words\" dogs' rock'n'roll won\u2019t") == [
        "quoted", "words", "dogs", "rock'n'roll", "won\u2019t"]
    assert tok.tokenize("storm,He N.Y.C well-known $5 <pad>") == [
        "storm", "he", "n", "y", "c", "well", "known", "5", "pad"]
    assert WordTokenizer(lowercase=False).train(GOT).tokenize("When He") == ["When", "He"]


def test_word_encode_decode():
    tok = WordTokenizer().train(GOT)
    ids = tok.encode("You win, or you DIE!")
    assert ids == [tok.vocab.token_to_id(w) for w in ["you", "win", "or", "you", "die"]]
    assert tok.decode(ids) == "you win or you die"
    unknown = tok.encode("you lose")
    assert unknown == [tok.vocab.token_to_id("you"), tok.unk_id]
    assert tok.decode(unknown) == "you"                       # specials are dropped
    assert tok.encode("die", add_start_end=True) == [tok.start_id, tok.vocab.token_to_id("die"),
                                                     tok.end_id]
    strict = WordTokenizer(specials=()).train(GOT)
    with pytest.raises(ValueError, match="'lose'"):
        strict.encode("you lose")


def test_word_min_freq_and_vocab_size():
    texts = ["b a c a b a d"]                     # a x3, b x2, c x1, d x1
    assert WordTokenizer().train(texts).vocab.tokens == ["b", "a", "c", "d"]
    assert WordTokenizer().train(texts, min_freq=2).vocab.tokens == ["b", "a"]
    # vocab_size counts the specials; most frequent kept, ties by first occurrence ("c" before "d")
    assert WordTokenizer().train(texts, vocab_size=7).vocab.tokens == ["b", "a", "c"]
    assert WordTokenizer(specials=()).train(texts, vocab_size=1).vocab.tokens == ["a"]
    with pytest.raises(ValueError, match="vocab_size"):
        WordTokenizer().train(texts, vocab_size=3)
