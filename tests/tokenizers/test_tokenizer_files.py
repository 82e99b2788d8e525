"""Tokenizer files: save/load round trips, and files that are not what save() wrote.

A tokenizer file is untrusted input. Every hostile file below must be refused with a ValueError
whose message names the file and the problem (and stays short when the file holds huge
values); a file that save() wrote from any training text must load back equal.
"""
import json
import os
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn.tokenizers as ftok
import fastattn.tokenizers.files
from fastattn.tokenizers import (END_OF_WORD, SPECIALS, BPETokenizer, CharTokenizer,
                                 NotFittedError, WordTokenizer)
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


# ---- every file save() writes loads back --------------------------------------------------

# Arbitrary text, plus the characters whose case mapping is unusual (İ lowercases to two code
# points, Σ to σ or ς by context), punctuation around apostrophes, and the marker and specials.
_TEXT = st.lists(st.one_of(st.characters(), st.sampled_from(
    ["İ", "Σ", "ς", "'", "\u2019", "</w>", "<pad>", " ", "\n", "\x1c", "\u3000"])),
    max_size=40).map("".join)


@given(texts=st.lists(_TEXT, max_size=5), lowercase=st.booleans())
def test_any_trained_word_and_char_tokenizer_loads_back(tmp_path_factory, texts, lowercase):
    path = tmp_path_factory.mktemp("tok") / "tok.json"
    for tok in [WordTokenizer(lowercase, specials=("[PAD]", "[UNK]")).train(texts),
                CharTokenizer(lowercase, specials=("[PAD]",)).train(texts)]:
        tok.save(path)
        assert ftok.load(path) == tok


@pytest.mark.parametrize("specials", [SPECIALS, ("<pad>", "ab", "<w>")])
@given(texts=st.lists(st.lists(st.sampled_from(
           ["a", "b", "ab", "<", "/", "w", ">", "</w>", "<w>", "<pad>", " ", "\n", "é"]),
           max_size=16).map("".join), max_size=6),
       num_merges=st.integers(0, 40))
def test_any_trained_bpe_tokenizer_loads_back(tmp_path_factory, specials, texts, num_merges):
    path = tmp_path_factory.mktemp("tok") / "tok.json"
    tok = BPETokenizer(specials=specials).train(texts, num_merges=num_merges)
    tok.save(path)
    back = ftok.load(path)
    assert back == tok and back.merges == tok.merges
    for text in texts:
        assert back.encode(text) == tok.encode(text)


def test_save_refuses_a_surrogate_pair_json_would_join(tmp_path):
    path = tmp_path / "tok.json"
    lone = CharTokenizer().train("a\udc80b")          # what surrogateescape decoding makes
    lone.save(path)
    assert ftok.load(path) == lone
    pair = WordTokenizer().train("a\ud83d\ude00b c")  # two code points; JSON reads one
    with pytest.raises(ValueError, match="save .*surrogate pair"):
        pair.save(path)


# ---- hostile files -------------------------------------------------------------------------------

def _word():
    return WordTokenizer().train(GOT).to_dict()


def _char():
    return CharTokenizer(lowercase=True).train(GOT).to_dict()


def _bpe():
    # tokens: </w>, " ", a b e h l o r s t y, e</w> se sh ash ll lls lls</w> seash by
    return BPETokenizer().train([SEASHELLS], num_merges=9).to_dict()


def _bpe0():
    """The same base vocabulary, before any merge: tokens </w>, " ", a b e h l o r s t y."""
    return BPETokenizer().train([SEASHELLS], num_merges=0).to_dict()


def _angle_bpe():
    """A BPE file over text holding "<pad>" and "</w>" as characters (no merges yet)."""
    return BPETokenizer().train(["x<pad>y z</w>z"], num_merges=0).to_dict()


def _first_token(json_text):
    """A word tokenizer's file whose first token is `json_text`, spliced in as it is."""
    return json.dumps(_word()).replace('"tokens": [', '"tokens": [' + json_text + ", ")


def _with(d, **changes):
    return {**d, **changes}


def _without(d, key):
    return {k: v for k, v in d.items() if k != key}


def _config(d, **changes):
    return {**d, "config": {**d["config"], **changes}}


def _merges(d, merges, new_tokens=()):
    return {**d, "tokens": d["tokens"] + list(new_tokens), "merges": merges}


def _refused(path, pattern, cls=None):
    """Loading `path` is a ValueError naming the file and matching `pattern`; the message."""
    with pytest.raises(ValueError) as info:
        (cls or ftok).load(path)
    message = str(info.value)
    assert os.fspath(path) in message, message
    assert re.search(pattern, message), message
    assert len(message) < 1000, f"message of {len(message)} characters"
    return message


# (id, content of the file: a dict/list written as JSON, or str/bytes written as they are,
#  pattern the message must match)
HOSTILE = [
    # not JSON, or JSON the reader refuses
    ("empty file", "", "not a JSON tokenizer file"),
    ("whitespace only", " \n\t", "not a JSON tokenizer file"),
    ("binary garbage", bytes(range(256)) * 4, "not a JSON tokenizer file"),
    ("utf-16", json.dumps(_word()).encode("utf-16"), "not a JSON tokenizer file"),
    ("utf-8 BOM", b"\xef\xbb\xbf" + json.dumps(_word()).encode(), "not a JSON tokenizer file"),
    ("truncated", json.dumps(_word())[:100], "not a JSON tokenizer file"),
    ("trailing garbage", json.dumps(_word()) + "}", "not a JSON tokenizer file"),
    ("python literal", repr(_word()), "not a JSON tokenizer file"),
    ("nested lists 100k deep", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("nested objects 100k deep", '{"a":' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
    ("nested inside tokens", _first_token("[" * 50_000 + "]" * 50_000), "nested too deeply"),
    ("key given twice", json.dumps(_word())[:-1] + ', "tokens": ["zzz"]}',
     "'tokens' is given twice"),
    # Python 3.11+ refuses the int while parsing; older ones parse it and the type check refuses
    ("a 5000-digit number", _first_token("9" * 5000),
     "not a JSON tokenizer file|tokens\\[0\\] is an int"),
    ("1e999 (infinity) as a token", _first_token("1e999"), r"tokens\[0\] is a number"),
    ("NaN as lowercase", json.dumps(_word()).replace('"lowercase": true', '"lowercase": NaN'),
     "does not build a WordTokenizer"),
    # the wrong top level
    ("a list", [_word()], "expected a JSON object, got a list"),
    ("a string", '"WordTokenizer"', "expected a JSON object, got a str"),
    ("a number", "3", "expected a JSON object, got an int"),
    ("null", "null", "expected a JSON object, got null"),
    ("format missing", _without(_word(), "format"), "not a fastattn tokenizer"),
    ("format other", _with(_word(), format="other"), "not a fastattn tokenizer"),
    ("format a list", _with(_word(), format=["fastattn-tokenizer/1"]), "not a fastattn tokenizer"),
    ("class missing", _without(_word(), "class"), "unknown tokenizer class None"),
    ("class unknown", _with(_word(), **{"class": "Pickle"}), "unknown tokenizer class 'Pickle'"),
    ("class a list (unhashable)", _with(_word(), **{"class": ["WordTokenizer"]}),
     "unknown tokenizer class"),
    ("class the base", _with(_word(), **{"class": "Tokenizer"}), "unknown tokenizer class"),
    ("class a huge str", _with(_word(), **{"class": "W" * 1_000_000}), "unknown tokenizer class"),
    ("tokens missing", _without(_word(), "tokens"), "needs the field\\(s\\) tokens"),
    ("config missing", _without(_word(), "config"), "needs the field\\(s\\) config"),
    ("merges missing", _without(_bpe(), "merges"), "needs the field\\(s\\) merges"),
    ("unexpected field", _with(_word(), extra=1), "unexpected field\\(s\\) \\['extra'\\]"),
    ("merges in a WordTokenizer", _with(_word(), merges=[]), "unexpected field"),
    ("untrained with merges", _with(_bpe(), tokens=None, merges=[]), "untrained BPETokenizer"),
    # config
    ("config a list", _with(_word(), config=[True]), "config must be an object, got a list"),
    ("config null", _with(_word(), config=None), "config must be an object, got null"),
    ("config without lowercase", _with(_word(), config={"specials": list(SPECIALS)}),
     "does not build a WordTokenizer: missing 'lowercase'"),
    ("config without specials", _with(_bpe(), config={}), "missing 'specials'"),
    ("config extra key", _config(_word(), bogus=1), "unexpected 'bogus'"),
    ("lowercase a str", _config(_word(), lowercase="yes"), "lowercase must be bool"),
    ("lowercase null", _config(_char(), lowercase=None), "lowercase must be bool"),
    ("specials a str", _config(_word(), specials="<pad>"), "specials must be a list of str"),
    ("specials an object", _config(_word(), specials={"<pad>": 0}), "specials must be a list"),
    ("specials null", _config(_bpe(), specials=None), "specials must be a list"),
    ("special an int", _config(_word(), specials=["<pad>", 1]), "non-empty str, got 1"),
    ("special empty", _config(_word(), specials=[""]), "non-empty str, got ''"),
    ("special a list", _config(_char(), specials=[["<pad>"]]), "non-empty str"),
    ("special given twice", _config(_word(), specials=["<pad>", "<unk>", "<pad>"]),
     "'<pad>' is given twice"),
    ("100k specials, one twice", _config(_word(), specials=[f"<s{i}>" for i in range(100_000)]
                                         + ["<s7>"]), "'<s7>' is given twice"),
    ("special '</w>' in BPE", _config(_bpe(), specials=["<pad>", END_OF_WORD]), "end-of-word"),
    # tokens
    ("tokens a str", _with(_word(), tokens="abc"), "tokens must be a list of str \\(or null\\)"),
    ("tokens an object", _with(_word(), tokens={"a": 4}), "tokens must be a list"),
    ("token an int", _with(_word(), tokens=["i", 5]), r"tokens\[1\] is an int"),
    ("token null", _with(_char(), tokens=["a", None]), r"tokens\[1\] is null"),
    ("token a list", _with(_bpe(), tokens=[END_OF_WORD, ["a"]]), r"tokens\[1\] is a list"),
    ("token twice", _with(_word(), tokens=["a", "b", "a"]), "'a' is given twice"),
    ("token a special's name", _with(_word(), tokens=["a", "<unk>"]), "'<unk>' is a special"),
    ("word token with a space", _with(_word(), tokens=["you win"]), "not one a WordTokenizer"),
    ("word token with punctuation", _with(_word(), tokens=["win!"]), "not one a WordTokenizer"),
    ("word token empty", _with(_word(), tokens=[""]), "not one a WordTokenizer"),
    ("word token in capitals", _with(_word(), tokens=["The"]),
     r"WordTokenizer\(lowercase=True\)"),
    ("huge word token", _with(_word(), tokens=["x" * 1_000_000 + "!"]), "not one a WordTokenizer"),
    ("char token of two characters", _with(_char(), tokens=["a", "bc"]), "not one a CharTokenizer"),
    ("char token empty", _with(_char(), tokens=[""]), "not one a CharTokenizer"),
    ("char token in capitals", _with(_char(), tokens=["A"]), "not one a CharTokenizer"),
    # BPE merges
    ("merges an object", _with(_bpe(), merges={"e": "</w>"}), "merges must be a list"),
    ("merges null", _with(_bpe(), merges=None), "merges must be a list"),
    ("merge of one", _merges(_bpe0(), [["e"]]), r"merges\[0\].*pair of str, got a list"),
    ("merge of three", _merges(_bpe0(), [["s", "h", "e"]]), "pair of str"),
    ("merge a str", _merges(_bpe0(), ["sh"]), "pair of str, got a str"),
    ("merge of ints", _merges(_bpe0(), [[0, 1]]), "pair of str"),
    ("merge of an unknown symbol", _merges(_bpe0(), [["q", "z"]], ["qz"]),
     "bad merge.*'q' is neither a character"),
    ("merge before its part exists", _merges(_bpe0(), [["a", "sh"], ["s", "h"]], ["ash", "sh"]),
     r"merges\[0\].*'sh'.*earlier merge"),
    ("merge spelling <pad>", _merges(_angle_bpe(), [["<", "p"], ["<p", "a"], ["d", ">"],
                                                    ["<pa", "d>"]], ["<p", "<pa", "d>"]),
     r"merges\[3\].*spells the special token '<pad>'"),
    ("merge spelling a one-character-pair special",
     _merges(_config(_bpe0(), specials=["<pad>", "sh"]), [["s", "h"]]),
     "spells the special token 'sh'"),
    ("merge spelling </w> inside a word",
     _merges(_angle_bpe(), [["/", "w"], ["/w", ">"], ["<", "/w>"]], ["/w", "/w>"]),
     "spells '</w>' inside a word"),
    ("merge after the word end", _merges(_bpe0(), [[END_OF_WORD, "a"]], ["</w>a"]),
     "left part ends a word"),
    ("merge with whitespace", _merges(_bpe0(), [[" ", "a"]], [" a"]), "whitespace"),
    ("merge twice", _merges(_bpe0(), [["s", "h"], ["s", "h"]], ["sh"]), "merged twice"),
    ("merge result missing", _merges(_bpe0(), [["s", "h"], ["b", "y"]], ["sh"]),
     "result 'by' is not in the tokens"),
    ("token no merge makes", _merges(_bpe0(), [], ["zz"]), "'zz' is neither a single character"),
    ("token no merge makes (trained file)", _with(_bpe(), merges=_bpe()["merges"][:-1]),
     "'by' is neither a single character"),
    ("tokens without </w>", _with(_bpe(), tokens=["a", "b"], merges=[]),
     "lack the end-of-word symbol"),
    ("huge merge part", _merges(_bpe0(), [["x" * 1_000_000, "y"]]), "neither a character"),
]


@pytest.mark.parametrize("content,pattern", [case[1:] for case in HOSTILE],
                         ids=[case[0] for case in HOSTILE])
def test_hostile_file_is_refused(tmp_path, content, pattern):
    path = tmp_path / "tok.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_text(json.dumps(content), encoding="utf-8")
    _refused(path, pattern)


def test_tampered_bpe_spelling_a_special_is_refused_as_training_refuses_it(tmp_path):
    # Training on text full of "<pad>" never merges it back into the special token...
    tok = BPETokenizer().train(["x<pad>y <pad> <pad> <pad>"], num_merges=1000)
    assert all(a + b not in SPECIALS for a, b in tok.merges)
    assert tok.pad_id not in tok.encode("<pad> x<pad>y")
    # ...so a file whose merges spell it is a lie; taken as it is, it would make
    # encode("<pad>") start with the padding id.
    d = BPETokenizer().train(["x<pad>y"], num_merges=0).to_dict()
    d["merges"] = [["<", "p"], ["<p", "a"], ["<pa", "d"], ["<pad", ">"]]
    d["tokens"] += ["<p", "<pa", "<pad"]
    path = tmp_path / "tok.json"
    path.write_text(json.dumps(d))
    _refused(path, r"merges\[3\] = \['<pad', '>'\]: it spells the special token '<pad>'")


def test_a_directory_is_refused(tmp_path):
    _refused(tmp_path, "not a tokenizer file \\(a directory\\)")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_pipe_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)                                  # opening it would wait for a writer
    _refused(fifo, "not a regular file")


def test_unreadable_paths_are_refused(tmp_path, monkeypatch):
    loop = tmp_path / "loop.json"
    os.symlink(loop, loop)
    _refused(loop, "cannot read the file")
    with pytest.raises(ValueError, match="cannot read the file"):
        ftok.load(str(tmp_path / "nul\0.json"))

    path = tmp_path / "tok.json"
    WordTokenizer().train(GOT).save(path)

    def unreadable(*args, **kwargs):
        raise PermissionError(13, "Permission denied", os.fspath(path))

    monkeypatch.setattr(fastattn.tokenizers.files, "open", unreadable, raising=False)
    _refused(path, "cannot read the file.*Permission denied")


def test_a_missing_file_and_a_non_path_keep_their_errors(tmp_path):
    with pytest.raises(FileNotFoundError):           # as open(): there is no file at all
        ftok.load(tmp_path / "missing.json")
    with pytest.raises(TypeError):                   # not a path: a programming error
        ftok.load(3)


@pytest.mark.parametrize("cls", [WordTokenizer, CharTokenizer, BPETokenizer])
def test_class_load_checks_the_class(tmp_path, cls):
    others = {WordTokenizer: _char(), CharTokenizer: _bpe(), BPETokenizer: _word()}
    path = tmp_path / "tok.json"
    path.write_text(json.dumps(others[cls]))
    _refused(path, f"holds a [A-Za-z]+, not a {cls.__name__}", cls=cls)


def test_from_dict_refuses_like_load():
    for content in [[1], _with(_word(), tokens=["a a"]), _merges(_bpe0(), [["q", "z"]])]:
        with pytest.raises(ValueError, match="^from_dict: "):
            ftok.Tokenizer.from_dict(content)
    with pytest.raises(ValueError, match="^here: "):
        WordTokenizer.from_dict(_with(_word(), tokens=[1]), where="here")
