"""encode_head: the first ids of a text without splitting all of it. Its ids are encode()'s
first ones for every tokenizer (word, char, BPE; lowercase and the final sigma included), so
the runners' cut sources are what they were when the whole text was split; a text of
millions of characters costs what its head does (the memory bound is checked end to end in
tests/runners/test_long_lines.py)."""
import random
import sys

import pytest
from hypothesis import given, strategies as st

from fastattn.tokenizers import BPETokenizer, CharTokenizer, WordTokenizer
from tokenizer_texts import BPE_TRAIN, GOT

TRAIN = GOT + BPE_TRAIN + ["ΑΣ ΣΑΣ σας Σ.Σ' won't x'y", "a.b,c!!d 'e' f'' g'h"]
TOKENIZERS = {
    "word": WordTokenizer().train(TRAIN),
    "word-cased": WordTokenizer(lowercase=False).train(TRAIN),
    "char": CharTokenizer().train(TRAIN),
    "char-lower": CharTokenizer(lowercase=True).train(TRAIN),
    "bpe": BPETokenizer().train(TRAIN, vocab_size=160),
}
PIECES = ["a", "b", "Σ", "ΑΣ", "σ", "'", ".", "!", "won't", " ", "  ", "\t", "\n", "\u3000",
          "she", "sells", "東京", "😀", "I", "İ", "x</w>y", "<pad>", "\u0301"]


def check_head(tok, text, n):
    whole = tok.encode(text)
    ids, more = tok.encode_head(text, n)
    assert ids == whole[:n], (text[:80], n)
    assert more == (len(whole) > n)


@pytest.mark.parametrize("name", TOKENIZERS)
@given(pieces=st.lists(st.sampled_from(PIECES), max_size=60), n=st.integers(0, 40))
def test_head_is_the_first_ids_of_encode(name, pieces, n):
    check_head(TOKENIZERS[name], "".join(pieces), n)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_long_texts_read_in_windows_give_the_same_ids(name, monkeypatch):
    """Texts longer than the first window, with word ends and long whitespace-free runs at
    and around the window edges (the windows are made small so that they are crossed)."""
    import fastattn.tokenizers.base as base
    monkeypatch.setattr(base, "HEAD_WINDOW", 16)
    tok = TOKENIZERS[name]
    monkeypatch.setattr(tok, "_head_window", lambda n: 16)
    rng = random.Random(0)
    for _ in range(400):
        text = "".join(rng.choice(PIECES) * rng.choice([1, 1, 1, 3, 20]) for _ in
                       range(rng.randint(0, 80)))
        for n in (0, 1, 3, 7, 20):
            if name == "bpe" and any(len(r) > 8 for r in text.split()):
                continue                  # a run over a window: see the test below
            check_head(tok, text, n)


def test_a_bpe_run_longer_than_the_window_is_merged_in_windows():
    """A run without whitespace of a million characters: the pieces kept (the run's first
    half, merged without </w>) are those of the whole word, and the work stays small."""
    tok = TOKENIZERS["bpe"]
    word = "seashells" * 111_112
    ids, more = tok.encode_head(word, 50)
    assert more and len(ids) == 50
    assert ids == tok.encode(word[:20_000])[:50]
    ids, more = tok.encode_head("she sells " + word, 50)
    assert ids == tok.encode("she sells " + word[:20_000])[:50]


def test_a_long_line_without_words_is_read_whole_in_bounded_tokens():
    """Punctuation only: no token at all, however long; a huge word: one <unk>."""
    tok = TOKENIZERS["word"]
    assert tok.encode_head(". " * 300_000, 5) == ([], False)
    ids, more = tok.encode_head("a" * 1_000_000 + " won't", 5)
    assert ids == [tok.unk_id, tok.encode("won't")[0]] and not more


def test_encode_batch_cuts_as_before():
    tok = TOKENIZERS["bpe"]
    texts = [" ".join(GOT) * 3, "", "she"]
    ids, mask = tok.encode_batch(texts, add_start_end=True, max_length=12)
    for row, text in zip(ids.tolist(), texts):
        whole = tok.encode(text)[:10]
        assert row[:len(whole) + 2] == [tok.start_id] + whole + [tok.end_id]


def test_arguments_are_checked():
    tok = TOKENIZERS["char"]
    with pytest.raises(TypeError, match="text must be str"):
        tok.encode_head(b"abc", 3)
    with pytest.raises(ValueError, match="max_tokens must be >= 0, got -1"):
        tok.encode_head("abc", -1)
    with pytest.raises(TypeError, match="max_tokens must be an int"):
        tok.encode_head("abc", 2.0)


LONG_RUNS = {
    "word-long-word-then-short-ones": ("word", "a" * 300_000 + ".bc" * 300_000),
    "word-long-word-then-words": ("word", "a" * 300_000 + " bc" * 300_000),
    "word-sigma-then-punctuation": ("word", "ΑΣ" + ".'" * 300_000 + "b c"),
    "bpe-long-whitespace": ("bpe", "she " + " " * 600_000 + "sells"),
    "bpe-long-word-then-words": ("bpe", "sells" * 60_000 + " she" * 150_000),
    "bpe-words-after-whitespace": ("bpe", "she" + " " * 300_000 + " she" * 300_000),
    "char-sigma-then-letters": ("char-lower", "Σ" + "a" * 600_000),
    "char-sigma-then-ignored": ("char-lower", "aΣ" + "'" * 600_000 + "b"),
}


@pytest.mark.parametrize("name, text", LONG_RUNS.values(), ids=LONG_RUNS)
def test_a_head_after_a_long_run_costs_what_the_head_does(name, text):
    """Windows grow past a long run, and the window that passes it can hold many tokens:
    only n + 1 of them are split out."""
    import tracemalloc
    tok = TOKENIZERS[name]
    whole = tok.encode(text)
    tracemalloc.start()
    try:
        ids, more = tok.encode_head(text, 10)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert ids == whole[:10] and more == (len(whole) > 10)
    assert peak < 12 * sys.getsizeof(text), peak   # copies of the text, not a token per word
