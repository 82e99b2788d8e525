"""read_pairs (every format, every bad input named with file and line) and chatterbot_pairs."""
import json
import sys

import pytest

from conftest import run_child
from fastattn.train import Pairs, chatterbot_pairs, read_pairs


def write(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


# ---- the formats ------------------------------------------------------------------------------

def test_tsv(tmp_path):
    path = write(tmp_path, "p.tsv", "hello\tbonjour\n\n  \nthe cat \tle chat\r\nempty\t\n")
    pairs = read_pairs(path)
    assert pairs == [("hello", "bonjour"), ("the cat ", "le chat"), ("empty", "")]
    assert isinstance(pairs, Pairs) and pairs.skipped == 0
    assert read_pairs(str(path)) == pairs


def test_jsonl(tmp_path):
    lines = [json.dumps({"source": "a b", "target": "c", "id": 3}), "",
             json.dumps({"target": "é\tx", "source": "\u00fc"})]
    assert read_pairs(write(tmp_path, "p.jsonl", "\n".join(lines))) == [
        ("a b", "c"), ("\u00fc", "é\tx")]


def test_txt_dialogue_pairs_each_line_with_the_next(tmp_path):
    text = "hi\n  how are you?  \nfine\n\nbye\nsee you\n\n\nalone\n"
    assert read_pairs(write(tmp_path, "d.txt", text)) == [
        ("hi", "how are you?"), ("how are you?", "fine"), ("bye", "see you")]


def test_yaml_chatterbot_format(tmp_path):
    pytest.importorskip("yaml")
    text = ("categories:\n- greetings\nconversations:\n- - Hello\n  - Hi\n  - How are you?\n"
            "- - What is 20 + 2?\n  - 22\n- - Is it?\n  - yes\n- - One turn only\n"
            "- - 'quoted: text'\n  - >\n    folded\n    lines\n")
    want = [("Hello", "Hi"), ("Hi", "How are you?"), ("What is 20 + 2?", "22"),
            ("Is it?", "yes"), ("quoted: text", "folded lines\n")]
    assert read_pairs(write(tmp_path, "c.yml", text)) == want
    assert read_pairs(write(tmp_path, "c.yaml", text)) == want


# YAML aliases: a small file that stands for millions of pairs (each variant: name, text)
def alias_files():
    """The probe's files: 34 KB standing for 4,000,000 pairs, 67 KB for 12,000,000, and 2,000
    aliases of one 100 KB turn; then a merge key (an alias too)."""
    turns = "".join(f"  - turn {i}\n" for i in range(2000))
    yield "conversation", "conversations:\n- &c\n" + turns + "- *c\n" * 2000
    turns = "".join(f"  - turn {i}\n" for i in range(4000))
    yield "conversation_67k", "conversations:\n- &c\n" + turns + "- *c\n" * 3000
    yield "scalar", ("conversations:\n- - &big " + "x" * 100_000 + "\n  - *big\n"
                     + "- - *big\n  - *big\n" * 2000)
    yield "merge_key", ("base: &base {a: 1}\nconversations:\n- - hi\n  - there\n"
                        "other:\n  <<: *base\n")


@pytest.mark.parametrize("name, text", list(alias_files()), ids=lambda v: str(v)[:16])
def test_yaml_aliases_are_refused_naming_the_file_and_line(tmp_path, name, text):
    pytest.importorskip("yaml")
    path = write(tmp_path, f"{name}.yml", text)
    with pytest.raises(ValueError, match=rf"{name}\.yml: line \d+: the alias \*\w+ is not "
                                         "accepted"):
        read_pairs(path)
    plain = text.replace("&c", "").replace("*c", "[a, b]")
    if name.startswith("conversation"):          # the same file without aliases reads
        assert len(read_pairs(write(tmp_path, "plain.yml", plain))) > 1000


CHILD = """
import json, os, resource, sys, time
from fastattn import cli
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
with open("/proc/self/status") as f:
    size = dict(l.split(":", 1) for l in f)["VmSize"].split()[0]
resource.setrlimit(resource.RLIMIT_AS, (int(size) * 1024 + (1 << 30), hard))   # +1 GiB at most
with open("/proc/self/status") as f:
    start = dict(l.split(":", 1) for l in f)["VmRSS"].split()[0]
t0 = time.perf_counter()
try:
    rc = cli.main(["train", sys.argv[1], "--out", sys.argv[2], "--quiet"])
except MemoryError:
    rc = "MemoryError"
seconds = time.perf_counter() - t0
with open("/proc/self/status") as f:
    hwm = dict(l.split(":", 1) for l in f)["VmHWM"].split()[0]
print(json.dumps({"rc": rc, "seconds": seconds, "grown_mb": (int(hwm) - int(start)) / 1024}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("name, text", list(alias_files())[:3], ids=lambda v: str(v)[:16])
def test_alias_bombs_are_refused_fast_and_small(tmp_path, name, text):
    """The probe's files (4,000,000 or 12,000,000 pairs, or 2,000 copies of a 100 KB turn,
    once expanded) are refused by fastattn train before anything large is built, in a process
    of its own: the peak RSS grows by less than 50 MB over what the imports left (expanded, the
    files take gigabytes), and the refusal takes seconds, not the minutes an expansion takes.
    The growth, not the peak, is bounded: a sanitizer build's runtime alone adds tens of MB."""
    pytest.importorskip("yaml")
    path = write(tmp_path, f"{name}.yml", text)
    res = run_child(CHILD, path, tmp_path / "run", env={"OMP_NUM_THREADS": "1"}, timeout=30)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.splitlines()[-1])
    assert got["rc"] == 1 and "is not accepted" in res.stderr and f"{name}.yml" in res.stderr
    assert got["seconds"] < 10.0, got
    assert got["grown_mb"] < 50, got


def test_a_utf8_byte_order_mark_is_dropped(tmp_path):
    assert read_pairs(write(tmp_path, "b.tsv", b"\xef\xbb\xbfa\tb\n")) == [("a", "b")]


# ---- bad input: ValueError naming the file and the line ---------------------------------------

BAD = [
    ("r.tsv", "a\tb\nc\td\te\n", r"r.tsv: line 2: expected 2 tab-separated fields .* got 3"),
    ("r.tsv", "a\tb\n\nno tab here\n", r"r.tsv: line 3: expected 2 tab-separated fields"),
    ("e.tsv", "", r"e.tsv: no \(source, target\) pairs: the file is empty"),
    ("e.tsv", "\n  \n", r"e.tsv: no \(source, target\) pairs: the file is empty"),
    ("u.tsv", b"a\tb\nc\t\xff\xfed\n", r"u.tsv: line 2: not UTF-8 text \(byte b'\\xff' at "
                                        r"column 3\)"),
    ("j.jsonl", '{"source": "a", "target": "b"}\n{"source": "a",\n',
     r"j.jsonl: line 2: not valid JSON"),
    ("j.jsonl", '\n["a", "b"]\n', r"j.jsonl: line 2: expected a JSON object"),
    ("j.jsonl", '{"source": "a"}\n', r"j.jsonl: line 1: the object has no 'target' field"),
    ("j.jsonl", '{"source": 1, "target": "b"}\n', r"j.jsonl: line 1: 'source' must be a "
                                                  r"str, got int"),
    ("j.jsonl", "", r"j.jsonl: no \(source, target\) pairs"),
    ("t.txt", "just one line\n\nand another\n", r"t.txt: no \(source, target\) pairs: no "
                                                 r"pairs in it"),
    ("t.txt", b"ok\n\xc3\n", r"t.txt: line 2: not UTF-8"),
    ("n.yml", "categories:\n- x\n", r"n.yml: line 1: no 'conversations' key"),
    ("n.yml", "- a\n- b\n", r"n.yml: line 1: expected a mapping with a 'conversations'"),
    ("n.yml", "conversations: hello\n", r"n.yml: line 1: 'conversations' must be a list"),
    ("n.yml", "conversations:\n- - a\n  - b\n- just text\n",
     r"n.yml: line 4: a conversation must be a list of turns"),
    ("n.yml", "conversations:\n- - a\n  - [b, c]\n", r"n.yml: line 3: a turn must be text"),
    ("n.yml", "conversations:\n- - a\n  - b: [\n", r"n.yml: line \d+: not valid YAML"),
    ("n.yml", "conversations:\n- - only one\n", r"n.yml: no \(source, target\) pairs"),
    ("n.yml", "", r"n.yml: no \(source, target\) pairs: the file is empty"),
    ("p.csv", "a,b\n", r"p.csv: unknown extension '.csv'; read_pairs reads .tsv, .jsonl"),
    ("noext", "a\tb\n", r"noext: unknown extension '\(none\)'"),
]


@pytest.mark.parametrize("name, content, message", BAD,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(BAD)])
def test_bad_input_is_a_value_error_naming_file_and_line(tmp_path, name, content, message):
    if name.endswith(".yml"):
        pytest.importorskip("yaml")
    path = write(tmp_path, name, content)
    with pytest.raises(ValueError, match=message) as info:
        read_pairs(path)
    assert str(path) in str(info.value)


def test_a_directory_and_a_missing_file(tmp_path):
    (tmp_path / "d.tsv").mkdir()
    with pytest.raises(ValueError, match=r"d.tsv: not a file of pairs \(a directory\)"):
        read_pairs(tmp_path / "d.tsv")
    with pytest.raises(FileNotFoundError):
        read_pairs(tmp_path / "missing.tsv")


def test_yaml_without_pyyaml_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)
    path = write(tmp_path, "c.yml", "conversations:\n- - a\n  - b\n")
    with pytest.raises(ImportError, match=r'pip install "fastattn\[demo\]"'):
        read_pairs(path)


# ---- the ChatterBot corpus --------------------------------------------------------------------

def test_chatterbot_english():
    pytest.importorskip("chatterbot_corpus")
    pytest.importorskip("yaml")
    pairs = chatterbot_pairs()
    assert len(pairs) > 1000
    assert all(isinstance(s, str) and isinstance(t, str) for s, t in pairs)
    assert pairs.skipped == 1       # english/trivia.yml: a question and answer in one string
    greet = chatterbot_pairs("english", categories=["greetings"])
    assert greet[0] == ("Hello", "Hi") and greet.skipped == 0
    assert set(greet) < set(pairs)


def test_chatterbot_unknown_language_or_category():
    pytest.importorskip("chatterbot_corpus")
    pytest.importorskip("yaml")
    with pytest.raises(ValueError, match="unknown language 'klingon'; the corpus has .*english"):
        chatterbot_pairs("klingon")
    with pytest.raises(ValueError, match="unknown categories 'nope' for english; .*greetings"):
        chatterbot_pairs(categories=["greetings", "nope"])


def test_chatterbot_without_the_corpus_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "chatterbot_corpus", None)
    with pytest.raises(ImportError, match=r'fastattn\[demo\]'):
        chatterbot_pairs()


def test_the_package_imports_without_the_optional_packages():
    code = ("import sys\n"
            "for m in ('tqdm', 'yaml', 'matplotlib', 'chatterbot_corpus'): sys.modules[m] = None\n"
            "import fastattn.train\n"
            "assert fastattn.train.fit and fastattn.train.read_pairs\n")
    res = run_child(code, timeout=120)
    assert res.returncode == 0, res.stderr
