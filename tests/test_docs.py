"""The documentation cannot rot: every code block of README.md and docs/ runs, the README stays
short and its benchmark table is the latest results file's, and the built site has a reference
entry for every name a public module exports.

Code blocks. Every fenced block names its language. ``python`` blocks run in this process, the
blocks of one page in order in one namespace (a page reads as one session), in a temporary
directory of the page's own; ``bash`` blocks run in bash in the same directory, with
``fastattn`` meaning this checkout's command and ``examples/`` at hand, as from the
repository's root. Blocks in other languages (``text``: output,
file contents) are not code. A block may be marked on the line before its fence:

    <!-- docs-test: requires torch -->      skipped where the module is missing
    <!-- docs-test: skip REASON -->         never run here (installs, whole test or bench runs)

With FASTATTN_DOCS_STRICT=1 (CI, where every extra is installed) a missing module fails the
block instead of skipping it, so nothing is skipped silently; only "skip" blocks are left out,
each with its reason in the test report. A skip's reason must be one of SKIPPED's (what the
block needs that the tests cannot give), and a skipped block is still checked: python compiles,
bash parses, and its fastattn commands' arguments parse.

The checks marked ``docs_site`` read the site that ``mkdocs build --strict`` built into
FASTATTN_DOCS_SITE (CI, after the tests), or build one themselves when MkDocs is installed, and
skip without it (the docs extra).
"""
import importlib
import importlib.util
import os
import pkgutil
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
STRICT = os.environ.get("FASTATTN_DOCS_STRICT") == "1"
README_MAX_BYTES = 15 * 1024

RUN = {"python", "bash"}               # languages that run
NOT_CODE = {"text"}                    # output and file contents, shown only
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                   re.M | re.S)
MARK = re.compile(r"<!--\s*docs-test:\s*(requires|skip)\s+(.*?)\s*-->\s*$")


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    code: str
    mark: tuple = None   # ("requires", "torch ray") or ("skip", "reason"), or None

    @property
    def id(self):
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page):
    """The fenced blocks of a Markdown file, in order."""
    text = page.read_text(encoding="utf-8")
    found = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.search(before)
        lang = m.group("info").strip().split(" ")[0]
        found.append(Block(page, line, lang, textwrap.dedent(m.group("body")),
                           mark.groups() if mark else None))
    return found


ALL_BLOCKS = [b for page in PAGES for b in blocks_of(page)]
CODE_BLOCKS = [b for b in ALL_BLOCKS if b.lang in RUN]


def test_every_block_names_a_known_language():
    unknown = [f"{b.id} ({b.lang or 'no language'})" for b in ALL_BLOCKS
               if b.lang not in RUN | NOT_CODE]
    assert not unknown, f"blocks that would be neither run nor declared output: {unknown}"
    marked = [b.id for b in ALL_BLOCKS if b.mark and b.lang not in RUN]
    assert not marked, f"docs-test marks on blocks that do not run: {marked}"


# ---- what is left out, and why -----------------------------------------------------------------

# Every block marked "skip", by its reason: what it needs that the tests cannot give. A block
# that can run here runs (an earlier block makes the files it needs); a new reason is a decision
# written down here, and a reason no block gives any more is taken out.
SKIPPED = {
    "installs from the package index": "the tests never install, nor reach a package index",
    "a full benchmark run takes 6 minutes or more": "minutes of timing, on a quiet machine",
    "a benchmark run of minutes": "minutes of timing, on a quiet machine",
    "needs an AMX CPU and a full benchmark run": "an Intel CPU with AMX, and minutes of timing",
    "runs the whole test suite and builds the site": "the suite cannot run itself",
    "rebuilds the extension and runs the whole test suite": "would replace the extension the "
                                                             "tests are running",
    "needs a pretrained model directory, downloaded once (nothing here downloads)":
        "gigabytes from the model hub; tests/pretrained builds small models of each family",
    "needs a pytorch_model.bin directory and transformers": "a downloaded checkpoint",
    "starts a Ray cluster (about 20 s); tests/runners/test_runners_ray.py runs translate_dataset "
    "on one": "seconds of cluster start-up; its test file runs the same",
    "a training run of minutes; tests/train/test_distributed.py runs the same under mpiexec":
        "a real run on 4 ranks; the run of a few steps before it runs here",
    "a fragment: the model, pairs and tokenizer come from the training guide":
        "4000 steps of a real run",
}


def test_every_skip_is_explained():
    skipped = [b for b in CODE_BLOCKS if b.mark and b.mark[0] == "skip"]
    unexplained = [f"{b.id} ({b.mark[1]})" for b in skipped if b.mark[1] not in SKIPPED]
    assert not unexplained, f"blocks skipped for a reason not in SKIPPED: {unexplained}"
    stale = set(SKIPPED) - {b.mark[1] for b in skipped}
    assert not stale, f"reasons in SKIPPED that no block gives: {stale}"


def _commands(code):
    """The argument lists of the fastattn commands in a bash block: one per command, after any
    VAR=value, env -u NAME, mpiexec -n N prefix, up to a shell operator or a comment."""
    import shlex

    found = []
    for line in code.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
        while "fastattn" in words:
            words = words[words.index("fastattn") + 1:]
            end = next((i for i, w in enumerate(words) if set(w) <= set("&|;<>()")), len(words))
            found.append(words[:end])
            words = words[end:]
    return found


@pytest.mark.parametrize("block", [b for b in CODE_BLOCKS if b.mark and b.mark[0] == "skip"],
                         ids=lambda b: b.id)
def test_skipped_blocks_are_well_formed(block):
    # What is not run is still checked: python compiles, bash parses, and every fastattn
    # command's arguments are ones the command takes (no usage error hides behind a skip).
    if block.lang == "python":
        compile(block.code, block.id, "exec")
        return
    res = subprocess.run(["bash", "-n", "-c", block.code], capture_output=True, text=True)
    assert res.returncode == 0, f"{block.id}: {res.stderr}"
    from fastattn import cli

    for argv in _commands(block.code):
        try:
            cli._parser().parse_args(argv)
        except SystemExit as e:
            pytest.fail(f"{block.id}: fastattn {' '.join(argv)} is a usage error ({e.code})")


def test_every_torch_install_selects_the_cpu_build():
    # from the default index, pip install torch on Linux is a multi-GB CUDA build
    for page in PAGES:
        for line in page.read_text(encoding="utf-8").splitlines():
            for cmd in re.findall(r"pip install[^`#\n]*", line):
                if re.search(r"(?<![\w.-])torch(?![\w-])", cmd):
                    assert "--index-url https://download.pytorch.org/whl/cpu" in cmd, \
                        f"{page.relative_to(ROOT)}: {cmd.strip()}"


# ---- running the blocks ------------------------------------------------------------------------

_SESSIONS = {}   # page -> (namespace, directory): a page's blocks share them, in order

# `fastattn` is this checkout's command: a script on PATH (a shell function would do for bash
# alone, but mpiexec starts the command itself)
FASTATTN_SCRIPT = '#!/bin/sh\nexec "$FASTATTN_PYTHON" -m fastattn.cli "$@"\n'


def _session(page, tmp_path_factory):
    if page not in _SESSIONS:
        name = re.sub(r"[^A-Za-z0-9]+", "-", str(page.relative_to(ROOT)))
        directory = tmp_path_factory.mktemp(name)
        (directory / "examples").symlink_to(ROOT / "examples")  # as run from the repo root
        _SESSIONS[page] = ({"__name__": "__docs__"}, directory)
    return _SESSIONS[page]


def _check_mark(block):
    if block.mark is None:
        return
    kind, arg = block.mark
    if kind == "skip":
        pytest.skip(f"marked: {arg}")
    for module in arg.split():
        try:
            importlib.import_module(module)
        except ImportError:
            if STRICT:
                pytest.fail(f"{block.id} needs {module}, which FASTATTN_DOCS_STRICT=1 requires")
            pytest.skip(f"needs {module}")


def _runnable(block):
    """Whether a block runs here (not marked skip; its modules importable)."""
    if block.mark is None:
        return True
    kind, arg = block.mark
    if kind == "skip":
        return False
    try:
        for module in arg.split():
            importlib.import_module(module)
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("block", CODE_BLOCKS, ids=[b.id for b in CODE_BLOCKS])
def test_code_block_runs(block, tmp_path_factory, monkeypatch):
    _check_mark(block)
    namespace, directory = _session(block.page, tmp_path_factory)
    monkeypatch.chdir(directory)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # Under pytest-xdist the blocks of a page may reach several worker processes: a block
    # first runs the page's earlier blocks that this process has not run (in order, as a
    # reader would), and a block already run that way is not run twice.
    done = namespace.setdefault("__docs_done__", set())
    for earlier in [b for b in CODE_BLOCKS if b.page == block.page]:
        if earlier is block:
            break
        if earlier.id not in done and _runnable(earlier):
            _run_block(earlier, namespace, directory)
            done.add(earlier.id)
    if block.id not in done:
        _run_block(block, namespace, directory)
        done.add(block.id)


def _run_block(block, namespace, directory):
    """Run one block in its page's namespace (python) or in bash, in the page's directory."""
    if block.lang == "python":
        import fastattn

        threads = fastattn.get_num_threads()
        try:
            exec(compile(block.code, block.id, "exec"), namespace)
        finally:
            fastattn.set_num_threads(threads)   # a block may change it; the suite's stays
        return
    bin_dir = directory / ".bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        (bin_dir / "fastattn").write_text(FASTATTN_SCRIPT)
        (bin_dir / "fastattn").chmod(0o755)
    env = dict(os.environ, FASTATTN_PYTHON=sys.executable,
               PATH=os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                        os.environ.get("PYTHONPATH")])))
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code],
                         cwd=directory, env=env, capture_output=True, text=True, timeout=600,
                         stdin=subprocess.DEVNULL)
    print(res.stdout[-4000:])
    assert res.returncode == 0, f"{block.id} exited {res.returncode}:\n{res.stderr[-4000:]}"


# ---- the README --------------------------------------------------------------------------------

def _render():
    spec = importlib.util.spec_from_file_location("render_results",
                                                  ROOT / "benchmarks" / "render_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_is_short():
    size = README.stat().st_size
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; the limit is " \
        f"{README_MAX_BYTES}: move the detail into docs/"


def test_readme_test_command_is_what_ci_runs():
    # the README's second set-up command is the line .ci/run runs, word for word
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = next(b.code for b in blocks_of(README) if b.lang == "bash").splitlines()[1]
    command = command.split("#")[0].strip()
    assert command.startswith("pip install -e") and command in ci.splitlines(), command


def test_readme_benchmark_table_is_the_latest_results_file():
    render = _render()
    path, data = render.latest()
    assert render.readme_current(README.read_text(encoding="utf-8")) == \
        render.readme_block(data), f"run python benchmarks/render_results.py ({path.name})"
    assert len(render.readme_table(data).split("\n\n")[0].splitlines()) - 2 <= 8


def test_results_files_are_named_by_date_cpu_simd_and_threads():
    from fastattn.bench import result_filename

    render = _render()
    results = render.load_results()
    assert results, "benchmarks/results/ holds no results file"
    for path, data in results:
        name = re.sub(r"-\d+\.json$", ".json", path.name)       # a later run of the same day
        assert name == result_filename(data["date"], data["cpu"],
                                       data["environment"]["simd"], data["threads"])
        assert data["rows"] and all("fastattn_ms" in r for r in data["rows"])


@pytest.mark.parametrize("page", [README, *sorted(DOCS.rglob("*.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files(page):
    # A link must resolve where the page is read: on the repository host, where only the
    # committed files exist (a page the site build generates is not one), and on the built
    # site, which holds only docs/ (a link from docs/ out of it has no page there).
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path = (page.parent / target).resolve()
        assert path.exists(), f"{page.name} links to {target}, which is not a file here"
        if page.is_relative_to(DOCS):
            assert path.is_relative_to(DOCS), \
                f"{page.name} links to {target}, outside docs/: the site has no such page"


def test_results_page_is_the_results_files():
    # docs/benchmarks/results.md is committed (so links to it resolve on the repository host)
    # and rendered from benchmarks/results/*.json; the site build renders it again with plots
    render = _render()
    page = DOCS / "benchmarks" / "results.md"
    assert page.read_text(encoding="utf-8") == render.results_page(render.load_results()), \
        "run python benchmarks/render_results.py"


# ---- the API reference -------------------------------------------------------------------------

def public_modules():
    """fastattn and every module under it whose dotted name has no part starting with "_" and
    that defines __all__."""
    import fastattn

    names = ["fastattn"] + [m.name for m in pkgutil.walk_packages(fastattn.__path__, "fastattn.")
                            if not any(p.startswith("_") for p in m.name.split("."))]
    modules = [importlib.import_module(n) for n in names]
    return [m for m in modules if hasattr(m, "__all__")]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    given = os.environ.get("FASTATTN_DOCS_SITE")
    if given:
        return Path(given)
    try:
        import mkdocs  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError:
        # not a silent gap: CI installs the docs extra after the tests and runs these then
        pytest.skip("MkDocs is not installed (the docs extra)")
    out = tmp_path_factory.mktemp("site")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                          "--site-dir", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stderr[-6000:]
    return out


@pytest.mark.docs_site
def test_site_has_a_page_per_guide(site):
    for page in ["getting-started", "ops", "model", "training", "training/distributed",
                 "generation", "quantization", "runners", "performance", "benchmarks",
                 "benchmarks/results", "benchmarks/past-measurements", "seed-walkthrough",
                 "architecture", "reference"]:
        assert (site / page / "index.html").exists(), page
    assert (site / "index.html").exists()
    assert list((site / "benchmarks").glob("*.png")), "no benchmark plot"


@pytest.mark.docs_site
def test_every_public_name_has_an_api_entry(site):
    html = "".join(p.read_text(encoding="utf-8") for p in (site / "reference").rglob("*.html"))
    ids = set(re.findall(r'id="([\w.]+)"', html))
    missing = [f"{m.__name__}.{name}" for m in public_modules() for name in m.__all__
               if f"{m.__name__}.{name}" not in ids]
    assert not missing, f"public names without an API reference entry: {missing}"


def test_public_modules_are_listed():
    # the guard of the check above: the walk finds the packages a user imports
    names = {m.__name__ for m in public_modules()}
    assert {"fastattn", "fastattn.ops", "fastattn.reference", "fastattn.nn", "fastattn.io",
            "fastattn.optim", "fastattn.tokenizers", "fastattn.train",
            "fastattn.runners"} <= names
