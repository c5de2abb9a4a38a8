"""The decks and the site, without a browser: the slide structure derived from the notebooks' template,
the notebooks left untouched, no request to a CDN in the generated HTML, and the site's navigation.
(tests/test_browser.py opens them in Chromium.)"""

from __future__ import annotations

import base64
import hashlib
import io
import re
from pathlib import Path

import matplotlib.figure
import nbformat
import pytest

from transformer_from_scratch.nbtools import site, slides, web

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = web.notebooks()
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _derive(path: Path) -> list:
    nb = nbformat.read(path, as_version=4)
    derived, _ = slides.DeriveSlides().preprocess(nb, {"metadata": {"path": str(path.parent)}})
    return derived.cells


def _slide_type(cell) -> str:
    return cell.metadata["slideshow"]["slide_type"]


@pytest.fixture(scope="module")
def deck_01() -> str:
    return slides.deck(REPO / "notebooks" / "01_linear.ipynb")


@pytest.fixture(scope="module")
def page_05() -> str:
    return site.notebook_page(web.Page.of(REPO / "notebooks" / "05_attention.ipynb"), site.pages())


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_slides_follow_the_notebook_structure(notebook):
    source = nbformat.read(notebook, as_version=4)
    cells = _derive(notebook)
    assert all("slideshow" in cell.metadata for cell in cells), "every cell of the deck has a slide type"
    assert _slide_type(cells[0]) == "slide" and cells[0].source.count("# ") >= 1

    h2 = [line for cell in source.cells if cell.cell_type == "markdown"
          for line in cell.source.splitlines() if line.startswith("## ")]
    starts = [cell.source.splitlines()[0] for cell in cells if _slide_type(cell) == "slide"]
    assert [line for line in h2 if line not in slides.SKIPPED_SECTIONS] == \
        [line for line in starts if line.startswith("## ")], "each ## section (but Setup) starts a slide"

    h3 = [line for cell in source.cells if cell.cell_type == "markdown"
          for line in cell.source.splitlines() if line.startswith("### ")]
    for line in h3:
        cell = next(c for c in cells if c.source.startswith(line))
        before = cells[cells.index(cell) - 1]
        assert _slide_type(cell) == "subslide" or (_slide_type(before) == "slide" and before.source.startswith("## ")), \
            f"{line!r} starts a sub-slide (or shares the slide of the ## right above it)"

    text = "\n".join(cell.source for cell in cells if _slide_type(cell) != "notes")
    assert "## Setup" not in text and "%load_ext" not in text, "the Setup section is left out"
    assert "export_notebook(" not in text and "### BEGIN SOLUTION" not in text
    assert "<details>" not in text, "hints and answers go to the speaker notes"
    for cell in cells:
        if cell.cell_type == "code" and not cell.metadata.get("transient", {}).get("remove_source"):
            assert len(cell.source.splitlines()) <= max(slides.CODE_LINES, 40), "no wall of code on a slide"

    figures = sum(1 for cell in source.cells if cell.cell_type == "code" for output in cell.outputs
                  if "image/png" in output.get("data", {}))
    shown = [cell for cell in cells if cell.cell_type == "code" and cell.metadata.get("slides_figure")]
    assert sum(1 for cell in shown for o in cell.outputs if "image/png" in o.get("data", {})) == figures, \
        "every figure the notebook stored is on a slide"
    for cell in shown:
        mode = cell.metadata["slides_figure"]
        assert mode in {"together", "swap", "figure"}
        if mode != "figure":  # its code and its figure come one key press at a time
            assert cell.source.strip() and not cell.metadata.get("transient")


def test_the_notebook_files_are_only_read(deck_01, page_05):
    for name in ("01_linear.ipynb", "05_attention.ipynb"):
        path = REPO / "notebooks" / name
        before = hashlib.sha256(path.read_bytes()).hexdigest()
        nb = nbformat.read(path, as_version=4)
        slides.DeriveSlides().preprocess(nb, {"metadata": {"path": str(path.parent)}})
        assert all("slideshow" not in cell.metadata for cell in nb.cells), "the derivation works on a copy"
        slides.deck(path)
        site.notebook_page(web.Page.of(path), site.pages())
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def _figure_png() -> str:
    figure = matplotlib.figure.Figure(figsize=(4, 2))
    figure.add_subplot().plot([0, 1], [1, 0])
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode()


def test_a_new_notebook_gets_its_deck_for_free(tmp_path):
    """No hand-set metadata: the template's headings, a figure and a widget are enough."""
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    figure = nbformat.v4.new_output("display_data", data={"image/png": _figure_png(), "text/plain": "<Figure>"})
    widget = nbformat.v4.new_output("display_data", data={
        WIDGET_VIEW: {"model_id": "", "version_major": 2, "version_minor": 0},
        "text/plain": "[controls: width, depth; run the notebook to move them]"})
    nb = nbformat.v4.new_notebook(cells=[
        md("# 11 · Dropout: forget a little\n\nA promise."),
        md("## Setup"), code("import torch"),
        md("## Why dropout?\n\nBecause.\n\n### A second idea\n\nMore."),
        md("## See it"), code("plot()", outputs=[figure]), code("interactive_figure(draw)", outputs=[widget, figure]),
        md("## Exercises\n\n**1. Predict** · ★☆☆ · 3 min. What happens?\n\n<details><summary>Answer</summary>\n\n"
           "It drops.\n\n</details>"),
        code("### BEGIN SOLUTION\nanswer = 1\n### END SOLUTION"),
    ])
    path = tmp_path / "11_dropout.ipynb"
    nbformat.write(nb, path)
    cells = _derive(path)
    types = [(_slide_type(cell), cell.source.splitlines()[0] if cell.source else "") for cell in cells]
    assert ("slide", "## Why dropout?") in types and ("subslide", "### A second idea") in types
    assert ("slide", "## See it") in types and ("slide", "## Exercises") in types
    exercise = types.index(next(t for t in types if t[1] == "### Exercise 1. Predict · ★☆☆ · 3 min"))
    assert types[exercise][0] == "subslide" or types[exercise - 1] == ("slide", "## Exercises")
    assert ("notes", "**Answer**") in types
    assert not any("import torch" in cell.source or "BEGIN SOLUTION" in cell.source for cell in cells)
    assert [cell.metadata.get("slides_figure") for cell in cells if cell.cell_type == "code"] == ["together", "swap"] \
        or all(cell.metadata.get("slides_figure") for cell in cells if cell.cell_type == "code")

    html = slides.deck(path)
    assert WIDGET_VIEW not in html and "Interactive in the notebook: <b>width, depth</b>" in html
    assert html.count('class="fragment') >= 4, "code and figure, one fragment each"
    assert '<aside class="notes">' in html


def test_outline_keeps_signatures_and_first_docstring_lines():
    source = '''#| export
import torch


class Thing(torch.nn.Module):
    """Does a thing.

    At length.
    """

    def __init__(self, n: int) -> None:
        super().__init__()
        ### BEGIN SOLUTION
        self.n = n
        ### END SOLUTION

    def forward(self, x):
        """Apply it."""
        return x * self.n

    def _helper(self):
        return 1


def _private():
    pass
'''
    assert slides.outline(source) == '''class Thing(torch.nn.Module):
    """Does a thing."""

    def __init__(self, n: int) -> None:
        ...

    def forward(self, x):
        """Apply it."""
        ...'''
    assert slides.outline("#| export\nimport torch\n") is None


# Offline: nothing a page needs may come from elsewhere. Links a reader clicks (<a href>) may point anywhere.
_FETCHED = re.compile(r"""<(?:script|img|iframe|source|video|audio)\b[^>]*\bsrc=["']([^"']+)|"""
                      r"""<link\b[^>]*\bhref=["']([^"']+)|@import\s+(?:url\()?["']?([^"')\s;]+)|url\(["']?([^"')]+)""")


def _fetched(html: str) -> list[str]:
    return [next(group for group in match.groups() if group) for match in _FETCHED.finditer(html)]


@pytest.mark.parametrize("which", ["deck_01", "page_05"])
def test_no_cdn(which, request):
    html = request.getfixturevalue(which)
    fetched = _fetched(html)
    assert any("mathjax" in url for url in fetched), "MathJax is loaded"
    remote = [url for url in fetched if re.match(r"(https?:)?//", url)]
    assert remote == [], "everything a page loads sits beside it"
    for url in fetched:
        assert url.startswith(("assets/", "images/", "data:", "#")), url
    assert "require.js" not in html and "unpkg.com" not in html and "cdnjs" not in html and "jsdelivr" not in html


def test_every_notebook_page_links_previous_index_next_and_its_student_edition():
    pages = site.pages()
    assert len(pages) == len(NOTEBOOKS) >= 2
    for at, page in enumerate(pages):
        nav = site.navigation(page, pages, "top")
        hrefs = re.findall(r'href="([^"]+)"', nav)
        assert "index.html" in hrefs
        assert f"{site.STUDENT_DIR}/{page.notebook.name}" in hrefs
        if at > 0:
            assert f"{pages[at - 1].stem}.html" in hrefs and 'rel="prev"' in nav
        if at + 1 < len(pages):
            assert f"{pages[at + 1].stem}.html" in hrefs and 'rel="next"' in nav


def test_site_page_for_05(page_05):
    assert page_05.count('class="course-nav') == 2, "navigation on top and at the bottom"
    assert 'href="04_rmsnorm.html"' in page_05 and 'href="06_rope.html"' in page_05
    assert re.search(rf'<a (download="" )?href="{site.STUDENT_DIR}/05_attention.ipynb"', page_05)
    assert 'src="images/architecture_attention.svg"' in page_05, "the diagram comes from the site's images/"
    assert WIDGET_VIEW not in page_05 and "Interactive in the notebook" in page_05
    assert page_05.count("data:image/png;base64,") >= 3, "the stored figures"
    assert "$$" in page_05 or "\\(" in page_05, "the maths, for MathJax to typeset"
    assert not re.search(r'href="(?!https?:)[^"]*\.ipynb"', page_05.replace(f'href="{site.STUDENT_DIR}/', "")), \
        "links to notebooks point at their pages"


def test_landing_page_is_the_readme_with_links_to_the_pages():
    html = site.document_page("README.md", site.pages())
    for page in site.pages():
        assert f'href="{page.stem}.html"' in html
    assert 'href="contributing.html"' in html and 'src="images/architecture.svg"' in html
    assert not re.search(r'href="notebooks/[^"]*\.ipynb"', html)
