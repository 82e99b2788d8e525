"""fastattn.tokenizers: the seeds' worked examples, round trips, batches, files, speed, bad input.

Oracles: the seed documents' counts and listings (word-level vocabulary of 23, the sorted
character list, the BPE corpus "she sells seashells by the seashore"), merge sequences worked
out by hand, and a naive BPE trainer below (re-counts every pair at every step) that the
incremental trainer must match merge for merge.
"""
import functools
import json
import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn.tokenizers as ftok
from fastattn.tokenizers import (END_OF_WORD, SPECIALS, BPETokenizer, CharTokenizer,
                                 NotFittedError, Vocab, WordTokenizer)

# Seed 000 (Step 1, "Our entire dataset containing only three sentences").
GOT = [
    "I drink and I know things.",
    "When you play the game of thrones, you win or you die.",
    "The true enemy won't wait out the storm, He brings the storm.",
]
# Seed 000 (Step 2): the word types it counts, in the order it lists them -> 23.
GOT_VOCAB = ["I", "drink", "and", "Know", "things", "When", "you", "play", "the", "game", "of",
             "thrones", "win", "or", "die", "true", "enemy", "won't", "wait", "out", "storm",
             "He", "brings"]

# Seed 001 (Byte Pair Encoding).
SEASHELLS = "she sells seashells by the seashore"

# A training text with whitespace of several kinds, punctuation, non-ASCII and non-BMP
# characters, and the strings "</w>" and "<pad>" inside words (they must stay ordinary text).
BPE_TRAIN = GOT + [
    SEASHELLS,
    "Größe café naïve 東京タワー 😀🚀 x</w>y <pad> a<unk>b",
    "tabs\tand\nnewlines,  double  spaces\u3000and\r\nCRLF ",
]
BPE_ALPHABET = sorted(set("".join(BPE_TRAIN)))


@functools.lru_cache(maxsize=None)
def _char_tokenizer():
    return CharTokenizer().fit(BPE_TRAIN)


@functools.lru_cache(maxsize=None)
def _bpe_tokenizer():
    return BPETokenizer().train(BPE_TRAIN, num_merges=150)


# ---- seed 000: word level -----------------------------------------------------------------------

def test_seed_word_vocabulary_has_23_types():
    # The seed lists "Know", "He", "When", "The"... capitalised but counts 23: that count needs
    # lowercasing ("The" and "the" are one type; the text's "know" is the seed's "Know").
    tok = WordTokenizer(lowercase=True, specials=()).fit(GOT)
    assert tok.vocab_size == 23
    assert tok.vocab.tokens == [w.lower() for w in GOT_VOCAB]   # first-occurrence order
    assert WordTokenizer(lowercase=False, specials=()).fit(GOT).vocab_size == 24  # + "The"
    with_specials = WordTokenizer().fit(GOT)
    assert with_specials.vocab_size == 27
    assert with_specials.vocab.token_to_id("i") == 4


def test_word_splitting_rules():
    tok = WordTokenizer().fit(GOT)
    # seed 001: "Where can I find a pizzeria?" -> [where, can, i, find, a, pizzeria]
    assert tok.tokenize("Where can I find a pizzeria?") == [
        "where", "can", "i", "find", "a", "pizzeria"]
    assert tok.tokenize("The true enemy won't wait") == ["the", "true", "enemy", "won't", "wait"]
    assert tok.tokenize("'quoted' \"words\" dogs' rock'n'roll won\u2019t") == [
        "quoted", "words", "dogs", "rock'n'roll", "won\u2019t"]
    assert tok.tokenize("storm,He N.Y.C well-known $5 <pad>") == [
        "storm", "he", "n", "y", "c", "well", "known", "5", "pad"]
    assert WordTokenizer(lowercase=False).fit(GOT).tokenize("When He") == ["When", "He"]


def test_word_encode_decode():
    tok = WordTokenizer().fit(GOT)
    ids = tok.encode("You win, or you DIE!")
    assert ids == [tok.vocab.token_to_id(w) for w in ["you", "win", "or", "you", "die"]]
    assert tok.decode(ids) == "you win or you die"
    unknown = tok.encode("you lose")
    assert unknown == [tok.vocab.token_to_id("you"), tok.unk_id]
    assert tok.decode(unknown) == "you"                       # specials are dropped
    assert tok.encode("die", add_start_end=True) == [tok.start_id, tok.vocab.token_to_id("die"),
                                                     tok.end_id]
    strict = WordTokenizer(specials=()).fit(GOT)
    with pytest.raises(ValueError, match="'lose'"):
        strict.encode("you lose")


def test_word_min_freq_and_max_size():
    texts = ["b a c a b a d"]                     # a x3, b x2, c x1, d x1
    assert WordTokenizer().fit(texts).vocab.tokens == ["b", "a", "c", "d"]
    assert WordTokenizer().fit(texts, min_freq=2).vocab.tokens == ["b", "a"]
    # max_size counts the specials; most frequent kept, ties by first occurrence ("c" before "d")
    assert WordTokenizer().fit(texts, max_size=7).vocab.tokens == ["b", "a", "c"]
    assert WordTokenizer(specials=()).fit(texts, max_size=1).vocab.tokens == ["a"]
    with pytest.raises(ValueError, match="max_size"):
        WordTokenizer().fit(texts, max_size=3)


# ---- seed 001: character level ----------------------------------------------------------------

def test_seed_char_vocabulary():
    tok = CharTokenizer(lowercase=True, specials=()).fit("Where can I find a pizzeria?")
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
        CharTokenizer(specials=()).fit(BPE_TRAIN).encode("aQ")


# ---- seed 001: byte-pair encoding -------------------------------------------------------------

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


# ---- batches --------------------------------------------------------------------------------

def test_encode_batch_shapes_padding_mask():
    tok = WordTokenizer().fit(GOT)
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
    tok = WordTokenizer().fit(GOT)
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
        WordTokenizer(specials=()).fit(GOT).encode_batch(["you"])
    tok = BPETokenizer(specials=("<pad>", "<unk>")).train(GOT, num_merges=10)
    assert tok.start_id is None and tok.end_id is None
    ids, mask = tok.encode_batch(["you", "you win"])
    assert ids.shape == (2, len(tok.encode("you win")))
    with pytest.raises(ValueError, match="<start>"):
        tok.encode_batch(["you"], add_start_end=True)


def test_special_ids():
    tok = CharTokenizer(specials=("<unk>", "<pad>", "<mask>")).fit("ab")
    assert (tok.unk_id, tok.pad_id, tok.start_id, tok.end_id) == (0, 1, None, None)
    assert tok.vocab.tokens == ["a", "b"] and tok.vocab_size == 5
    assert tok.decode([2, 3, 1, 4, 0]) == "ab"               # every special dropped
    none = CharTokenizer(specials=()).fit("ab")
    assert (none.pad_id, none.unk_id, none.start_id, none.end_id) == (None,) * 4
    assert none.encode("ba") == [1, 0]


# ---- files ----------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: WordTokenizer(lowercase=False).fit(GOT, max_size=20),
    lambda: CharTokenizer(specials=("<pad>", "<unk>")).fit(BPE_TRAIN),
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
    WordTokenizer().fit(GOT).save(path)
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


# ---- Vocab and bad input ------------------------------------------------------------------------

def test_vocab():
    v = Vocab(["x", "y"])
    assert len(v) == 6 and list(v) == list(SPECIALS) + ["x", "y"]
    assert (v.pad_id, v.unk_id, v.start_id, v.end_id) == (0, 1, 2, 3)
    assert v.token_to_id("y") == 5 and v.id_to_token(4) == "x"
    assert v.lookup("zzz") == v.unk_id
    with pytest.raises(KeyError, match="'zzz'"):
        v.token_to_id("zzz")
    with pytest.raises(ValueError, match="token id 6 "):
        v.id_to_token(6)
    with pytest.raises(ValueError, match="token id -1 "):
        v.id_to_token(-1)
    with pytest.raises(TypeError):
        v.id_to_token("1")
    with pytest.raises(ValueError, match="'zzz'"):
        Vocab(["x"], specials=()).lookup("zzz")
    with pytest.raises(ValueError, match="'x' is given twice"):
        Vocab(["x", "x"])
    with pytest.raises(ValueError, match="'<pad>' is a special"):
        Vocab(["<pad>"])
    with pytest.raises(ValueError, match="'<pad>' is given twice"):
        Vocab([], specials=("<pad>", "<pad>"))
    with pytest.raises(TypeError):
        Vocab([], specials="<pad>")


@pytest.mark.parametrize("make", [
    lambda: WordTokenizer().fit(GOT), lambda: CharTokenizer().fit(GOT),
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


@pytest.mark.parametrize("tok,fit", [(WordTokenizer(), "fit"), (CharTokenizer(), "fit"),
                                     (BPETokenizer(), "train")])
def test_not_fitted(tok, fit):
    for call in [lambda: tok.encode("a"), lambda: tok.decode([0]),
                 lambda: tok.encode_batch(["a"]), lambda: tok.vocab_size]:
        with pytest.raises(NotFittedError, match=rf"not fitted; call {fit}\(texts\) first"):
            call()
    with pytest.raises(TypeError, match=r"texts\[1\] must be str"):
        getattr(tok, fit)(["a", 1], **({"num_merges": 1} if fit == "train" else {}))
    assert tok.pad_id == 0                                   # known before fitting


def test_text_clashing_with_special_is_refused():
    with pytest.raises(ValueError, match="'x'.*special"):
        CharTokenizer(specials=("x",)).fit("axb")
    with pytest.raises(ValueError, match="'PAD'.*special"):
        WordTokenizer(lowercase=False, specials=("PAD",)).fit("a PAD")
