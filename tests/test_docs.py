"""The README's and docs/'s examples, run in a real IPython shell and compared with what they show.

An ```ipython block is a session: each ``In [n]:`` line (with its ``...:`` continuation lines)
is a cell, run in the shell with ``GPUMagics.output = 'text'``, and what follows it up to the
next ``In [n]:`` is what it printed, compared with the whitespace normalised and ``...``
standing for anything (doctest's ELLIPSIS), the ``Out[n]:`` prompts left out. A ```python
block runs as one cell and must not fail, unless an ``<!-- not run: why -->`` line above it
says why (a sketch that needs the reader's model, a line another test runs in its own
environment). One shell session per file, in the repository's root, on the recordings in
``colab_gpu/data``: no GPU is needed.
"""
from __future__ import annotations

import re
from typing import List, Tuple

import pytest

from conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?:<!-- not run: (?P<why>.+?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)^```\s*$", re.M | re.S)
PROMPT = re.compile(r"^In \[\d+\]: ?")
CONTINUATION = re.compile(r"^ *\.\.\.: ?")
OUT_PROMPT = re.compile(r"Out\[\d+\]: ?")


def blocks(path) -> List[Tuple[str, str, str]]:
    """(language, body, why it is not run or '') of each fenced block."""
    return [(match["lang"], match["body"], match["why"] or "") for match in FENCE.finditer(path.read_text())]


def session(body: str) -> List[Tuple[str, str]]:
    """(cell, what it printed) of each ``In [n]:`` of an ipython block."""
    cells: List[Tuple[List[str], List[str]]] = []
    for line in body.splitlines():
        if PROMPT.match(line):
            cells.append(([PROMPT.sub("", line, count=1)], []))
        elif cells and not cells[-1][1] and CONTINUATION.match(line):
            cells[-1][0].append(CONTINUATION.sub("", line, count=1))
        elif cells:
            cells[-1][1].append(line)
    return [("\n".join(code), "\n".join(shown)) for code, shown in cells]


def matches(expected: str, actual: str) -> bool:
    """``actual`` is ``expected`` with the whitespace normalised, ``...`` matching anything."""
    def normal(text: str) -> str:
        return " ".join(OUT_PROMPT.sub("", text).split())

    pattern = r"\s*".join(r".*?".join(re.escape(piece) for piece in part.split("..."))
                          for part in normal(expected).split(" "))
    return re.fullmatch(pattern, normal(actual), re.S) is not None


def test_the_matching_is_strict_but_for_whitespace_and_ellipses():
    assert matches("a  b\n c", "a b c") and matches("size ... MiB", "size 388 MiB")
    assert matches("Out[3]: [0, 10]", "Out[0]: [0, 10]") and matches("...", "anything at all")
    assert not matches("a b", "a c") and not matches("12 GiB", "12 GiB more")


def test_every_example_block_runs_or_says_why_not():
    for path in DOCS:
        for language, body, why in blocks(path):
            if language == "ipython":
                cells = session(body)
                assert cells and all(code.strip() for code, _ in cells), (path.name, body[:200])
            if why:
                assert language == "python" and len(why.split()) >= 3, (path.name, why)


def test_the_pages_the_readme_links_exist():
    readme = (ROOT / "README.md").read_text()
    linked = re.findall(r"\]\(((?:docs)/[^)#]+)\)", readme)
    assert {f"docs/{path.name}" for path in DOCS[1:]} <= set(linked)
    for link in linked:
        assert (ROOT / link).is_file(), link


def test_every_page_but_the_developers_shows_a_session():
    assert [path.name for path in DOCS if not any(language == "ipython" for language, _, _ in blocks(path))] == \
        ["development.md"]


@pytest.mark.parametrize("path", [path for path in DOCS if path.name != "development.md"],
                         ids=lambda path: path.name)
def test_the_examples_print_what_the_page_shows(path, shell, capsys, monkeypatch):
    runnable = [(language, body) for language, body, why in blocks(path)
                if not why and language in ("python", "ipython")]
    monkeypatch.chdir(ROOT)
    magics = shell.magics_manager.registry["GPUMagics"]
    # the settings as they were: a page's %config GPUMagics.live_lines = 1 must not outlive it
    settings = {name: getattr(magics, name) for name in magics.trait_names(config=True)}
    shell.run_cell("%config GPUMagics.output = 'text'")
    capsys.readouterr()
    try:
        for language, body in runnable:
            if language == "python":
                result = shell.run_cell(body)
                shown = capsys.readouterr()
                assert result.success, (path.name, body, shown.out[-2000:], shown.err[-2000:])
                continue
            for code, expected in session(body):
                shell.run_cell(code)
                shown = capsys.readouterr()
                actual = shown.out + shown.err
                assert matches(expected, actual), f"{path.name}: In: {code}\n--- shown:\n{expected}\n--- printed:\n{actual}"
    finally:
        for name, value in settings.items():
            if getattr(magics, name) != value:
                shell.run_line_magic("config", f"GPUMagics.{name} = {value!r}")
