"""The decks and the site, without a browser: the slide structure derived from the notebooks' template, every
result kept, no slide ending on a colon, nothing a learner writes on a slide or on the default site, the notebooks
left untouched, no request to a CDN in the generated HTML, and the site's pages and links.
(tests/test_browser.py opens them in Chromium.)"""

from __future__ import annotations

import base64
import hashlib
import html as htmllib
import io
import re
from pathlib import Path

import matplotlib.figure
import nbformat
import pytest

from transformer_from_scratch._project import repo_root
from transformer_from_scratch.nbtools import site, slides, student, web

REPO = repo_root()
NOTEBOOKS = web.notebooks()
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _derive(path: Path, solutions: bool = False) -> list:
    nb = nbformat.read(path, as_version=4)
    nb, _ = web.WidgetNote().preprocess(nb, {})
    derived, _ = slides.DeriveSlides(solutions=solutions).preprocess(nb, {"metadata": {"path": str(path.parent)}})
    return derived.cells


def _slide_type(cell) -> str:
    return cell.metadata["slideshow"]["slide_type"]


def _pages(cells) -> list[list]:
    """The deck's sub-slides: each a list of its cells, speaker notes left out."""
    pages: list[list] = []
    for cell in cells:
        kind = _slide_type(cell)
        if kind in ("slide", "subslide") or not pages:
            pages.append([])
        if kind != "notes":
            pages[-1].append(cell)
    return pages


def _sections(nb) -> list[str]:
    """The ## section each cell is in."""
    section, out = "", []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            found = [line.strip() for line in cell.source.splitlines() if line.startswith("## ")]
            section = found[-1] if found else section
        out.append(section)
    return out


def _secret_lines(nb) -> set[str]:
    """Lines of the solutions that appear nowhere else in the notebook's code (so their presence gives one away)."""
    solution, other = set(), set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        inside = set(web.solution_lines(cell.source))
        solution |= inside
        other |= {line.strip() for line in web.stubbed(cell.source).splitlines()}
    return {line for line in solution - other if len(line) >= 12 and not line.startswith("#")}


def _lines(text: str) -> set[str]:
    return {line.strip() for line in text.splitlines()}


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
    lecture = [line for line in h2 if line not in slides.SKIPPED_SECTIONS + slides.APPENDIX_SECTIONS]
    assert [line for line in starts if line.startswith("## ") and slides.APPENDIX_PREFIX not in line
            and not line.startswith((f"## {slides.PART_TWO}", f"## {slides.PART_ONE_DONE}"))] == lecture, \
        "each ## section (but Setup and the appendix's) starts a slide, in the notebook's order"
    if any(line in slides.APPENDIX_SECTIONS for line in h2):
        assert starts[-1].startswith(f"## {slides.APPENDIX_PREFIX}"), "Verify moves to an appendix after the recap"
        appendix = cells.index(next(c for c in cells if c.source.startswith(f"## {slides.APPENDIX_PREFIX}")))
        recap = next(i for i, c in enumerate(cells) if c.source.startswith("## Recap"))
        assert recap < appendix

    final = next(i for i, c in enumerate(source.cells) if c.source.startswith("## The final class"))
    exported = [i for i, c in enumerate(source.cells) if c.cell_type == "code" and c.source.startswith("#| export")
                and i > final]
    appendix = next(i for i, c in enumerate(cells) if c.source.startswith(f"## {slides.APPENDIX_PREFIX}"))
    outlined = [i for i, c in enumerate(cells) if c.metadata.get("course_source") in exported]
    assert outlined and min(outlined) > appendix, "the final class's outline is in the appendix, out of the lecture"
    task = next(i for i, c in enumerate(cells) if c.source.startswith("## The final class"))
    assert task < appendix and "Your turn" in "".join(c.source for c in cells[task:appendix]), \
        "the final class's task stays in the lecture"

    shown = [cell for cell in cells if _slide_type(cell) != "notes"]
    h3 = [line for cell in source.cells if cell.cell_type == "markdown"
          for line in cell.source.splitlines() if line.startswith("### ")]
    for line in h3:  # as the deck says it: a widget's "Now you drive: X" is "X" (slides.for_slides)
        said = slides.for_slides(line)
        assert any(cell.source.startswith(said) for cell in shown), f"{said!r} is on a slide"

    text = "\n".join(cell.source for cell in shown)
    assert "## Setup" not in text and "%load_ext" not in text, "the Setup section is left out"
    assert "export_notebook(" not in text and web.SOLUTION_BEGIN not in text and web.SOLUTION_END not in text
    assert "<details>" not in text, "hints and answers go to the speaker notes"
    for cell in shown:
        if cell.cell_type == "code" and not cell.metadata.get("transient", {}).get("remove_source"):
            assert len(cell.source.splitlines()) <= max(slides.CODE_LINES, 40), "no wall of code on a slide"

    figures = sum(1 for cell in source.cells if cell.cell_type == "code" for output in cell.outputs
                  if "image/png" in output.get("data", {}))
    with_figures = [cell for cell in cells if cell.cell_type == "code" and cell.metadata.get("slides_figure")]
    assert sum(1 for cell in with_figures for o in cell.outputs if "image/png" in o.get("data", {})) >= figures, \
        "every figure the notebook stored is on a slide (a figure cut into rows of panels counts once a row)"
    for cell in with_figures:
        mode = cell.metadata["slides_figure"]
        assert mode in {"together", "swap", "figure"}
        if mode != "figure":  # its code and its figure come one key press at a time
            assert cell.source.strip() and not cell.metadata.get("transient")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_result_stays(notebook):
    """A cell whose code is left out keeps its output: every output of the lecture's and the appendix's cells is
    in the deck (the Setup, the export cell and the exercises' solutions aside)."""
    nb = nbformat.read(notebook, as_version=4)
    cells = _derive(notebook)
    ids = [cell.get("id") for cell in cells]
    assert len(ids) == len(set(ids)), "a cell cut into several slides repeats its id (nbformat warns at each)"
    shown: dict[int, list] = {}
    for cell in cells:
        if cell.cell_type == "code" and "course_source" in cell.metadata and _slide_type(cell) != "notes":
            shown.setdefault(cell.metadata["course_source"], []).extend(cell.outputs)
    dropped = []
    for index, (cell, section) in enumerate(zip(nb.cells, _sections(nb))):
        if cell.cell_type != "code" or section in slides.SKIPPED_SECTIONS or section == "## Exercises":
            continue
        if "export_notebook(" in cell.source:
            continue
        results = [o for o in cell.outputs if o.output_type != "stream" or (o.name == "stdout" and o.text.strip())]
        if results and not shown.get(index):
            dropped.append(cell.source.splitlines()[0])
        pngs = sum(1 for o in cell.outputs if "image/png" in o.get("data", {}))
        assert sum(1 for o in shown.get(index, []) if "image/png" in o.get("data", {})) >= pngs
    assert dropped == [], "cells whose results are not in the deck"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_no_slide_ends_on_a_colon(notebook):
    for page in _pages(_derive(notebook)):
        last = page[-1] if page else None
        assert not (last is not None and last.cell_type == "markdown" and last.source.rstrip().endswith(":")), \
            f"a slide ends on {last.source.strip()[-80:]!r} with nothing after it"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_no_solution_on_a_slide(notebook):
    """What the learners write is never on a slide; with solutions=True it is in the speaker notes only."""
    nb = nbformat.read(notebook, as_version=4)
    secret = _secret_lines(nb)
    for solutions in (False, True):
        cells = _derive(notebook, solutions)
        faces = "\n".join(c.source for c in cells if _slide_type(c) != "notes")
        notes = "\n".join(c.source for c in cells if _slide_type(c) == "notes")
        notes = "\n".join(re.findall(r"```python\n(.*?)```", notes, re.DOTALL))  # the code in the notes (hints are text)
        faces, notes = _lines(faces), _lines(notes)
        assert [line for line in secret if line in faces] == []
        if solutions:
            assert all(line in notes for line in secret), "the instructor's decks hold the solutions in the notes"
        else:
            assert [line for line in secret if line in notes] == []


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


def _figure_png(width: float = 4, height: float = 2, panels: int = 1, **text) -> str:
    figure = matplotlib.figure.Figure(figsize=(width, height))
    for k in range(panels):
        ax = figure.add_subplot(1, panels, k + 1)
        image = ax.imshow([[0, 1], [1, 0]])
        figure.colorbar(image, ax=ax, label="weight")
        ax.set_title(f"panel {k}")
        ax.set_ylabel("query")
    if text.get("suptitle"):
        figure.suptitle(text["suptitle"])
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return base64.b64encode(buffer.getvalue()).decode()


def test_a_new_notebook_gets_its_deck_for_free(tmp_path):
    """No hand-set metadata: the template's headings, a figure and a widget are enough."""
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    figure = nbformat.v4.new_output("display_data", data={"image/png": _figure_png(), "text/plain": "<Figure>"})
    widget = nbformat.v4.new_output("display_data", data={
        WIDGET_VIEW: {"model_id": "", "version_major": 2, "version_minor": 0},
        "text/plain": "[controls: width, depth; run the notebook to move them]"})
    long_code = "\n".join(f"x{i} = {i}" for i in range(20)) + "\nprint(x19)"
    printed = nbformat.v4.new_output("stream", name="stdout", text="the answer: 19\n")
    nb = nbformat.v4.new_notebook(cells=[
        md("# 11 · Dropout: forget a little\n\nA promise."),
        md("## Setup"), code("import torch"),
        md("## Why dropout?\n\nBecause.\n\n### A second idea\n\nMore. The cell after it checks your answer."),
        md("Here is the result of a long computation:"), code(long_code, outputs=[printed]),
        md("## See it"), code("plot()", outputs=[figure]), code("interactive_figure(draw)", outputs=[widget, figure]),
        md("## Exercises\n\nTry each one before you open its hints; answers sit in collapsed blocks.\n\n"
           "**1. Predict** · ★☆☆ · 3 min. What happens?\n\n<details><summary>Hint</summary>\n\nThink.\n\n</details>"
           "\n\n<details><summary>Answer</summary>\n\n"
           "It drops.\n\n</details>"),
        code("### BEGIN SOLUTION\nanswer = 1\n### END SOLUTION"),
        md("## Recap and next\n\n* It drops."),
    ])
    path = tmp_path / "11_dropout.ipynb"
    nbformat.write(nb, path)
    cells = _derive(path)
    types = [(_slide_type(cell), cell.source.splitlines()[0] if cell.source else "") for cell in cells]
    assert ("slide", "## Why dropout?") in types and ("slide", "## See it") in types
    assert ("slide", "## Exercises") in types and ("slide", "## Recap and next") in types
    assert any(line == "### A second idea" for _, line in types)
    assert any(line == "### Exercise 1. Predict · ★☆☆ · 3 min" for _, line in types)
    assert ("notes", "**Hint**") in types and ("notes", "**Answer**") not in types, \
        "a published deck's notes hold the hints, not the answers"
    instructor = [(_slide_type(cell), cell.source.splitlines()[0] if cell.source else "")
                  for cell in _derive(path, solutions=True)]
    assert ("notes", "**Answer**") in instructor, "the instructor's deck keeps the answers in its notes"
    text = "\n".join(cell.source for cell in cells)
    assert "import torch" not in text and "BEGIN SOLUTION" not in text
    assert "The cell after it" not in text and "collapsed" not in text, "notebook-only sentences are left out"
    result = next(c for c in cells if c.cell_type == "code" and any("the answer" in o.get("text", "") for o in c.outputs))
    assert result.metadata["transient"] == {"remove_source": True}, "long code: its output only"
    assert all(cell.metadata.get("slides_figure") for cell in cells
               if cell.cell_type == "code" and any("image/png" in o.get("data", {}) for o in cell.outputs))

    html = slides.deck(path)
    assert WIDGET_VIEW not in html and "Interactive in the notebook: <b>width, depth</b>" in html
    assert html.count('class="fragment') >= 2, "code and figure, one fragment each"
    assert '<aside class="notes">' in html
    assert 'alt="No description' not in html and re.search(r'<img [^>]*alt="[^"]+"', html)


def _state_layers(deck: str) -> list[dict]:
    """The layers of a deck's stacks of preset states: each its class, style, image attributes and caption."""
    from html.parser import HTMLParser

    layers: list[dict] = []

    class Layers(HTMLParser):
        caption = False

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if tag == "div" and "course-state" in attrs.get("class", "").split():
                layers.append({"class": attrs["class"], "style": attrs.get("style"), "caption": ""})
            elif tag == "img" and layers and "img" not in layers[-1]:
                layers[-1]["img"] = attrs
            elif tag == "p" and layers and "img" in layers[-1] and not layers[-1]["caption"]:
                self.caption = True

        def handle_endtag(self, tag):
            self.caption = self.caption and tag != "p"

        def handle_data(self, data):
            if self.caption:
                layers[-1]["caption"] += data

    Layers(convert_charrefs=True).feed(deck)
    return layers


def test_a_widgets_preset_states_are_fragments_over_its_figure(tmp_path):
    """Issue 39: a deck has no kernel, so a control becomes the states the notebook stored (interactive_figure(
    states=...)): over the default figure, one fragment each, each with its sentence, listed in the speaker notes;
    the site keeps them folded under the figure."""
    from transformer_from_scratch.nbtools import interactive

    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    widget = nbformat.v4.new_output("display_data", data={
        WIDGET_VIEW: {"model_id": "", "version_major": 2, "version_minor": 0},
        "text/plain": "[controls: width; run the notebook to move them]"})
    default = nbformat.v4.new_output("display_data", data={"image/png": _figure_png(6, 3), "text/plain": "<Figure>"})
    sentences = ["Wider: the bars spread out.", "Narrow: the bars & the gaps shrink."]
    figures = []
    for width in (7, 5):  # bbox_inches="tight" makes each state's PNG its own size
        figure = matplotlib.figure.Figure(figsize=(width, 3))
        figure.add_subplot().set_title(f"width {width}")
        figures.append(figure)
    bundle, metadata = interactive.states_bundle(figures, [({"width": 7}, sentences[0]), ({"width": 5}, sentences[1])])
    states = nbformat.v4.new_output("display_data", data=bundle, metadata=metadata)
    nb = nbformat.v4.new_notebook(cells=[
        md("# 12 · Bars: wide and narrow\n\nA promise."),
        md("## See it\n\n### Now you drive: the width\n\nThe width sets how far apart the bars are."),
        code("interactive_figure(draw, width=w)", outputs=[widget, default, states]),
        md("## Recap and next\n\n* It spreads."),
    ])
    path = tmp_path / "12_bars.ipynb"
    nbformat.write(nb, path)

    deck = slides.deck(path)
    layers = _state_layers(deck)
    assert [(layer["class"], layer["caption"]) for layer in layers] == [
        ("course-state", "\xa0"), ("course-state fragment", sentences[0]), ("course-state fragment", sentences[1])], \
        "the default first, then each state a fragment with its sentence"
    assert layers[0]["img"]["src"].endswith(default["data"]["image/png"])
    assert layers[2]["img"]["alt"] == sentences[1] and all("data-text-px" in layer["img"] for layer in layers)
    assert len({layer["style"] for layer in layers}) == 1, "every layer as large as the largest: each covers the last"
    box = int(re.search(r"width:(\d+)px", layers[0]["style"])[1])
    widths = [int(layer["img"]["width"]) for layer in layers]
    assert box == max(max(widths), slides.STATE_MIN_WIDTH), "the widest image fills the box, wide enough for the caption"
    assert widths[1] > widths[0] > widths[2], "each image at its own size"
    notes = re.findall(r'<aside class="notes">(.*?)</aside>', deck, re.DOTALL)
    assert any("Step through the figure" in n and re.search(r"<li>\s*Wider: the bars spread out.", n) for n in notes)
    assert "Interactive in the notebook" not in re.sub(r'<aside class="notes">.*?</aside>', "", deck, flags=re.DOTALL), \
        "the controls' note leaves the slide its room"
    assert any("Interactive in the notebook: width. Here, the figure for their default values, then for 2 other "
               "settings." in n for n in notes), "the speaker notes name the controls"

    page = site.notebook_page(web.Page.of(path), [web.Page.of(path)])
    assert '<details class="course-states">' in page and page.count("<figcaption>") == 2, "the site keeps them folded"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_every_widget_gives_the_deck_states_to_step_through(notebook):
    """A widget in a deck is its figure at two or three preset states, each with the sentence that says what
    changed: every widget a notebook stores carries them (interactive_figure(states=...)), new notebooks too."""
    nb = nbformat.read(notebook, as_version=4)
    widgets = 0
    for cell in nb.cells:
        outputs = cell.get("outputs", [])
        if not any(WIDGET_VIEW in o.get("data", {}) and "".join(o["data"].get("text/plain", "")).startswith("[controls:")
                   for o in outputs):
            continue  # not interactive_figure's controls (a chat box, a progress bar)
        widgets += 1
        stored = [o.metadata["course"]["states"] for o in outputs if o.get("metadata", {}).get("course", {}).get("states")]
        first_line = cell.source.strip().splitlines()[-1][:60]
        assert stored, f"a widget with no preset states for the deck: {first_line}"
        assert 2 <= len(stored[0]) <= 3, f"{len(stored[0])} preset states (two or three): {first_line}"
        sentences = [state["sentence"] for state in stored[0]]
        assert all(s.rstrip().endswith(".") and len(s) <= 200 for s in sentences), \
            f"each state a sentence that fits under its figure: {sentences}"
    if "interactive_figure(" in "\n".join(c.source for c in nb.cells if c.cell_type == "code"):
        assert widgets, "a notebook that calls interactive_figure stores its widget"


def test_notebook_only_sentences_are_left_out_of_slides():
    assert slides.for_slides("Try each one before you open its hints; answers to the questions sit in collapsed "
                             "blocks.") == ""
    assert slides.for_slides("Write `f(x)`. The cell after it checks it.") == "Write `f(x)`."
    assert slides.for_slides("**Your turn** (student edition) · ★☆☆ · 5 min: write `g`.") == \
        "**Your turn** · ★☆☆ · 5 min: write `g`."
    assert slides.for_slides("It holds a third of them (computed below).") == "It holds a third of them."
    kept = "A value $x_i = 1.5$ and `a.b()`. Then the next one."
    assert slides.for_slides(kept) == kept
    assert slides.for_slides("* a list item about cells\n* and another") == "* a list item about cells\n* and another"


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


def test_solution_regions_become_stubs():
    source = "def f(x):\n    \"\"\"Doc.\"\"\"\n    ### BEGIN SOLUTION\n    y = x + 1\n    return y\n    ### END SOLUTION\n"
    assert web.stubbed(source) == 'def f(x):\n    """Doc."""\n    ...'
    assert web.without_markers(source) == 'def f(x):\n    """Doc."""\n    y = x + 1\n    return y'
    assert web.solution_lines(source) == ["y = x + 1", "return y"]


def test_smallest_font_follows_the_calls():
    functions = web.definitions(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "def draw(ax):\n    ax.legend(fontsize=8)\n")]))
    assert slides.smallest_font_pt("ax.plot([1, 2])", {}) == slides.DEFAULT_FONT_PT
    assert slides.smallest_font_pt("draw(ax)", functions) == 8
    assert slides.smallest_font_pt("heatmap(ax, m, title='t', xlabel='x', ylabel='y')", {}) == slides.DEFAULT_FONT_PT
    # A helper's branch counts only when the call takes it; the same helper called twice counts both calls.
    functions = web.definitions(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "def bars(ax, labelled=False):\n    ax.bar([1], [2])\n    if labelled:\n        ax.text(1, 1, 'x', fontsize=7)\n")]))
    assert slides.smallest_font_pt("bars(ax)", functions) == slides.DEFAULT_FONT_PT
    assert slides.smallest_font_pt("bars(ax, labelled=True)", functions) == 7
    assert slides.smallest_font_pt("bars(ax)\nbars(ax, labelled=True)", functions) == 7
    assert slides.DEFAULT_FONT_PT == 12.0, "the course style's font.size (nbtools/course.mplstyle)"
    assert slides.smallest_font_pt("ax.legend(fontsize='small')", {}) == pytest.approx(12 * 0.833, abs=0.01)


def test_panels_are_found_between_colorbars_and_labels():
    png = base64.b64decode(_figure_png(16, 3.5, panels=4, suptitle="Four panels and one title across them all"))
    title, columns, (top, bottom) = slides.panels(png)
    assert title is not None and len(columns) == 4
    assert all(b - a > 200 for a, b in columns) and top > title[1]


def test_a_wide_figure_is_cut_into_rows_with_its_title_as_a_caption(tmp_path):
    figure = nbformat.v4.new_output("display_data", data={
        "image/png": _figure_png(18, 4, panels=4, suptitle="Four heads"), "text/plain": "<Figure>"})
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 12 · Wide: a figure\n\nA promise."),
        nbformat.v4.new_markdown_cell("## See it"),
        nbformat.v4.new_code_cell('fig.suptitle("Four heads")\nplot()', outputs=[figure]),
    ])
    path = tmp_path / "12_wide.ipynb"
    nbformat.write(nb, path)
    cells = _derive(path)
    rows = [c for c in cells if c.cell_type == "code" and c.metadata.get("slides_figure")]
    assert len(rows) >= 2, "four panels too small side by side are shown as rows"
    assert any('class="course-figure-title">Four heads<' in c.source for c in cells if c.cell_type == "markdown")
    for cell in rows:
        for output in cell.outputs:
            if "image/png" in output.get("data", {}):
                size = output.metadata["image/png"]
                text_px = output.metadata["course"]["text_px"]
                width = slides._png_info(base64.b64decode(output.data["image/png"]))[0]
                assert text_px * size["width"] / width >= slides.MIN_TEXT_PX * 0.8, "its text is readable"


def test_wrapped_code_keeps_its_indentation():
    highlighted = ('<div class="highlight"><pre><span></span><span class="k">def</span> <span class="nf">f</span>():\n'
                   '    <span class="s2">"""A docstring</span>\n<span class="s2">    on two lines."""</span>\n'
                   '    <span class="k">return</span> 1\n</pre></div>')
    out = slides.hanging_lines(highlighted)
    lines = re.findall(r'<span class="course-line" style="--indent:(\d+)ch">(.*?)</span>(?=<span class="course-line"|</pre>)',
                       out, re.DOTALL)
    assert [int(indent) for indent, _ in lines] == [0, 4, 4, 4]
    assert all(not re.sub(r"<[^>]+>", "", body).startswith(" ") for _, body in lines), "the indent is a padding"
    assert out.count("<span") - out.count("</span>") == 0, "every span is closed on its own line"


# Offline: nothing a page needs may come from elsewhere. Links a reader clicks (<a href>) may point anywhere.
_FETCHED = re.compile(r"""<(?:script|img|iframe|source|video|audio)\b[^>]*\bsrc=["']([^"']+)|"""
                      r"""<link\b[^>]*\bhref=["']([^"']+)|@import\s+(?:url\()?["']?([^"')\s;]+)|url\(["']?([^"')]+)""")


def _fetched(html: str) -> list[str]:
    return [next(group for group in match.groups() if group) for match in _FETCHED.finditer(html)]


@pytest.mark.parametrize("which", ["deck_01", "page_05"])
def test_no_cdn_and_one_shared_css(which, request):
    html = request.getfixturevalue(which)
    fetched = _fetched(html)
    assert any("mathjax" in url for url in fetched), "MathJax is loaded"
    remote = [url for url in fetched if re.match(r"(https?:)?//", url)]
    assert remote == [], "everything a page loads sits beside it"
    for url in fetched:
        assert url.startswith(("assets/", "images/", "data:", "#")), url
    assert "require.js" not in html and "unpkg.com" not in html and "cdnjs" not in html and "jsdelivr" not in html
    assert "assets/notebook.css" in fetched, "JupyterLab's CSS is one shared file"
    assert "--jp-cell-editor-background" not in html, "and not copied into the page"


def test_notebook_css_is_written_once(tmp_path):
    web.copy_assets(tmp_path, reveal=False, css=["site.css"])
    css = (tmp_path / "assets" / "notebook.css").read_text(encoding="utf-8")
    assert "--jp-cell-editor-background" in css and ".highlight" in css and len(css) > 100_000


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_the_default_site_shows_no_solution(notebook):
    """Every notebook page of the default site: no solution marker, no line of a solution, no output of a cell
    that held one; the instructor's edition has them (markers aside) and says so."""
    nb = nbformat.read(notebook, as_version=4)
    secret = _secret_lines(nb)
    page = web.Page.of(notebook)
    student = site.notebook_page(page, site.pages())
    text = htmllib.unescape(re.sub(r"<[^>]+>", "", student))
    assert web.SOLUTION_BEGIN not in text and web.SOLUTION_END not in text
    assert [line for line in secret if line in _lines(text)] == [], "solution code on the default site"
    answers = [o.text.strip() for cell in nb.cells if cell.cell_type == "code" and web.has_solution(cell.source)
               for o in cell.outputs if o.output_type == "stream" and len(o.text.strip()) > 20]
    assert [a for a in answers if a.splitlines()[0] in text] == [], "the output of a solution cell"
    if web.has_solution("".join(c.source for c in nb.cells if c.cell_type == "code")):
        assert "YOUR CODE HERE" in text, "the student edition's stubs"
    exercises = _exercise_outputs(nb)
    assert [line for line in exercises if line in text] == [], "what an exercise's cell printed (a self-check's value)"
    given = _answers(nb)
    assert "<summary>Answer" not in student and [a for a in given if a in text] == [], "an exercise's answer"
    instructor = site.notebook_page(page, site.pages(), solutions=True)
    itext = htmllib.unescape(re.sub(r"<[^>]+>", "", instructor))
    assert web.SOLUTION_BEGIN not in itext and all(line in _lines(itext) for line in secret)
    assert "course-solutions-banner" in instructor and "Instructor's edition" in itext
    assert instructor.count("<summary>Answer") == len(given) and all(line in itext for line in exercises), \
        "the instructor's page keeps them"


def _answers(nb) -> list[str]:
    """The first sentence-long line of every exercise's collapsed answer, as the page renders it (Markdown aside)."""
    found = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for block in re.findall(r"<summary>\s*Answer.*?</summary>(.*?)</details>", cell.source, re.DOTALL):
            line = next(line for line in block.strip().splitlines() if line.strip())
            words = re.sub(r"[`*_$\\]", "", line).split()
            found.append(" ".join(words[:5]))
    return found


def _exercise_outputs(nb) -> list[str]:
    """Each line over 20 characters that a cell of ## Exercises printed, but for a fixed message in its code."""
    lines, section = [], ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            section = next((ln.strip() for ln in reversed(cell.source.splitlines()) if ln.startswith("## ")), section)
        elif section == "## Exercises":
            lines += [ln.strip() for o in cell.outputs if o.output_type == "stream" for ln in o.text.splitlines()
                      if len(ln.strip()) > 20 and ln.strip() not in cell.source]  # a fixed message is no answer
    return lines


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_no_answer_in_a_published_deck_or_student_notebook(notebook):
    """The default decks' speaker notes and the site's student notebook hold no exercise's answer; the instructor's
    decks and `make student`'s notebooks (a learner's own copy, for self-study) keep them."""
    nb = nbformat.read(notebook, as_version=4)
    if not _answers(nb):
        pytest.skip("no collapsed answer in this notebook")
    notes = "\n".join(c.source for c in _derive(notebook) if _slide_type(c) == "notes")
    assert "**Answer" not in notes  # "**Answer**", or a named one: "**Answer: how many times smaller**"
    assert "**Answer" in "\n".join(c.source for c in _derive(notebook, solutions=True) if _slide_type(c) == "notes")
    published = student.student_notebook(notebook, answers=False)
    assert "<summary>Answer" not in published and "<summary>Hint" in published, "the hints stay"
    assert "<summary>Answer" in student.student_notebook(notebook)


def test_every_notebook_page_links_previous_index_next_its_deck_and_student_notebook():
    pages = site.pages()
    assert len(pages) == len(NOTEBOOKS) >= 2
    for at, page in enumerate(pages):
        nav = site.navigation(page, pages, "top")
        hrefs = re.findall(r'href="([^"]+)"', nav)
        assert "index.html" in hrefs and f"{page.stem}.slides.html" in hrefs
        assert f"{site.STUDENT_DIR}/{page.notebook.name}" in hrefs
        if at > 0:
            assert f"{pages[at - 1].stem}.html" in hrefs and 'rel="prev"' in nav
        if at + 1 < len(pages):
            assert f"{pages[at + 1].stem}.html" in hrefs and 'rel="next"' in nav


def test_site_page_for_05(page_05):
    assert page_05.count('class="course-nav') == 2, "navigation on top and at the bottom"
    assert 'href="04_rmsnorm.html"' in page_05 and 'href="06_rope.html"' in page_05
    assert 'href="05_attention.slides.html"' in page_05, "the page links its deck"
    assert re.search(rf'<a (download="" )?href="{site.STUDENT_DIR}/05_attention.ipynb"', page_05)
    assert "course-run-box" in page_05 and "make workshop" in page_05, "how to run it"
    assert 'src="images/architecture_attention.svg"' in page_05, "the diagram comes from the site's images/"
    assert WIDGET_VIEW not in page_05 and "Interactive in the notebook" in page_05
    assert page_05.count("data:image/png;base64,") >= 2, "the stored figures"
    assert "No description has been provided" not in page_05
    alts = re.findall(r'<img [^>]*alt="([^"]*)"[^>]*src="data:image/png', page_05) + \
        re.findall(r'<img src="data:image/png[^"]*" alt="([^"]*)"', page_05)
    assert alts and all(alt and alt != "Figure" for alt in alts), "each figure's alt text is its title"
    assert "$$" in page_05 or "\\(" in page_05, "the maths, for MathJax to typeset"
    assert not re.search(r'href="(?!https?:)[^"]*\.ipynb"', page_05.replace(f'href="{site.STUDENT_DIR}/', "")), \
        "links to notebooks point at their pages"


def test_the_repository_address_comes_from_one_setting(monkeypatch):
    monkeypatch.setenv(site.REPOSITORY_VARIABLE, "git@github.com:someone/transformer-from-scratch.git")
    assert site.repository_url() == "https://github.com/someone/transformer-from-scratch.git"
    assert site.repository_url("https://example.org/course.git") == "https://example.org/course.git"
    box = site.run_box(site.pages()[0], "https://example.org/course.git", solutions=False)
    assert "git clone https://example.org/course.git\ncd course" in box
    assert "ask your lecturer" in site.run_box(site.pages()[0], None, solutions=False)


def test_the_landing_page_is_for_learners():
    pages = site.pages()
    html = site.landing_page(pages, repository="https://example.org/course.git")
    for page in pages:
        assert f'href="{page.stem}.html"' in html and f'href="{page.stem}.slides.html"' in html
    text = htmllib.unescape(re.sub(r"<[^>]+>", "", html))
    assert "How to start" in text
    assert 'href="lecturers.html"' in html, "one line links the lecturers' page"
    for lecturers in ("SOLUTIONS=1", "speaker notes", "speaker view"):
        assert lecturers not in text, f"{lecturers!r} is on the lecturers' page, not on the learners' landing page"
    for developer in ("make test", "Conda", "Layout", "localhost", "benchmark", "CONTRIBUTING"):
        assert developer not in text, f"{developer!r} is for the repository's developers, not on the landing page"
    assert "git clone https://example.org/course.git" in text and 'src="images/architecture.svg"' in html
    hrefs = re.findall(r'<a [^>]*href="([^"#]+)', html)
    local = [h for h in hrefs if not re.match(r"[a-z]+:", h)]
    known = {"index.html", "lecturers.html"} | {f"{p.stem}.html" for p in pages} | \
        {f"{p.stem}.slides.html" for p in pages}
    assert set(local) <= known | {"data:,"}, "no link to a page the site does not have"


# README's and the site's promise to lecturers: a lecture (the slides before the appendix) is 20 to slides.LECTURE_MAX
# slides; a deck with more is two sessions, the first ending on an "End of part 1" slide that lists what it built, the
# second opening on a "Part 2 · …" slide (the notebook's diagram, what part 1 built and what part 2 shows).
LECTURE_MIN = 20  # issue 39: long code went to the notes and the final class's notes to the appendix


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_a_lecture_fits_a_session(notebook):
    cells = _derive(notebook)
    pages = _pages(cells)
    starts = [page[0].source.splitlines()[0] if page else "" for page in pages]
    lecture = slides.lecture_slides(cells)
    assert lecture == next(i for i, line in enumerate(starts) if line.startswith(f"## {slides.APPENDIX_PREFIX}"))
    parts = [i for i, line in enumerate(starts) if line.startswith(f"## {slides.PART_TWO}")]
    sessions = [parts[0], lecture - parts[0]] if parts else [lecture]
    assert all(LECTURE_MIN <= n <= slides.LECTURE_MAX for n in sessions), \
        f"{notebook.stem}: lecture slides per session {sessions}, the promise is {LECTURE_MIN} to {slides.LECTURE_MAX}"
    if not parts:
        assert lecture <= slides.LECTURE_MAX and not any(line == f"## {slides.PART_ONE_DONE}" for line in starts)
        return
    assert len(parts) == 1 and starts[parts[0] - 1] == f"## {slides.PART_ONE_DONE}", "part 1 ends on its recap"
    build = starts.index(slides.PART_TWO_BEFORE.replace("See it", slides.PART_TWO_AFTER))
    see_it = starts.index(slides.PART_TWO_BEFORE)
    after = starts[parts[0] + 1]
    assert build < parts[0] <= see_it + 1 and (after == slides.PART_TWO_BEFORE or
                                               (after.startswith("### ") and "(continued)" not in after)), \
        "the break falls before a part of the build or before See it, never inside a part"
    done, opener = pages[parts[0] - 1][0].source, pages[parts[0]][0].source
    steps = [line[4:] for line in starts[build:parts[0] - 1] if line.startswith("### Step ") and "(continued)" not in line]
    assert steps and all(f"* {step}" in done for step in steps), "the recap lists every step part 1 built"
    assert "**Next session, part 2:**" in done
    assert "**Part 1** built it" in opener and "**Part 2** shows" in opener and "<img" in opener
    assert "Step" not in opener.split("\n", 1)[0]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_pitfalls_take_one_or_two_slides(notebook):
    """A lecture's Pitfalls fill at most two slides; when they would take more, one slide lists them and the appendix
    holds them in full, each with what it does."""
    cells = _derive(notebook)
    pages = _pages(cells)
    starts = [page[0].source.splitlines()[0] if page else "" for page in pages]
    lecture = slides.lecture_slides(cells)
    at = starts.index(slides.PITFALLS)
    after = next(i for i in range(at + 1, len(starts)) if starts[i].startswith("## "))
    assert after - at <= slides.PITFALL_PAGES
    source = nbformat.read(notebook, as_version=4)
    named, section = [], ""
    for line in (line for c in source.cells if c.cell_type == "markdown" for line in c.source.splitlines()):
        section = line if line.startswith("## ") else section
        if section == slides.PITFALLS and re.match(r"### \d+\. ", line):
            named.append(line[4:])
    assert named, "the notebook's pitfalls, each a ### heading"
    shown = "\n".join(cell.source for page in pages[at:after] for cell in page)
    assert all(re.sub(r"^\d+\. ", "", name) in shown for name in named), "every pitfall is named in the lecture"
    appendix = "\n".join(cell.source for page in pages[lecture:] for cell in page)
    if "### 1." not in shown:
        assert all(f"### {name}" in appendix for name in named), "the appendix holds every pitfall in full"


# Issue 30: a deck speaks to a room
# A deck is shown to a room, not run: no sentence on a slide may only make sense in a notebook. Each entry is a phrase
# that does (NOTEBOOK_GUIDE.md: "Notebooks and decks speak to their medium"); slides.NOTEBOOK_ONLY leaves out the
# sentences the builder can tell, and the notebooks' text is written so that the rest reads right in both media.
NOTEBOOK_PHRASES = {
    # A widget's controls: the deck shows the default figure only (its controls become one generated note).
    "slider": r"\bsliders?\b",
    "an instruction to a control": r"^(move|drag|type|pick|choose|try) (the|it|your own|\$[^$]*\$) "
                                    r".*?(\bslider|\btext\b|\bcontrol|\babove\b|\bbelow\b)",
    # A magic the deck leaves out (slides._is_magic_only) or a measurement the reader is told to make.
    "%timeit": r"%timeit",
    "a result the notebook does not store": r"\bthis notebook (stores|saves|keeps) no\b|\bmeasure it yourself\b",
    # The notebook's own interface: its cells, its collapsed hints, running it.
    "a cell": r"\b(the|this|that|a new|next) cells?\b|\bcells? (below|above)\b",
    "in the notebook": r"\bin the notebook\b",
    "running": r"\b(run|re-run|rerun|execute) (the|this) (cell|notebook|code)\b|\bshift[- ]enter\b",
    "a collapsed block": r"\bcollapsed\b|\bfolded\b|\bclick\b|\bexpand (it|the)\b|\bopen (its|the|their) hints?\b",
    "scrolling": r"\bscroll",
    # Issue 39: a sentence about a widget's controls belongs in the notebook only (the deck shows the stored figure).
    "a control": r"\bnow you drive\b|\bpick an? (configuration|token|head|depth|prompt|model)\b|\bframed bar\b"
                 r"|\byour choice\b|^(move|drag|slide) (the|a|its)\b",
    "a figure the deck places elsewhere": r"\bthe (figures?|plots?|panels?) (below|above)\b",
    "the notebook as the medium": r"\bthis notebook does both\b|\bthis notebook's recipe\b",
}
# *Verify* sits in the deck's appendix, out of the lecture's path: a lecture slide does not send the room there.
VERIFY_POINTER = r"\*Verify\*"
# "Below, …" or "the loop below": a pointer to code, which reads wrong when the deck shows that code's output only.
CODE_POINTER = re.compile(r"(?:^|[.:;]\s+)(Below|Above),|\b(?:the|this|that) (?:loop|code|function|lines?|snippet) "
                          r"(below|above)\b", re.IGNORECASE)


def _code_shown(cells: list, index: int, below: bool) -> bool:
    """Whether the deck shows the code of the nearest code cell below (above) cell ``index``, within its part."""
    for cell in (cells[index + 1:] if below else reversed(cells[:index + 1])):
        if cell.cell_type == "code":
            return not cell.metadata.get("transient", {}).get("remove_source")
        heading = re.match(r"#{1,3} (.*)", cell.source)
        if heading and not heading[1].endswith("(continued)") and (below or cell is not cells[index]):
            return False
    return False


def _notebook_only_phrases(notebook: Path) -> list[str]:
    cells = [c for c in _derive(notebook) if _slide_type(c) != "notes"]
    found = []
    lecture = True
    for index, cell in enumerate(cells):
        if cell.cell_type == "code":
            if "%timeit" in cell.source and not cell.outputs and not cell.metadata.get("transient"):
                found.append(f"%timeit with no result: {cell.source.strip()[:80]!r}")
            continue
        if cell.source.startswith(f"## {slides.APPENDIX_PREFIX}"):
            lecture = False
        for heading in re.findall(r"^#{1,6} (.*)$", cell.source, re.MULTILINE):
            if re.search(NOTEBOOK_PHRASES["a control"], heading, re.I):
                found.append(f"a control: {heading!r}")
        for block in slides._blocks(cell.source):
            if "%timeit" in block:
                found.append(f"%timeit with no result: {block.strip()[:80]!r}")
            if re.match(r"\s*(#|```|<)", block):
                continue
            for sentence in slides._sentences(" ".join(block.split())):
                named = [name for name, phrase in NOTEBOOK_PHRASES.items() if re.search(phrase, sentence, re.I)]
                if lecture and re.search(VERIFY_POINTER, sentence):
                    named.append("a pointer to *Verify*")
                pointer = CODE_POINTER.search(sentence)
                if pointer and not _code_shown(cells, index, below=(pointer[1] or pointer[2]).lower() == "below"):
                    named.append("a pointer to code the deck hides")
                if named:
                    found.append(f"{', '.join(named)}: {sentence[:160]!r}")
    return found


def test_notebook_phrases_catch_the_lecturers_cases():
    caught = ["Move the sliders:", "The sliders above show the steps in between.", "%timeit f(x)",
              "How much faster depends on the machine, so this notebook stores no timings.",
              "Measure it yourself in a new cell:", "Run the cell below.", "Answers sit in collapsed blocks.",
              # issue 39's cases
              "Now you drive", "Pick a configuration and a context length.", "Move the peak rate and the warm-up.",
              "The bars are shares; the framed bar is your choice.", "The figures below read it.",
              "This notebook does both, on a CPU.", "XL, built with this notebook's recipe."]
    for text in caught:
        assert any(re.search(p, text, re.I) for p in NOTEBOOK_PHRASES.values()), text
    for text in ("Every weight above the diagonal is 0.", "Below $x \\approx -12$ float16 has no full-precision answer.",
                 "Pick a next token from the last position's prediction, append it, run the model again.",
                 "The KV cache keeps the keys and values of the tokens already read."):
        assert not any(re.search(p, text, re.I) for p in NOTEBOOK_PHRASES.values()), text
    assert CODE_POINTER.search("Below, both mistakes are made.") and CODE_POINTER.search("The loop below is those steps.")
    assert not CODE_POINTER.search("Below $x = 0$ the gate shuts.")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_a_deck_speaks_to_a_room(notebook):
    """No slide says what only makes sense in a notebook: sliders, cells, %timeit without its result, a pointer to
    *Verify* (in the appendix) or to code the deck hides."""
    assert _notebook_only_phrases(notebook) == []


# Issue 30: keys and the published site -----------------------------------------------------------------------

def test_one_key_steps_through_a_deck(deck_01):
    """reveal.js's linear navigation: → and Space (and a clicker's PageDown) step through every slide, the
    sub-slides included (tests/test_browser.py presses the keys)."""
    assert re.search(r'navigationMode:\s*"linear"', deck_01)


def test_the_lecturers_page():
    pages = site.pages()
    html = site.landing_page(pages, repository="https://example.org/course.git", lecturers=True)
    text = htmllib.unescape(re.sub(r"<[^>]+>", "", html))
    for page in pages:
        assert f'href="{page.stem}.slides.html"' in html, "every deck"
    assert 'href="index.html"' in html, "back to the learners' landing page"
    for needed in ("For lecturers", "Space", "PageDown", "clicker", "Esc", "speaker view", "make slides SOLUTIONS=1",
                   "make site SOLUTIONS=1", "not for publishing"):
        assert needed in text, needed
    for developer in ("make test", "CONTRIBUTING", "localhost"):
        assert developer not in text
    hrefs = re.findall(r'<a [^>]*href="([^"#]+)', html)
    local = {h for h in hrefs if not re.match(r"[a-z]+:", h)}
    known = {"index.html", "lecturers.html"} | {f"{p.stem}.html" for p in pages} | \
        {f"{p.stem}.slides.html" for p in pages}
    assert local <= known, "no link to a page the site does not have"


@pytest.mark.parametrize("url, remote", [
    ("https://github.com/someone/course.git", True), ("http://example.org/c.git", True),
    ("ssh://git@example.org/c.git", True), ("git://example.org/c.git", True), ("git@github.com:someone/c.git", True),
    ("/home/someone/course", False), ("../course", False), ("file:///home/someone/course", False),
    ("C:/Users/someone/course", False)])
def test_which_addresses_can_be_published(url, remote):
    assert site.is_remote(url) is remote


def test_a_local_origin_is_not_published(tmp_path, monkeypatch, capsys):
    """A clone of a local clone: its origin is a path on the lecturer's disk; the build warns (one line naming the
    path and REPOSITORY=) and no page shows it, nor any clone address."""
    import subprocess

    monkeypatch.delenv(site.REPOSITORY_VARIABLE, raising=False)
    clone = tmp_path / "clone"
    local = "/home/lecturer/private/transformer-from-scratch"
    subprocess.run(["git", "init", "-q", str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "remote", "add", "origin", local], check=True)
    assert site.repository_url(repo=clone) is None
    warning = [line for line in capsys.readouterr().err.splitlines() if local in line]
    assert len(warning) == 1 and "REPOSITORY=" in warning[0]
    out = tmp_path / "site"
    site.build(out, notebooks=[REPO / "notebooks" / "01_linear.ipynb"], landing=True, decks=False,
               repository=site.repository_url(repo=clone))
    written = sorted(out.glob("*.html"))
    assert {path.name for path in written} >= {"index.html", "lecturers.html", "01_linear.html"}
    for path in written:
        page = path.read_text(encoding="utf-8")
        assert local not in page and "/home/lecturer" not in page, path.name
    assert "ask your lecturer" in (out / "01_linear.html").read_text(encoding="utf-8")
    assert "your lecturer gives you its address" in (out / "index.html").read_text(encoding="utf-8")
    capsys.readouterr()
    # A remote origin is published as before.
    subprocess.run(["git", "-C", str(clone), "remote", "set-url", "origin", "git@example.org:someone/c.git"],
                   check=True)
    assert site.repository_url(repo=clone) == "https://example.org/someone/c.git"
    assert capsys.readouterr().err == ""


def test_the_student_notebook_link_says_how_to_get_it_from_disk():
    """From file:// Chromium ignores ``download`` and shows the .ipynb: the run box says to save the link, or where
    the file is in the site's folder; the navigation's link says so in its tooltip."""
    page = site.pages()[0]
    box = htmllib.unescape(re.sub(r"<[^>]+>", "", site.run_box(page, None, solutions=False)))
    assert "Save link as" in box and f"{site.STUDENT_DIR}/{page.notebook.name}" in box
    nav = site.navigation(page, site.pages(), "top")
    assert re.search(rf'<a href="{site.STUDENT_DIR}/{page.notebook.name}" title="[^"]*Save link as[^"]*" download>', nav)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_draws_in_the_course_style(notebook):
    """The figures' text size the decks rely on (slides.DEFAULT_FONT_PT) is the one the notebooks draw with: every
    notebook's Setup applies the course's style, and the style ships with the package."""
    nb = nbformat.read(notebook, as_version=4)
    setup = next(cell.source for cell in nb.cells if cell.cell_type == "code" and "%load_ext" in cell.source)
    assert 'plt.style.use("transformer_from_scratch.nbtools.course")' in setup
    assert "course.mplstyle" in (REPO / "pyproject.toml").read_text(encoding="utf-8"), "package data"
    import matplotlib
    import matplotlib.style  # not loaded by `import matplotlib` alone

    with matplotlib.style.context("transformer_from_scratch.nbtools.course"):
        assert matplotlib.rcParams["font.size"] == slides.DEFAULT_FONT_PT


# Issue 39: decks a lecturer teaches from without preparing a word -----------------------------------------------
# Every lecture slide (before the appendix) is checked for what a room cannot use: more than slides.MAX_WORDS words of
# prose, a code cell of more than slides.CODE_LINES lines, a list (or the sentence ending in a colon that introduces
# it) cut across two slides, a printed result with neither its code nor a word about it, and no speaker note. Where
# the fix belongs in a notebook this change could not touch, the slide is named below: a ratchet. A new case fails;
# so does a listed one that is gone (then delete its line).
KNOWN_ROOM_PROBLEMS: dict[str, set[str]] = {}


def _lecture_pages(cells: list) -> list[list]:
    """The lecture's sub-slides (the appendix left out), each a list of its cells, speaker notes included."""
    pages: list[list] = []
    for cell in cells:
        kind = _slide_type(cell)
        if kind == "slide" and cell.source.startswith(f"## {slides.APPENDIX_PREFIX}"):
            break
        if kind in ("slide", "subslide") or not pages:
            pages.append([])
        pages[-1].append(cell)
    return pages


_LIST_ITEM = re.compile(r"\s*([*-]|\d+\.) ")


def _room_problems(notebook: Path) -> list[str]:
    pages = _lecture_pages(_derive(notebook))
    found = []
    for n, page in enumerate(pages):
        shown = [c for c in page if _slide_type(c) != "notes"]
        heading = re.sub(r"\s*\(continued\)$", "", shown[0].source.split("\n")[0].lstrip("# ")) if shown else "?"
        label = f"#{n + 1} {heading}"
        prose = sum(slides.words(c.source) for c in shown if c.cell_type == "markdown")
        if prose > slides.MAX_WORDS:
            found.append(f"words: {heading}")
        for cell in shown:
            if cell.cell_type == "code" and not cell.metadata.get("transient", {}).get("remove_source") and \
                    len(cell.source.splitlines()) > slides.CODE_LINES:
                found.append(f"code: {heading}")
        if not any(_slide_type(c) == "notes" and c.metadata.get(slides.NOTE_MINUTES) for c in page):
            found.append(f"no note: {label}")
        body = [c for c in shown[1:] if c.source.strip() or c.cell_type == "code"]
        if body and all(c.cell_type == "code" and c.metadata.get("transient", {}).get("remove_source")
                        and not any("image/png" in o.get("data", {}) for o in c.outputs) for c in body) \
                and not re.sub(r"^#+ .*$", "", shown[0].source, flags=re.MULTILINE).strip():
            found.append(f"a result with no code or words: {heading}")
        following = [c for c in pages[n + 1] if _slide_type(c) != "notes"] if n + 1 < len(pages) else []
        continued = following and "(continued)" in following[0].source.split("\n")[0]
        later = [c for c in following[1:] if c.source.strip()]
        last = shown[-1] if shown else None
        if continued and later and later[0].cell_type == "markdown" and _LIST_ITEM.match(later[0].source) \
                and last is not None and last.cell_type == "markdown" and \
                (_LIST_ITEM.match(last.source) or last.source.rstrip().endswith((":", "."))):
            if _LIST_ITEM.match(last.source) or not last.source.lstrip().startswith("#"):
                found.append(f"a list split across slides: {heading}")
    return found


def test_room_problems_are_caught(tmp_path):
    """The checks find each problem in a notebook made to have it."""
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    words = " ".join(["word"] * 20) + "."
    items = "\n".join(f"* {words} {words} {words}" for _ in range(6))
    nb = nbformat.v4.new_notebook(cells=[
        md("# 11 · Dropout: forget a little\n\nA promise."), md("## Setup"), code("import torch"),
        md("## Why dropout?\n\nThree reasons, and two are new:\n\n" + items),
        md("## See it\n\n" + "\n\n".join([words * 3] * 3)),
        md("## Recap and next\n\n* It drops."),
    ])
    path = tmp_path / "11_dropout.ipynb"
    nbformat.write(nb, path)
    problems = _room_problems(path)
    assert problems and not any(p.startswith("no note") for p in problems), problems


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_a_lecture_slide_is_ready_for_the_room(notebook):
    """Issue 39: no lecture slide over slides.MAX_WORDS words or with code over slides.CODE_LINES lines, no list cut from
    its slide, no result without its code or a word, and every slide with a speaker note (the lecturer's or its point
    and minutes)."""
    problems = _room_problems(notebook)
    known = KNOWN_ROOM_PROBLEMS.get(notebook.stem, set())
    assert [p for p in problems if p not in known] == [], f"{notebook.stem}: new problems for the room"
    assert sorted(known - set(problems)) == [], f"{notebook.stem}: fixed, so delete from KNOWN_ROOM_PROBLEMS"


# Issue 39: the public site gives no exercise's answer away: not its solution code, not a self-check that compares
# with the answer in view (12 to 14 call checks computed out of view; an inline assert is left out of the page, see
# site.states_an_answer), not an answer's prose.
ANSWER_ON_A_PAGE = re.compile(r"^\s*assert\b|\bassert_close\(|\bisclose\(|\ballclose\(|\btorch\.equal\(|"
                              r"\bAnswer\b\s*$|BEGIN SOLUTION|END SOLUTION", re.MULTILINE)


def _exercises_text(page_html: str) -> str:
    """The text of a page's ## Exercises section, as the browser shows it (code included)."""
    start = page_html.find('id="Exercises"')
    assert start >= 0, "the page has its Exercises section"
    end = page_html.find("<h2", start)
    part = page_html[start:end if end >= 0 else len(page_html)]
    part = re.sub(r"<summary>", "\n", part)
    return htmllib.unescape(re.sub(r"<[^>]+>", "", part))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_no_exercise_answer_on_a_public_page(notebook):
    page = site.notebook_page(web.Page.of(notebook), site.pages())
    text = _exercises_text(page)
    found = [m[0].strip() for m in ANSWER_ON_A_PAGE.finditer(text)]
    assert found == [], f"{notebook.stem}'s public page gives exercises' answers away: {found[:5]}"
    assert site.SELF_CHECK_HIDDEN.splitlines()[0] in text or not any(
        site.states_an_answer(c.source) for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"
        and "Self-check" in c.source), "the page says where the left-out self-check runs"


def test_a_self_check_that_states_its_answer_is_left_out():
    assert site.states_an_answer('x = f(2)\nassert x == 4, "expected 4"')
    assert site.states_an_answer("torch.testing.assert_close(mine, F.linear(x, W))")
    assert not site.states_an_answer("from transformer_from_scratch.checks.steps.kv_cache_exercises import check_t\n"
                                     "check_t(t_attention)")
    assert not site.states_an_answer("# YOUR CODE HERE\nraise NotImplementedError()\nassert answer > 0")


# The notebooks whose lecturer's notes are written (issue 39): each ## section of the lecture opens with one, in
# metadata.lecturer (JupyterLab shows a learner none of it), and the deck makes it the slide's speaker note.
LECTURER_NOTEBOOKS = ("01_linear", "02_embedding", "03_softmax", "04_rmsnorm", "05_attention", "06_rope", "07_swiglu",
                      "08_multihead_attention", "09_transformer_block", "10_transformer_lm", "11_training", "12_kv_cache",
                      "13_tokenizer", "14_pretrained", "15_finetune", "16_fast_decode")


@pytest.mark.parametrize("stem", LECTURER_NOTEBOOKS)
def test_every_lecture_section_has_the_lecturers_note(stem):
    notebook = REPO / "notebooks" / f"{stem}.ipynb"
    nb = nbformat.read(notebook, as_version=4)
    sections: dict[str, bool] = {}
    section = ""
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            if line.startswith("## "):
                section = line
                sections.setdefault(section, False)
        note = cell.metadata.get(slides.LECTURER)
        if note:
            assert isinstance(note.get("minutes"), int) and note["minutes"] > 0 and note.get("say"), (stem, note)
            assert not note.get("expect") or note.get("ask"), "an expected answer goes with its question"
            if section:
                sections[section] = True
    lecture = [s for s in sections if s not in slides.SKIPPED_SECTIONS + slides.APPENDIX_SECTIONS]
    assert [s for s in lecture if not sections[s]] == [], f"{stem}: sections without the lecturer's note"
    cells = _derive(notebook)
    said = [c for c in cells if _slide_type(c) == "notes" and c.source.startswith("**Lecturer · ")]
    assert len(said) >= len(lecture), "every note reaches the deck"
    assert "lecturer" not in student.student_notebook(notebook).split('"cells"')[0], "nothing leaks into the header"


def test_the_lecturers_page_has_a_session_plan():
    pages = site.pages()
    html = site.landing_page(pages, repository="https://example.org/course.git", lecturers=True)
    text = htmllib.unescape(re.sub(r"<[^>]+>", "", html))
    for needed in ("A session plan", "At each", "What to prepare", "make weights", "LOCAL=1", "part 1 of 2"):
        assert needed in text, needed
    total = re.search(r"all\s*(\d+) sessions\s*(\d+)\s*(\d+) min", text)
    assert total, "the plan's totals"
    sessions = [s for p in pages for s in slides.sessions(p.notebook)]
    assert int(total[1]) == len(sessions) and int(total[2]) == sum(s.slides for s in sessions)
    assert int(total[3]) == sum(s.minutes for s in sessions) >= sum(s.slides for s in sessions), \
        "every lecture slide counts a minute at least"


def test_a_public_site_needs_the_repository_address(tmp_path, monkeypatch, capsys):
    """make site with no address to publish fails, saying how to give one, unless LOCAL=1 asks for a local build."""
    monkeypatch.delenv(site.REPOSITORY_VARIABLE, raising=False)
    monkeypatch.delenv(site.LOCAL_VARIABLE, raising=False)
    monkeypatch.setattr(site, "repository_url", lambda setting=None, repo=REPO: setting)
    built = []
    monkeypatch.setattr(site, "build", lambda out, **kw: built.append(kw) or [])
    assert site.main(["--out", str(tmp_path)]) == 2 and not built
    err = capsys.readouterr().err
    assert "REPOSITORY=" in err and "LOCAL=1" in err
    assert site.main(["--out", str(tmp_path), "--local"]) == 0 and built
    monkeypatch.setenv(site.LOCAL_VARIABLE, "1")
    assert site.main(["--out", str(tmp_path)]) == 0
    monkeypatch.delenv(site.LOCAL_VARIABLE)
    assert site.main(["--out", str(tmp_path), "--repository", "https://example.org/c.git"]) == 0
    assert "LOCAL=1" in (REPO / ".ci" / "run").read_text(encoding="utf-8"), "CI builds a local site"


def test_readme_sections_a_notebook_names_exist_and_the_site_links_them():
    """A notebook's "README's *X*" names a section the README has; with an http(s) address the site links the README
    and its sections."""
    sections = web.readme_sections()
    missing = {(p.stem, name) for p in NOTEBOOKS
               for cell in nbformat.read(p, as_version=4).cells if cell.cell_type == "markdown"
               for name in web.readme_mentions(cell.source) if web.readme_section(name, sections) is None}
    assert missing == set(), "a README section that does not exist"
    linked = web.link_readme("see README's *Chat with it* and *Benchmarks*; (README, *Speed*).",
                             "https://example.org/someone/course.git", sections)
    assert "[README](https://example.org/someone/course#readme)" in linked
    assert "(https://example.org/someone/course#chat-with-it-make-chat)" in linked and "*Benchmarks*" in linked
    assert "#speed-and-the-run-time-checks)" in linked
    assert web.link_readme("README's *Speed*", None) == "README's *Speed*"
    landing = site.landing_markdown(site.pages(), "https://example.org/someone/course.git")
    assert "(https://example.org/someone/course#readme)" in landing, "the landing page links the README"
