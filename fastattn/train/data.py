"""Text pairs for training: (source, target) read from a file, or from the ChatterBot corpus.

```python
pairs = read_pairs("train.tsv")                 # [(source, target), ...]
pairs = chatterbot_pairs("english", categories=["greetings", "food"])
```

``read_pairs(path)`` picks the format from the file's extension:

- ``.tsv``: one pair per line, ``source<TAB>target``; blank lines are skipped; every other
  line must have exactly two tab-separated fields (the texts are kept as written, a trailing
  ``\\r`` of a Windows line end removed).
- ``.jsonl``: one JSON object per line, ``{"source": "...", "target": "..."}`` (other keys
  are ignored); blank lines are skipped.
- ``.txt``: dialogue, one turn per line: each line is answered by the next one, so the lines
  a, b, c give the pairs (a, b) and (b, c). A blank line ends a dialogue (the line before it
  is answered by nothing; the line after it starts a new dialogue). Lines are stripped of
  surrounding whitespace.
- ``.yml`` / ``.yaml``: the ChatterBot corpus format: a top-level mapping whose
  ``conversations`` is a list of conversations, each a list of turns; the consecutive turns of
  a conversation become pairs, as in ``.txt``. A turn is the text written in the file: a turn
  written ``22`` or ``yes`` is the text "22" or "yes" (YAML would make a number or a bool of
  it). Aliases (``*name``, merge keys included) are refused: an alias repeats a part of the
  file without its bytes, so a few kilobytes could stand for millions of pairs. Needs PyYAML
  (``pip install "fastattn[demo]"`` or ``pip install pyyaml``); it is imported only here.

A file is input that may be wrong, and every problem is a ValueError naming the file and,
where there is one, the line (1-based): bytes that are not UTF-8, a TSV line without exactly
two fields, a JSONL line that is not a JSON object with str "source" and "target", a YAML file
that does not parse, holds an alias or has no ``conversations`` list, a conversation that is
not a list or a turn that is not text, an unknown extension, a directory, and a file that
yields no pair at all (an empty file included). A file that does not exist is
FileNotFoundError, as for open().

``chatterbot_pairs(language, categories)`` reads the installed ``chatterbot_corpus``
package's ``data/<language>/*.yml`` (``pip install "fastattn[demo]"``). That corpus is
not all well-formed: a conversation that is not a list of texts (english/trivia.yml has a
question and its answer written as one string) is skipped, and counted in the result's
``skipped`` attribute, instead of failing as ``read_pairs`` does.
"""
from __future__ import annotations

import json
import os

from ..tokenizers.files import read_regular_file, unique_keys

__all__ = ["read_pairs", "chatterbot_pairs", "Pairs", "FORMATS"]

FORMATS = (".tsv", ".jsonl", ".txt", ".yml", ".yaml")
_DEMO = 'pip install "fastattn[demo]"'


class Pairs(list):
    """A list of (source, target) str tuples, with the count of what the reader left out.

    Attributes:
        skipped: how many conversations the reader left out (always 0 from read_pairs,
            which refuses them instead).

    Args:
        pairs: the (source, target) tuples (default none).
        skipped: the count of conversations left out (default 0).
    """

    def __init__(self, pairs=(), skipped=0):
        super().__init__(pairs)
        self.skipped = skipped


def _short(text, n=60):
    r = repr(text)
    return r if len(r) <= n else r[:n] + "..."


# ---- lines of a file -----------------------------------------------------------------------

def _lines(path):
    """The lines of the file as str, without their line ends (\\n, \\r\\n); a UTF-8 byte
    order mark at the start is dropped. A line that is not UTF-8 is a ValueError naming it."""
    data = read_regular_file(path, path, "a file of pairs")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    raw = data.split(b"\n")
    if raw and raw[-1] == b"":                     # the file's final line end
        raw.pop()
    lines = []
    for number, line in enumerate(raw, 1):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: line {number}: not UTF-8 text (byte "
                             f"{line[exc.start:exc.start + 1]!r} at column {exc.start + 1})"
                             ) from None
        lines.append(text[:-1] if text.endswith("\r") else text)
    return lines


def _no_pairs(path, lines):
    what = "the file is empty" if not any(s.strip() for s in lines) else "no pairs in it"
    return ValueError(f"{path}: no (source, target) pairs: {what}")


# ---- the formats ----------------------------------------------------------------------------

def _tsv(path):
    lines = _lines(path)
    pairs = Pairs()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(f"{path}: line {number}: expected 2 tab-separated fields "
                             f"(source, target), got {len(fields)}: {_short(line)}")
        pairs.append((fields[0], fields[1]))
    if not pairs:
        raise _no_pairs(path, lines)
    return pairs


def _jsonl(path):
    lines = _lines(path)
    pairs = Pairs()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}: line {number}"
        try:
            obj = json.loads(line, object_pairs_hook=unique_keys)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"{where}: not valid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object with \"source\" and "
                             f"\"target\", got {type(obj).__name__} {_short(obj)}")
        for key in ("source", "target"):
            if key not in obj:
                raise ValueError(f"{where}: the object has no {key!r} field")
            if not isinstance(obj[key], str):
                raise ValueError(f"{where}: {key!r} must be a str, got "
                                 f"{type(obj[key]).__name__} {_short(obj[key])}")
        pairs.append((obj["source"], obj["target"]))
    if not pairs:
        raise _no_pairs(path, lines)
    return pairs


def _txt(path):
    lines = _lines(path)
    pairs = Pairs()
    previous = None
    for line in lines:
        text = line.strip()
        if not text:
            previous = None                         # a blank line ends the dialogue
            continue
        if previous is not None:
            pairs.append((previous, text))
        previous = text
    if not pairs:
        raise _no_pairs(path, lines)
    return pairs


def _yaml_module():
    try:
        import yaml
    except ImportError as exc:
        raise ImportError(f"reading .yml/.yaml pairs needs PyYAML: {_DEMO} (or pip install "
                          "pyyaml)") from exc
    return yaml


class _Alias(Exception):
    """An alias event met while composing (see _no_aliases)."""

    def __init__(self, event):
        super().__init__(event.anchor)
        self.event = event


def _no_aliases(yaml):
    """A SafeLoader whose composer stops at the first alias (``*name``, merge keys included).
    An alias repeats a part of the file without its bytes: a 33 KB file aliasing one
    conversation 2,000 times is 4,000,000 pairs. Refused, a file's pairs are bounded by its
    size."""
    class Loader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise _Alias(self.peek_event())
            return super().compose_node(parent, index)
    return Loader


def _yaml_pairs(path, strict=True):
    """Pairs of a ChatterBot-format YAML file. strict=False skips (and counts) conversations
    that are not lists of text instead of raising."""
    yaml = _yaml_module()
    text = "".join(line + "\n" for line in _lines(path))
    try:
        root = yaml.compose(text, Loader=_no_aliases(yaml))
    except _Alias as alias:
        event = alias.event
        name = event.anchor if len(event.anchor) <= 40 else event.anchor[:40] + "..."
        raise ValueError(f"{path}: line {event.start_mark.line + 1}: the alias *{name} is not "
                         "accepted: write each conversation out (an alias repeats a part of "
                         "the file without its size, so a small file could expand to millions "
                         "of pairs)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        at = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(f"{path}: {at}not valid YAML: {problem}") from None
    except RecursionError:
        raise ValueError(f"{path}: the YAML is nested too deeply") from None
    if root is None:
        raise ValueError(f"{path}: no (source, target) pairs: the file is empty")
    line = root.start_mark.line + 1
    if not isinstance(root, yaml.MappingNode):
        raise ValueError(f"{path}: line {line}: expected a mapping with a 'conversations' "
                         "list (the ChatterBot corpus format)")
    conversations = None
    for key, value in root.value:
        if isinstance(key, yaml.ScalarNode) and key.value == "conversations":
            conversations = value
    if conversations is None:
        raise ValueError(f"{path}: line {line}: no 'conversations' key (the ChatterBot "
                         "corpus format: conversations: a list of lists of turns)")
    if not isinstance(conversations, yaml.SequenceNode):
        raise ValueError(f"{path}: line {conversations.start_mark.line + 1}: 'conversations' "
                         "must be a list of conversations")
    pairs = Pairs()
    for conv in conversations.value:
        where = f"{path}: line {conv.start_mark.line + 1}"
        problem = None
        if not isinstance(conv, yaml.SequenceNode):
            problem = f"{where}: a conversation must be a list of turns"
        else:
            bad = [t for t in conv.value if not isinstance(t, yaml.ScalarNode)]
            if bad:
                problem = (f"{path}: line {bad[0].start_mark.line + 1}: a turn must be text, "
                           "not a list or mapping")
        if problem is not None:
            if strict:
                raise ValueError(problem)
            pairs.skipped += 1
            continue
        turns = [t.value for t in conv.value]
        pairs.extend(zip(turns[:-1], turns[1:]))
    if not pairs and strict:
        raise ValueError(f"{path}: no (source, target) pairs: no conversation has two turns")
    return pairs


_READERS = {".tsv": _tsv, ".jsonl": _jsonl, ".txt": _txt, ".yml": _yaml_pairs,
            ".yaml": _yaml_pairs}


def read_pairs(path):
    """Read the (source, target) pairs of a file, in file order.

    The format comes from the extension (see the module docstring).

    Args:
        path: a .tsv, .jsonl, .txt, .yml or .yaml file (str or path-like).

    Returns:
        A `Pairs` list.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: any problem with the file (the file and the line named).
    """
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    reader = _READERS.get(ext)
    if reader is None:
        raise ValueError(f"{path}: unknown extension {ext or '(none)'!r}; read_pairs reads "
                         f"{', '.join(FORMATS)}")
    return reader(path)


def chatterbot_pairs(language="english", categories=None):
    """The pairs of the ChatterBot corpus (the `chatterbot_corpus` package), category by category.

    Malformed conversations are skipped and counted in the result's `skipped`.

    Args:
        language: the corpus language (default "english").
        categories: the categories to read (the file names, e.g. "greetings"); None (the
            default) for all.

    Returns:
        A `Pairs` list.

    Raises:
        ImportError: the package is not installed.
        ValueError: an unknown language or category (the known ones listed).
    """
    import importlib.resources
    try:
        import chatterbot_corpus  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"chatterbot_pairs needs the chatterbot-corpus package: {_DEMO} "
                          "(or pip install chatterbot-corpus)") from exc
    _yaml_module()
    data = importlib.resources.files("chatterbot_corpus") / "data"
    languages = sorted(p.name for p in data.iterdir() if p.is_dir())
    if not isinstance(language, str) or language not in languages:
        raise ValueError(f"chatterbot_pairs: unknown language {_short(language)}; the corpus "
                         f"has {', '.join(languages)}")
    files = {os.path.splitext(p.name)[0]: p for p in (data / language).iterdir()
             if p.name.endswith((".yml", ".yaml"))}
    if categories is None:
        names = sorted(files)
    else:
        if isinstance(categories, str):
            categories = [categories]
        names = list(categories)
        unknown = [c for c in names if c not in files]
        if unknown:
            raise ValueError(f"chatterbot_pairs: unknown categories "
                             f"{', '.join(map(_short, unknown))} for {language}; the corpus "
                             f"has {', '.join(sorted(files))}")
    pairs = Pairs()
    for name in names:
        with importlib.resources.as_file(files[name]) as path:
            got = _yaml_pairs(os.fspath(path), strict=False)
        pairs.extend(got)
        pairs.skipped += got.skipped
    return pairs
