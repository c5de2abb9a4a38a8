"""``make slides``: one reveal.js deck per notebook, derived from the notebook's structure.

    python -m transformer_from_scratch.nbtools.slides [NOTEBOOK ...] [--out build/slides]

writes ``<out>/NN_name.slides.html`` for each notebook (default: all of them), with reveal.js, MathJax,
the diagrams and the CSS copied once under ``<out>/assets/`` and ``<out>/images/``: the decks need no
network. No cell carries hand-set slide metadata. ``DeriveSlides`` reads the template every notebook
follows and sets ``metadata.slideshow.slide_type`` on a copy (the notebook file is only read):

* The title ``# NN · Name: promise`` opens the deck, the diagram beside it; "**By the end of this
  notebook you can:**" and the objectives follow on a sub-slide.
* Every ``##`` section starts a slide (a column in reveal.js), every ``###`` a sub-slide (down the column),
  and so does each exercise (a paragraph opening ``**N. ``) and a paragraph that is only bold text.
* Markdown is cut into its paragraphs. When the next paragraph or cell would not fit on the sub-slide
  (heights estimated on the 1280 × 720 canvas), a sub-slide "… (continued)" takes over.
* A code cell that draws a figure: its code, then its figure, one fragment each (one key press each),
  on a sub-slide of their own when they do not fit below what is there. The code is left out when it is
  longer than ``CODE_LINES`` lines or when code and figure do not fit on one slide together.
* A code cell without a figure is shown with its printed output (cut to ``OUTPUT_LINES`` lines) when it has
  at most ``CODE_LINES`` lines; a longer one (a helper's definition) is left out: the notebook has it.
* Left out: the ``## Setup`` section (imports, seeds), the export cell, the code of ``## Exercises``
  (solutions, self-checks). The final class (``#| export`` cells) is shown as its outline: signatures and
  the first line of each docstring; the bodies are what the learners write.
* ``<details>`` blocks (hints, answers) move to the speaker notes: press S for the speaker view.
* A widget's controls become a one-line note naming them, above the default figure the notebook stored.

Keys in a deck: → / Space next, ← previous, ↓ ↑ within a column, Esc overview, F full screen,
S speaker view (notes), ? all keys.
"""

from __future__ import annotations

import argparse
import ast
import base64
import copy
import math
import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbconvert.exporters import SlidesExporter
from nbconvert.preprocessors import Preprocessor

from .web import REPO, TEMPLATES, Page, WidgetNote, copy_assets, notebook_link, notebooks, rewrite_links

DEFAULT_OUT = REPO / "build" / "slides"
SKIPPED_SECTIONS = ("## Setup",)
CODE_LINES = 12  # longer code is left out (a figure it draws is still shown)
OUTPUT_LINES = 9  # printed output beyond this many (wrapped) lines is cut, saying how much is left out
WIDTH, HEIGHT = 1280, 720  # reveal.js's canvas; templates/static/slides.css sizes the text for it

# Estimated heights in canvas pixels, matching templates/static/slides.css. A sub-slide holds BUDGET.
BUDGET = 600
PROSE = (31, 100)  # (pixels per rendered line, characters per line) of body text
CODE = (24, 104)
OUTPUT = (21, 108)
HEADING = {1: 56, 2: 52, 3: 44}  # per rendered line
HEADING_CHARS = {1: 44, 2: 56, 3: 70}
GAP = 14  # between two cells
CODE_PADDING = 18
FIGURE_MAX_HEIGHT = 430  # img max-height for an output figure on a slide
FIGURE_MAX_WIDTH = 1200
IMAGE_MAX_HEIGHT = 400  # an image in the markdown
NOTE_HEIGHT = 34


def _rows(text: str, chars: int) -> int:
    return sum(max(1, math.ceil(len(line) / chars)) for line in text.splitlines()) if text else 0


@dataclass
class Piece:
    """One cell of the deck, with what starts it and its estimated height."""

    cell: nbformat.NotebookNode
    kind: str  # "slide", "subslide", "flow", "figure" (a code cell that draws one), "notes"
    height: int = 0  # for a figure: the height of its outputs
    heading: str = ""  # a slide's or sub-slide's heading, repeated on its continuations
    code_height: int = 0  # a figure's code, 0 when it is left out


# --- Markdown -----------------------------------------------------------------------------------------

def _blocks(source: str) -> list[str]:
    """Paragraph-level blocks: split at blank lines, keeping fences, $$ maths, <details> and list items whole."""
    blocks: list[list[str]] = []
    current: list[str] = []
    fence = math_open = False
    details = 0
    for line in source.splitlines():
        stripped = line.strip()
        if not (fence or math_open or details) and re.match(r"#{1,6} ", line):
            if current:
                blocks.append(current)
            blocks.append([line])  # a heading is a block of its own
            current = []
            continue
        if stripped == "" and not (fence or math_open or details):
            if current:
                blocks.append(current)
                current = []
            continue
        if not current and blocks and line.startswith("  ") and re.match(r"\s*([*-]|\d+\.) ", blocks[-1][0]):
            current = blocks.pop() + [""]  # a list item's continuation after a blank line
        current.append(line)
        if stripped.startswith("```"):
            fence = not fence
        elif not fence:
            math_open ^= stripped.count("$$") % 2 == 1
            details += stripped.count("<details") - stripped.count("</details>")
    if current:
        blocks.append(current)
    return ["\n".join(block) for block in blocks]


def _details_to_notes(block: str) -> str:
    """A <details><summary>Hint 1: …</summary> … </details> block as plain Markdown for the speaker notes."""
    text = re.sub(r"<summary>(.*?)</summary>", r"**\1**\n\n", block, flags=re.DOTALL)
    text = re.sub(r"</?details>", "", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _image_height(block: str, notebook_dir: Path) -> int:
    """The height of the (first) image in a Markdown block, from its width and the SVG's aspect ratio."""
    tag = re.search(r"<img[^>]*>", block)
    target = re.search(r'src="([^"]+)"', tag[0]) if tag else re.search(r"!\[[^\]]*\]\(([^)\s]+)\)", block)
    if not target:
        return 0
    width = re.search(r'width="(\d+)"', tag[0]) if tag else None
    width = int(width[1]) if width else 600
    ratio = 0.75
    # The link may already point beside the deck (images/…): look beside the notebook, then one folder up.
    path = next((p for p in (notebook_dir / target[1], notebook_dir.parent / target[1]) if p.is_file()), None)
    if path is not None and path.suffix == ".svg":
        box = re.search(r'viewBox="[\d.]+ [\d.]+ ([\d.]+) ([\d.]+)"', path.read_text(encoding="utf-8")[:2000])
        if box:
            ratio = float(box[2]) / float(box[1])
    return min(IMAGE_MAX_HEIGHT, int(width * ratio))


def _visible_length(text: str) -> int:
    """About how many characters ``text`` shows once rendered: no link targets, markup, TeX command names."""
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"\\[a-zA-Z]+", "x", text)
    return len(re.sub(r"[`*_{}^$\\]", "", text))


def _markdown_height(block: str, notebook_dir: Path) -> int:
    heading = re.match(r"(#{1,3}) (.*)", block)
    if heading:
        level = len(heading[1])
        return HEADING[level] * max(1, math.ceil(_visible_length(heading[2]) / HEADING_CHARS[level])) + GAP
    if re.match(r"\s*(<img|!\[)", block):
        return _image_height(block, notebook_dir) + GAP
    height, item, in_math = 0, "", False

    def flush() -> int:
        return PROSE[0] * math.ceil(_visible_length(item) / PROSE[1]) if item.strip() else 0

    for line in block.splitlines():
        stripped = line.strip()
        if stripped.startswith("$$") or in_math:  # display maths: a row per line of TeX (or \\ in it)
            height, item = height + flush(), ""
            if stripped.startswith("$$"):
                in_math = not in_math if stripped == "$$" else False
                height += 14 if stripped == "$$" else 56
            else:
                height += 50 + 36 * stripped.count("\\\\")
        elif stripped.startswith("|"):  # a table row (its rule is no row)
            height, item = height + flush(), ""
            height += 0 if set(stripped) <= set("|-: ") else 36
        elif re.match(r"([*-]|\d+\.) ", stripped):  # a list item starts
            height, item = height + flush() + 6, stripped + " " * 4
        else:
            item += " " + stripped
    return height + flush() + GAP


def _markdown_pieces(cell, notebook_dir: Path, title: bool) -> list[Piece]:
    pieces = []
    for block in _blocks(cell.source):
        new = nbformat.v4.new_markdown_cell(block)
        stripped = block.strip()
        if stripped.startswith("<details"):
            new.source = _details_to_notes(block)
            pieces.append(Piece(new, "notes"))
            continue
        heading = re.match(r"(#{1,3}) (.*)", stripped)
        height = _markdown_height(block, notebook_dir)
        if heading and len(heading[1]) <= 2:
            pieces.append(Piece(new, "slide", height, heading[2]))
        elif heading:
            pieces.append(Piece(new, "subslide", height, heading[2]))
        elif re.fullmatch(r"\*\*[^*\n]+\*\*", stripped):  # "**By the end of this notebook you can:**"
            new.source = "### " + stripped.strip("*").rstrip(":")
            pieces.append(Piece(new, "subslide", HEADING[3] + GAP, new.source[4:]))
        elif re.match(r"\*\*\d+\. ", stripped):  # an exercise: "**1. Predict** · ★☆☆ · 3 min. …"
            title = re.match(r"\*\*(\d+\.[^*]*)\*\*((?:\s*·\s*[^·.]+?)*)\.\s+", stripped)
            if title:  # its name, difficulty and time become the sub-slide's heading
                heading = f"Exercise {title[1].strip()}{title[2]}"
                start = nbformat.v4.new_markdown_cell(f"### {heading}")
                pieces.append(Piece(start, "subslide", _markdown_height(start.source, notebook_dir), heading))
                new.source = stripped[title.end():]
                pieces.append(Piece(new, "flow", _markdown_height(new.source, notebook_dir)))
            else:
                pieces.append(Piece(new, "subslide", height, "Exercise"))
        elif title and re.match(r"<img|!\[", stripped):
            new.metadata["tags"] = ["slides-aside"]  # floats right of the title and the promise
            pieces.append(Piece(new, "flow", 0))
        else:
            pieces.append(Piece(new, "flow", height))
    if title:  # one cell: the diagram first, floating right of the heading and the promise
        asides = [p for p in pieces if p.cell.metadata.get("tags") == ["slides-aside"]]
        rest = [p for p in pieces if p not in asides]
        end = next((i for i, p in enumerate(rest) if i and p.kind != "flow"), len(rest))
        if asides and rest:
            first = rest[0]
            first.cell.source = "\n\n".join([asides[0].cell.source] + [p.cell.source for p in rest[:end]])
            first.cell.metadata["tags"] = ["slides-title"]
            first.height = HEIGHT  # the slide is full
            pieces = [first] + rest[end:]
    return pieces


# --- Code ---------------------------------------------------------------------------------------------

def outline(source: str) -> str | None:
    """The classes' and functions' signatures and first docstring lines, bodies as ``...``."""
    lines = [line for line in source.splitlines() if line.strip() != "#| export"]
    text = "\n".join(lines)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    out: list[str] = []

    def emit(node, depth: int) -> None:
        start = min([d.lineno for d in node.decorator_list] + [node.lineno])
        end = node.body[0].lineno - 1 if node.body[0].lineno > node.lineno else node.lineno
        header = [line for line in lines[start - 1:end] if not line.strip().startswith("#")]
        if out and depth == 0:
            out.append("")
        out.extend(header)
        indent = " " * (node.col_offset + 4)
        doc = ast.get_docstring(node)
        if doc:
            out.append(f'{indent}"""{doc.strip().splitlines()[0]}"""')
        if isinstance(node, ast.ClassDef):
            for child in node.body:
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        (not child.name.startswith("_") or child.name in {"__init__", "__call__"}):
                    out.append("")
                    emit(child, depth + 1)
        else:
            out.append(f"{indent}...")

    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            emit(node, 0)
    return "\n".join(out) or None


def _is_figure(output) -> bool:
    return any(key.startswith("image/") for key in output.get("data", {}))


def _png_size(output) -> tuple[int, int]:
    png = base64.b64decode(output["data"]["image/png"])
    return struct.unpack(">II", png[16:24])


def _fit_figures(outputs: list, max_height: int) -> int:
    """Size each saved figure for the slide: up to 1.5 times its saved size, at most ``max_height`` tall and
    ``FIGURE_MAX_WIDTH`` wide (the template writes the size into the <img>); return the outputs' height."""
    for output in outputs:
        if "image/png" in output.get("data", {}):
            width, height = _png_size(output)
            scale = min(1.5, max_height / height, FIGURE_MAX_WIDTH / width)
            output.setdefault("metadata", {})["image/png"] = {"width": round(width * scale),
                                                              "height": round(height * scale)}
    return _outputs_height(outputs)


def _cut_text(outputs: list) -> list:
    """Merge the printed output (where it first appears) and keep its first OUTPUT_LINES lines."""
    kept, text, at = [], [], None
    for output in outputs:
        if output.output_type == "stream" and output.name == "stdout":
            at = len(kept) if at is None else at
            text.append(output.text)
        else:
            kept.append(output)
    lines = "".join(text).splitlines()
    rows = [max(1, math.ceil(len(line) / OUTPUT[1])) for line in lines]
    keep = next((n for n in range(len(lines)) if sum(rows[:n + 1]) > OUTPUT_LINES), len(lines))
    if keep < len(lines):
        lines = lines[:keep] + [f"… ({len(lines) - keep} more lines in the notebook)"]
    if lines:
        kept.insert(at, nbformat.v4.new_output("stream", name="stdout", text="\n".join(lines) + "\n"))
    return kept


def _outputs_height(outputs: list) -> int:
    height = 0
    for output in outputs:
        if output.output_type == "stream":
            height += OUTPUT[0] * _rows(output.text, OUTPUT[1]) + 10
        elif "image/png" in output.get("data", {}):
            size = output.get("metadata", {}).get("image/png", {})
            height += size.get("height", _png_size(output)[1]) + 12
        elif _is_figure(output):
            height += FIGURE_MAX_HEIGHT
        elif "text/html" in output.get("data", {}):
            height += NOTE_HEIGHT
        else:
            height += OUTPUT[0] * _rows("".join(output.get("data", {}).get("text/plain", "")), OUTPUT[1])
    return height


def _code_cell(source: str, outputs: list, hide_source: bool = False):
    cell = nbformat.v4.new_code_cell(source, outputs=outputs)
    if hide_source:
        cell.metadata["transient"] = {"remove_source": True}
    return cell


def _code_pieces(cell, section: str) -> list[Piece]:
    source = cell.source.strip()
    if section == "## Exercises" or "export_notebook(" in source:
        return []
    if source.startswith("#| export"):
        shape = outline(source)
        if not shape:
            return []
        return [Piece(_code_cell(shape, []), "flow", CODE[0] * _rows(shape, CODE[1]) + CODE_PADDING + GAP)]
    outputs = _cut_text(copy.deepcopy(cell.get("outputs", [])))
    short = len(source.splitlines()) <= CODE_LINES
    code_height = CODE[0] * _rows(source, CODE[1]) + CODE_PADDING + GAP
    if any(_is_figure(output) for output in outputs):
        return [Piece(_code_cell(source, outputs, hide_source=not short), "figure",
                      code_height=code_height if short else 0)]
    if short:
        return [Piece(_code_cell(source, outputs), "flow", code_height + _outputs_height(outputs))]
    return []


# --- Putting the pieces on slides ---------------------------------------------------------------------

def _continued(heading: str) -> Piece:
    heading = re.sub(r"\s*\(continued\)$", "", heading)
    cell = nbformat.v4.new_markdown_cell(f"### {heading} (continued)" if heading else "")
    return Piece(cell, "subslide", HEADING[3] + GAP, heading)


def _set(piece: Piece, slide_type: str) -> nbformat.NotebookNode:
    piece.cell.metadata["slideshow"] = {"slide_type": slide_type}
    return piece.cell


def _place_figure(piece: Piece, room: int) -> tuple[str, int] | None:
    """How a code cell and its figure fit in ``room`` pixels: "together" (the code, then the figure below it),
    "swap" (the code, then the figure in its place), "figure" (no code); None when they do not fit."""
    outputs = piece.cell.outputs
    code = piece.code_height
    for mode, min_figure in (("together", 340), ("swap", 300)) if code else (("figure", 300),):
        pngs = [output for output in outputs if "image/png" in output.get("data", {})]
        text = _outputs_height([output for output in outputs if output not in pngs])
        left = room - (code if mode == "together" else 0) - GAP - text
        max_height = min(FIGURE_MAX_HEIGHT, left // max(1, len(pngs)) - 12)
        if max_height < min_figure or (mode == "swap" and code > room):
            continue
        height = _fit_figures(outputs, max_height) + GAP
        return mode, (code + height if mode == "together" else max(code, height))
    return None


def layout(pieces: list[Piece]) -> list[nbformat.NotebookNode]:
    """Give each piece its slide type: slides and sub-slides where the notebook starts them, fragments for
    figures (and what follows them), and continuation sub-slides where a sub-slide is full."""
    cells: list[nbformat.NotebookNode] = []
    used, heading, fragments = 0, "", False
    last_heading = None  # the cell of the last "##" (or title) that started a slide

    def new_subslide(start: Piece, kind: str) -> None:
        nonlocal used, heading, fragments
        cells.append(_set(start, kind))
        used, heading, fragments = start.height, start.heading or heading, False

    i = 0
    while i < len(pieces):
        piece = pieces[i]
        i += 1
        if piece.kind == "notes":
            cells.append(_set(piece, "notes"))
        elif piece.kind == "subslide" and cells and cells[-1] is last_heading and used + piece.height <= BUDGET:
            cells.append(_set(piece, "-"))  # "## Section" right before "### First part": one slide, both headings
            used += piece.height
            heading = piece.heading
        elif piece.kind in ("slide", "subslide"):
            new_subslide(piece, piece.kind)
            last_heading = piece.cell if piece.kind == "slide" else None
        elif piece.kind == "figure":
            placed = _place_figure(piece, BUDGET - used)
            if placed is None and used > _continued(heading).height:
                new_subslide(_continued(heading), "subslide")
            placed = placed or _place_figure(piece, BUDGET - used)
            if placed is None:  # taller than any slide: shown at most FIGURE_MAX_HEIGHT tall, reveal.js scales
                _fit_figures(piece.cell.outputs, FIGURE_MAX_HEIGHT)
                placed = ("swap" if piece.code_height else "figure"), BUDGET
            mode, height = placed
            piece.cell.metadata["slides_figure"] = mode
            cells.append(_set(piece, "fragment" if fragments else "-"))
            used += height
            fragments = fragments or mode != "figure"
        else:
            after = pieces[i] if i < len(pieces) else None
            keep = 0  # prose right before code stays with it ("keep with next")
            if piece.cell.cell_type == "markdown" and after is not None and after.cell.cell_type == "code":
                keep = max(after.code_height, 300 + GAP) if after.kind == "figure" else after.height
            fresh = BUDGET - _continued(heading).height
            if used > _continued(heading).height and (used + piece.height > BUDGET or (
                    used + piece.height + keep > BUDGET and piece.height + keep <= fresh)):
                new_subslide(_continued(heading), "subslide")
            cells.append(_set(piece, "fragment" if fragments else "-"))
            used += piece.height
    return cells


class DeriveSlides(Preprocessor):
    """Set every cell's ``slideshow.slide_type`` from the notebook's structure (on a copy of it)."""

    def preprocess(self, nb, resources):
        nb = copy.deepcopy(nb)
        notebook_dir = Path(resources.get("metadata", {}).get("path") or REPO / "notebooks")
        pieces: list[Piece] = []
        section = ""
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "markdown":
                h2 = [line for line in cell.source.splitlines() if line.startswith("## ")]
                if h2:
                    section = h2[-1].strip() if not h2[-1].startswith("## Why") else "## Why"
                if section in SKIPPED_SECTIONS:
                    continue
                source = rewrite_links(cell.source, lambda target: notebook_link(target, ".slides.html"))
                pieces += _markdown_pieces(nbformat.v4.new_markdown_cell(source), notebook_dir, title=index == 0)
            elif cell.cell_type == "code" and section not in SKIPPED_SECTIONS:
                pieces += _code_pieces(cell, section)
        nb.cells = layout(pieces)
        return nb, resources


def exporter() -> SlidesExporter:
    return SlidesExporter(
        template_name="course_slides",
        extra_template_basedirs=[str(TEMPLATES)],
        extra_template_paths=[str(TEMPLATES)],
        preprocessors=[WidgetNote(), DeriveSlides()],
        exclude_input_prompt=True,
        exclude_output_prompt=True,
        reveal_url_prefix="assets/reveal.js",
        reveal_theme="white",
        reveal_width=str(WIDTH),
        reveal_height=str(HEIGHT),
    )


def deck(path: Path, slides: SlidesExporter | None = None) -> str:
    """The HTML of the deck for the notebook at ``path`` (it expects assets/ and images/ beside it)."""
    page = Page.of(path)
    nb = nbformat.read(path, as_version=4)
    resources = {"metadata": {"name": path.stem, "path": str(path.parent)}, "course": {"title": page.short}}
    body, _ = (slides or exporter()).from_notebook_node(nb, resources=resources)
    return body


def build(paths: list[Path], out: Path = DEFAULT_OUT) -> list[Path]:
    """Write one deck per notebook into ``out`` (and the assets beside them); return the decks' paths."""
    out.mkdir(parents=True, exist_ok=True)
    copy_assets(out, reveal=True, css="slides.css")
    slides = exporter()
    written = []
    for path in paths:
        target = out / f"{path.stem}.slides.html"
        target.write_text(deck(path, slides), encoding="utf-8")
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m transformer_from_scratch.nbtools.slides",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="guided notebooks (default: all of them)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the decks go (default: build/slides)")
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.notebooks] or notebooks()
    for deck in build(paths, args.out.resolve()):
        print(f"wrote {deck}")
    print(f"Open a deck in a browser (offline is fine): {args.out / (paths[0].stem + '.slides.html')}; "
          "press ? for the keys, S for the speaker notes.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
