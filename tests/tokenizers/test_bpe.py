"""BPETokenizer: seed 001's worked example, a naive trainer to match merge for merge, exact
round trips, whitespace and marker text, the stopping rules, speed.

Oracles: the seed corpus "she sells seashells by the seashore" and its base vocabulary, merge
sequences worked out by hand, and ``naive_bpe`` below (re-counts every pair at every step),
which the incremental trainer must match merge for merge.
"""
import functools
import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastattn.tokenizers import END_OF_WORD, SPECIALS, BPETokenizer
from tokenizer_texts import BPE_ALPHABET, BPE_TRAIN, SEASHELLS


@functools.lru_cache(maxsize=None)
def _bpe_tokenizer():
    return BPETokenizer().train(BPE_TRAIN, num_merges=150)


def test_seed_bpe_corpus_and_first_merges():
    tok = BPETokenizer(specials=()).train([SEASHELLS], num_merges=0)
    # seed: "she_ sells_ ..." and base vocabulary "_, a, b, e, h, l, o, r, s, t, y" (+ the space)
    assert tok.vocab.tokens == [END_OF_WORD, " "] + list("abehlorsty")
    assert tok.tokenize("she") == ["s", "h", "e", END_OF_WORD]

    # The seed's first four additions (sh, he, e_, se) are exactly the pairs tied at the top
    # count, 3, before any merge.
    words = [list(w) + [END_OF_WORD] for w in SEASHELLS.split()]
    counts = Counter(p for w in words for p in zip(w, w[1:]))
    top = max(counts.values())
    assert top == 3
    assert {p for p, c in counts.items() if c == top} == {
        ("s", "h"), ("h", "e"), ("e", END_OF_WORD), ("s", "e")}

    # Our tie-break (smallest (left, right) by code point) takes them as e</w>, se, sh. The
    # seed's order (sh, he, e_, se, she) is not a strict BPE run under any tie-break: after
    # "sh" is merged, "he" is left only in "the" (count 1) while e_ and se still count 3.
    # Hand-worked continuation: ash (2: seashells, seashore; ties ll, ls, s</w>, sea are
    # larger), ll, lls, lls</w>, seash (all 2), then the count-1 pairs from the smallest: by.
    tok = BPETokenizer().train([SEASHELLS], num_merges=9)
    assert tok.merges == [
        ("e", END_OF_WORD), ("s", "e"), ("s", "h"), ("a", "sh"), ("l", "l"), ("ll", "s"),
        ("lls", END_OF_WORD), ("se", "ash"), ("b", "y")]
    assert tok.tokenize(SEASHELLS) == [
        "sh", "e</w>", "se", "lls</w>", "seash", "e", "lls</w>", "by", "</w>",
        "t", "h", "e</w>", "seash", "o", "r", "e</w>"]
    assert tok.decode(tok.encode(SEASHELLS)) == SEASHELLS
    # the first merge alone is one of the seed's four
    first = BPETokenizer().train([SEASHELLS], num_merges=1).merges
    assert first == [("e", END_OF_WORD)]


def naive_bpe(texts, num_merges, specials):
    """Obviously-correct BPE: re-count every pair each step; the documented rules, no index."""
    freq = Counter(w for t in texts for w in t.split())
    segs = {w: list(w) + [END_OF_WORD] for w in freq}
    done, merges = set(), []
    while len(merges) < num_merges:
        counts = Counter()
        for w, f in freq.items():
            s = segs[w]
            for p in zip(s, s[1:]):
                counts[p] += f
        candidates = [p for p in counts if p not in done]
        if not candidates:
            break
        best = min(candidates, key=lambda p: (-counts[p], p))
        done.add(best)
        new = best[0] + best[1]
        if new in specials or (new.endswith(END_OF_WORD) and not best[1].endswith(END_OF_WORD)):
            continue
        merges.append(best)
        segs = {w: apply_merge(s, best) for w, s in segs.items()}
    return merges, segs


def apply_merge(syms, pair):
    out, i = [], 0
    while i < len(syms):
        if i + 1 < len(syms) and (syms[i], syms[i + 1]) == pair:
            out.append(pair[0] + pair[1])
            i += 2
        else:
            out.append(syms[i])
            i += 1
    return out


# Fragments that spell the marker and special tokens inside words, so refused merges happen.
_FRAGMENTS = ["a", "b", "ab", "<", "/", "w", ">", "</w>", "<w>", "<pad>", " ", " ", "\n"]


@pytest.mark.parametrize("specials", [SPECIALS, ("<pad>", "ab", "<w>")])
@given(texts=st.lists(st.lists(st.sampled_from(_FRAGMENTS), max_size=16).map("".join),
                      max_size=6),
       num_merges=st.integers(0, 30))
def test_bpe_matches_naive_trainer(specials, texts, num_merges):
    tok = BPETokenizer(specials=specials).train(texts, num_merges=num_merges)
    merges, segs = naive_bpe(texts, num_merges, specials)
    assert tok.merges == merges
    for word, seg in segs.items():                # encoding replays the training segmentation
        assert tok.tokenize(word) == seg
    assert len(set(tok.vocab)) == len(tok.vocab)
    for text in texts:
        assert tok.decode(tok.encode(text)) == text


def test_bpe_matches_naive_trainer_on_seed_corpus():
    tok = BPETokenizer().train(BPE_TRAIN, num_merges=150)
    merges, segs = naive_bpe(BPE_TRAIN, 150, SPECIALS)
    assert tok.merges == merges
    assert all(tok.tokenize(w) == s for w, s in segs.items())


@given(st.text(alphabet=BPE_ALPHABET, max_size=80))
def test_bpe_round_trip_exact(text):
    tok = _bpe_tokenizer()
    ids = tok.encode(text)
    assert tok.unk_id not in ids
    assert tok.decode(ids) == text


_PIECES = [w for t in BPE_TRAIN for w in t.split()] + [" ", "  ", "\n", "\t", "\u3000", "\r\n"]


@given(st.lists(st.sampled_from(_PIECES), max_size=20).map("".join))
def test_bpe_round_trip_of_training_words(text):
    tok = _bpe_tokenizer()
    assert tok.decode(tok.encode(text)) == text


def test_bpe_whitespace_and_marker_text():
    tok = _bpe_tokenizer()
    for text in ["", " ", "a", " a", "a ", "a  b", "a\nb", "a \n b", "\t\t", "x</w>y <pad>",
                 "</w>", "<pad>", "a<unk>b"]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text, text
        assert tok.pad_id not in ids and tok.unk_id not in ids
    # one space between words costs nothing; other whitespace is a token per character
    assert len(tok.encode("she sells")) == len(tok.encode("she")) + len(tok.encode("sells"))
    assert tok.tokenize("a\t b") == tok.tokenize("a") + ["\t", " "] + tok.tokenize("b")


def test_bpe_unknown_characters():
    tok = _bpe_tokenizer()
    assert "Q" not in "".join(BPE_TRAIN)
    ids = tok.encode("sheQ sells")
    assert ids.count(tok.unk_id) == 1
    assert tok.decode(ids) == "she sells"                    # <unk> dropped
    assert tok.encode("Q") == [tok.unk_id, tok.vocab.token_to_id(END_OF_WORD)]
    strict = BPETokenizer(specials=()).train([SEASHELLS], num_merges=5)
    with pytest.raises(ValueError, match="'Q'"):
        strict.encode("sheQ")


def test_bpe_vocab_size_and_stop():
    base = BPETokenizer().train([SEASHELLS], num_merges=0).vocab_size
    assert base == 4 + 1 + 11
    assert BPETokenizer().train([SEASHELLS], vocab_size=base + 5).vocab_size == base + 5
    everything = BPETokenizer().train([SEASHELLS], num_merges=1000)  # stops: no pair left
    assert all(len(everything.tokenize(w)) == 1 for w in SEASHELLS.split())
    with pytest.raises(ValueError, match="vocab_size=10 is smaller than the base"):
        BPETokenizer().train([SEASHELLS], vocab_size=10)
    with pytest.raises(ValueError, match="exactly one"):
        BPETokenizer().train([SEASHELLS])
    with pytest.raises(ValueError, match="exactly one"):
        BPETokenizer().train([SEASHELLS], vocab_size=100, num_merges=3)
    with pytest.raises(ValueError, match="special"):
        BPETokenizer(specials=("</w>",))


def test_bpe_train_1mb_under_10s():
    rng = np.random.default_rng(1234)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, rng.integers(2, 11))) for _ in range(20_000)]
    p = 1.0 / np.arange(1, len(words) + 1)                       # Zipf-like frequencies
    picks = rng.choice(len(words), 200_000, p=p / p.sum())
    text = " ".join(words[i] for i in picks)[:1_000_000]
    lines = [text[i:i + 1000] for i in range(0, len(text), 1000)]
    assert sum(map(len, lines)) == 1_000_000
    t0 = time.perf_counter()
    tok = BPETokenizer().train(lines, vocab_size=8000)
    seconds = time.perf_counter() - t0
    print(f"\nBPE train on 1 MB ({len(tok.merges)} merges, vocab 8000): {seconds:.2f} s")
    assert tok.vocab_size == 8000
    assert seconds < 10.0
    assert tok.decode(tok.encode(lines[0])) == lines[0]
