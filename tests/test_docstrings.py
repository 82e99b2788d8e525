"""The API reference renders the docstrings it documents: one style (Google), checked here.

mkdocstrings renders docstrings as Markdown, parsed for Google-style sections (``Args:``,
``Returns:``, ``Raises:``, ``Attributes:``, ``Examples:``). What the public API's docstrings
must therefore not do, and what they must do:

- no reST literal blocks (a line ending in ``::``): the ``::`` shows raw and the block after
  it runs into one paragraph; use a fenced block or backticks;
- no list item right after a paragraph line: Markdown needs a blank line before a list, or the
  items are merged into the paragraph;
- no ``Name:`` line over an indented block that is not a known section: the parser turns it
  into a boxed admonition with its lines merged;
- no bare ``**``: ``**kwargs`` in prose turns the text after it bold; write it in backticks;
- a callable with parameters has an ``Args:`` section naming every parameter, and names no
  parameter it does not have.

The modules checked are those the reference pages render (CHECKED); the rendered-site checks
(no private or dunder member, no raw ``::``, no object documented twice on a page) read every
reference page.
"""
import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# the modules the reference pages render (every ::: line of docs/reference/*.md): every name in
# their __all__, and the public methods and properties of the classes among them
CHECKED = sorted({line[4:].strip() for page in (ROOT / "docs" / "reference").glob("*.md")
                  for line in page.read_text(encoding="utf-8").splitlines()
                  if line.startswith("::: ")})

SECTIONS = {"Args", "Returns", "Yields", "Raises", "Attributes", "Examples", "Example",
            "Note", "Notes", "Warning", "Warns", "See Also"}
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+\S")
# a line the Google parser reads as a section or admonition title (griffe's rule), when an
# indented line follows and a blank line precedes it
TITLE = re.compile(r"^(\w[\s\w-]*):(\s+\S.*)?\s*$")
RETURN_ITEM = re.compile(r"^\s*(\w+|`[^`]+`): \S")
FENCED = re.compile(r"^[ \t]*```.*?^[ \t]*```[ \t]*$", re.M | re.S)
ARG_LINE = re.compile(r"^\s{4}(\*{0,2}\w+)(?:\s*\([^)]*\))?:\s", re.M)


def _doc(obj):
    doc = getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if doc else None


def _params(obj):
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    names = []
    for p in sig.parameters.values():
        if p.name in ("self", "cls", "_cls"):
            continue
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        names.append(prefix + p.name)
    return names


def _section(doc, name):
    """The indented body of a Google section, or None."""
    m = re.search(rf"^{name}:[ \t]*\n((?:[ \t]+\S.*\n?|[ \t]*\n)*)", doc, re.M)
    return m.group(1) if m else None


def documented(module_name):
    """(qualified name, docstring, parameter names) for what the module's reference shows."""
    module = importlib.import_module(module_name)
    out = [(module_name, _doc(module), [])]
    for name in module.__all__:
        obj = getattr(module, name)
        qual = f"{module_name}.{name}"
        if inspect.isclass(obj):
            # the reference shows the constructor's signature (__init__'s, merged into the class)
            init = next((f for f in (obj.__init__, obj.__new__) if inspect.isfunction(f)), None)
            out.append((qual, _doc(obj), _params(init) if init else []))
            for attr, value in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if isinstance(value, property):
                    out.append((f"{qual}.{attr}", _doc(value.fget), []))
                elif isinstance(value, (staticmethod, classmethod)):
                    out.append((f"{qual}.{attr}", _doc(value.__func__), _params(value.__func__)))
                elif inspect.isfunction(value) and "<locals>" not in value.__qualname__:
                    # (a method made by a factory is an undocumented attribute to the reference;
                    # an override without a docstring shows the overridden one's, as getdoc)
                    doc = _doc(value) or inspect.getdoc(getattr(obj, attr))
                    out.append((f"{qual}.{attr}", doc, _params(value)))
        elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
            out.append((qual, _doc(obj), _params(obj)))
    return out


def problems(doc, params):
    """What would render badly in one docstring (an empty list when nothing)."""
    if not doc:
        return ["no docstring"]
    found = []
    lines = doc.splitlines()
    text = FENCED.sub("", doc)                # a fenced block's lines are code, not Markdown
    if re.search(r"::[ \t]*$", text, re.M):
        found.append("a reST '::' literal block")
    prose_lines = text.splitlines()
    for before, line in zip(prose_lines, prose_lines[1:]):
        indent = len(line) - len(line.lstrip())
        if (LIST_ITEM.match(line) and before.strip() and not LIST_ITEM.match(before)
                and before.strip()[:-1] not in SECTIONS
                and len(before) - len(before.lstrip()) <= indent):
            found.append(f"a list item right after a paragraph line: {line.strip()[:40]!r}")
            break
    fenced = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        m = not fenced and TITLE.match(line)
        if not m or i + 1 == len(lines) or not lines[i + 1].startswith(" "):
            continue
        if m.group(1) not in SECTIONS:
            if i == 0 or not lines[i - 1].strip():
                found.append(f"{m.group(1)[:40]!r}: over an indented block (an admonition)")
        elif i and lines[i - 1].strip():
            found.append(f"no blank line above the {m.group(1)} section (not parsed)")
    prose = re.sub(r"``.+?``|`[^`\n]*`", "", ARG_LINE.sub("", text), flags=re.S)
    if "**" in prose:
        found.append("a bare '**' (write **kwargs in backticks)")
    for name in ("Returns", "Yields"):
        body = _section(doc, name)
        items = [] if body is None else [
            line for line in body.splitlines() if line.strip()
            and len(line) - len(line.lstrip()) == len(body) - len(body.lstrip())]
        if len(items) > 1 and not all(RETURN_ITEM.match(line) for line in items):
            found.append(f"{name} has {len(items)} lines at its item indent; several values are "
                         "'name: description' items, a description's further lines indented")
    args = _section(doc, "Args")
    if params and args is None:
        found.append(f"no Args section for {params}")
    elif args is not None:
        named = ARG_LINE.findall(args)
        missing = [p for p in params if p not in named]
        unknown = [n for n in named if n not in params]
        if missing:
            found.append(f"Args misses {missing}")
        if unknown:
            found.append(f"Args names {unknown}, which are not parameters")
    return found


@pytest.mark.parametrize("module_name", CHECKED)
def test_public_docstrings_follow_the_style(module_name):
    bad = {qual: p for qual, doc, params in documented(module_name) if (p := problems(doc, params))}
    assert not bad, "docstrings that render badly:\n" + "\n".join(
        f"  {qual}: {'; '.join(p)}" for qual, p in bad.items())


@pytest.mark.parametrize("module_name", CHECKED)
def test_constructor_docstrings_are_one_line(module_name):
    # The reference merges __init__ into its class: the class docstring documents the
    # arguments, and __init__'s docstring is appended to it without its first line.
    module = importlib.import_module(module_name)
    long = [f"{module_name}.{name}.__init__" for name in module.__all__
            if inspect.isclass(obj := getattr(module, name))
            and "\n" in (_doc(vars(obj).get("__init__")) or "").strip()]
    assert not long, f"constructors with a docstring of several lines: {long}"


# ---- the checker itself ------------------------------------------------------------------------

def test_the_checker_finds_each_bad_pattern():
    assert problems(None, [])
    assert problems("Do it.\n\nExample::\n\n    x = 1\n", [])
    assert problems("Kinds:\n- one\n- two\n", [])
    assert problems("The kinds are\n- one\n- two\n", [])
    assert problems("Do it.\n\nThe package:\n    a   one\n    b   two\n", [])
    assert problems("Do it.\nArgs:\n    x: the input.\n", ["x"])
    assert problems("Do it.\n\nReturns:\n    The output, which\n    wraps.\n", [])
    assert problems("Do it.\n\nReturns:\n    q: the values.\n    scale: the scales.\n", []) == []
    assert problems("Pass **kwargs on.\n", [])
    assert problems("Pass ``f(**kwargs)`` and `**kwargs` on.\n", []) == []
    assert problems("Run:\n\n```python\nf(**kw)\n- x\n```\n", []) == []
    assert problems("Do it.\n", ["x"])
    assert problems("Do it.\n\nArgs:\n    x: the input.\n", ["x", "y"])
    assert problems("Do it.\n\nArgs:\n    z: no such.\n", [])
    assert problems("Do it.\n\nArgs:\n    x: the input.\n    z: no such.\n", ["x"])
    good = ("Do it.\n\nA paragraph:\n\n- one\n- two\n  and more\n\nArgs:\n    x: the input.\n"
            "    **kwargs: passed on (`**kwargs`).\n\nReturns:\n    The output.\n")
    assert problems(good, ["x", "**kwargs"]) == []


# ---- the rendered pages ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory):
    given = os.environ.get("FASTATTN_DOCS_SITE")
    if given:
        return Path(given)
    pytest.importorskip("mkdocs", reason="MkDocs is not installed (the docs extra)")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed (the docs extra)")
    out = tmp_path_factory.mktemp("site")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                          "--site-dir", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stderr[-6000:]
    return out


@pytest.mark.docs_site
def test_reference_pages_show_no_private_or_dunder_members(site):
    shown = []
    for page in sorted((site / "reference").rglob("*.html")):
        for ident in re.findall(r'id="(fastattn\.[\w.]+)"', page.read_text(encoding="utf-8")):
            parent, _, name = ident.rpartition(".")
            if not name.startswith("_"):
                continue
            try:
                exported = name in getattr(importlib.import_module(parent), "__all__", ())
            except ImportError:
                exported = False                  # a class member, not a module's name
            if not exported:
                shown.append(f"{page.relative_to(site)}: {ident}")
    assert not shown, "private or dunder members on reference pages:\n" + "\n".join(shown)


@pytest.mark.docs_site
def test_reference_pages_have_no_raw_rest_markup(site):
    found = []
    for page in sorted((site / "reference").rglob("*.html")):
        text = re.sub(r"<(pre|code)\b.*?</\1>", "", page.read_text(encoding="utf-8"), flags=re.S)
        for m in re.finditer(r"[^\s<>]*::(?:\s|<)", text):
            found.append(f"{page.relative_to(site)}: {m.group(0)[:40]!r}")
    assert not found, "raw '::' on reference pages:\n" + "\n".join(found[:40])


def _resolve(ident):
    """The object a reference id names (a module, or a module's attribute), or None."""
    parent, _, name = ident.rpartition(".")
    for module_name, attr in ((ident, None), (parent, name)):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        return module if attr is None else getattr(module, attr, None)
    return None


@pytest.mark.docs_site
def test_reference_pages_document_each_object_once(site):
    twice = []
    for page in sorted((site / "reference").rglob("*.html")):
        html = page.read_text(encoding="utf-8")
        seen = {}
        for ident in re.findall(r'<h\d id="(fastattn\.[\w.]+)" class="doc doc-heading"', html):
            obj = _resolve(ident)
            if obj is None or isinstance(obj, (str, int, float, tuple, dict, frozenset, bool)):
                continue                        # a class member, or a constant's value
            first = seen.get(id(obj))
            # two names of one module for one object (an alias, as optim's noam) are two entries
            if first and first.rpartition(".")[0] != ident.rpartition(".")[0]:
                twice.append(f"{page.relative_to(site)}: {first} and {ident}")
            seen.setdefault(id(obj), ident)
    assert not twice, "objects documented twice on one page:\n" + "\n".join(twice)
