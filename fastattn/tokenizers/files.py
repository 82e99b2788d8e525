"""Tokenizer files: JSON written by ``save``, read back by ``load`` as untrusted input.

``read_json(path, where)`` returns the JSON document in a file, or raises ValueError naming
the file and what is wrong with it: not a regular file (a directory, a device, a pipe), not
readable, not UTF-8, not JSON, nested too deeply for the parser, or an object giving one key
twice (the file would say two things at once). A path that does not exist stays
FileNotFoundError, as for ``open``. Checking the document against the tokenizer format is the
tokenizers' job (``Tokenizer.from_dict``); ``short``, ``clip`` and ``kind`` keep their
messages readable when a file holds huge values.

``write_json(path, document, where)`` writes UTF-8 JSON with every non-ASCII character
escaped, so any str fits, except one holding a surrogate pair (a high surrogate code point
followed by a low one, which only unusual decoding makes): JSON reads such a pair back as the
one character it encodes, so the tokenizer read back would differ. That is a ValueError.
"""
from __future__ import annotations

import json
import os
import re
import reprlib
import stat

__all__ = ["read_json", "write_json", "short", "clip", "kind", "unique_keys"]

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlist = _REPR.maxdict = 6
_REPR.maxlevel = 3
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def short(value):
    """repr(value), cut short for an error message (a file may hold megabytes in one field).

    Args:
        value: any value.

    Returns:
        The shortened repr.
    """
    return _REPR.repr(value)


def clip(text, size=200):
    """A text with its middle cut out when it is longer than `size` characters.

    Args:
        text: a str.
        size: the most characters kept (default 200).

    Returns:
        The text, or its first and last size / 2 characters around "...".
    """
    if len(text) <= size:
        return text
    return f"{text[:size // 2]}...{text[-(size // 2):]}"


def kind(value):
    """The JSON kind of a parsed value, for messages.

    Args:
        value: a value `json.loads` made.

    Returns:
        'an object', 'a list', 'a str', 'null', ... (the type's name for anything else).
    """
    names = {dict: "an object", list: "a list", str: "a str", bool: "a bool", int: "an int",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def unique_keys(pairs):
    """json's object_pairs_hook that refuses an object giving one key twice.

    The file would say two things at once, and json alone keeps the last.

    Args:
        pairs: the object's `(key, value)` pairs, in the file's order.

    Returns:
        The object as a dict.

    Raises:
        ValueError: a key given twice (naming it).
    """
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"the key {short(key)} is given twice in one object")
        seen.add(key)
    return dict(pairs)


def read_regular_file(path, where, kind):
    """The bytes of the regular file at `path`. A missing file is FileNotFoundError; anything
    else that keeps it from being read (a directory, a pipe, a bad path, an OS error) is a
    ValueError starting with `where` and naming `kind` ("a tokenizer file", ...)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:      # ValueError: a NUL character in the path
        raise ValueError(f"{where}: cannot read the file: {exc}") from None
    if not stat.S_ISREG(mode):                # checked first: opening a pipe would block
        what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise ValueError(f"{where}: not {kind} ({what})")
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ValueError(f"{where}: cannot read the file: {exc}") from None


def read_json(path, where):
    """Read the JSON document in a file, as untrusted input.

    Args:
        path: the file (str or path-like).
        where: how every error message starts.

    Returns:
        The parsed document.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: not a regular file or unreadable, not UTF-8 JSON, nested too deeply, or
            a key given twice.
    """
    data = read_regular_file(path, where, "a tokenizer file")
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=unique_keys)
    except RecursionError:
        raise ValueError(f"{where}: not a JSON tokenizer file (nested too deeply to "
                         f"read)") from None
    except ValueError as exc:   # JSONDecodeError, UnicodeDecodeError, int too long, key twice
        raise ValueError(f"{where}: not a JSON tokenizer file: {exc}") from None


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def write_json(path, document, where):
    """Write a document as JSON that reads back equal.

    Args:
        path: the file to write (str or path-like).
        document: JSON-ready data.
        where: how every error message starts.

    Raises:
        ValueError: a str holding a surrogate pair, which a JSON file cannot hold.
    """
    for s in _strings(document):
        if _SURROGATE_PAIR.search(s):
            raise ValueError(f"{where}: {short(s)} holds a surrogate pair, which a JSON file "
                             f"reads back as one character; the tokenizer cannot be saved "
                             f"exactly")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(document, f, ensure_ascii=True, indent=1)
        f.write("\n")
