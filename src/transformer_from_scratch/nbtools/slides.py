"""``make slides``: one reveal.js deck per notebook, derived from the notebook's structure.

    python -m transformer_from_scratch.nbtools.slides [NOTEBOOK ...] [--out build/slides] [--solutions]

writes ``<out>/NN_name.slides.html`` for each notebook (default: all of them), with reveal.js, MathJax,
the diagrams and the CSS copied once under ``<out>/assets/`` and ``<out>/images/``: the decks need no
network. No cell carries hand-set slide metadata. ``DeriveSlides`` reads the template every notebook
follows and sets ``metadata.slideshow.slide_type`` on a copy (the notebook file is only read):

* The title ``# NN · Name: promise`` opens the deck, the diagram beside it; "**By the end of this
  notebook you can:**" and the objectives follow on a sub-slide.
* Every ``##`` section starts a slide (a column in reveal.js); a ``###`` heading starts a sub-slide (down the
  column) unless its part is short enough to share the sub-slide before it. An exercise (a paragraph opening
  ``**N. ``) gets a heading of its own; short exercises share a sub-slide.
* Markdown is cut into its paragraphs. Each section's paragraphs, code and figures are spread over as few
  sub-slides as they need, evenly, with heights estimated on the 1280 × 720 canvas (``paginate``): a page never
  ends on a paragraph that ends with a colon, a list stays on one page with the sentence that introduces it (only a
  list too long for one page is cut, at LIST_COST), prose stays with the code or figure right after it, a page holds
  at most about MAX_WORDS words, and a leftover of a few lines is avoided. A sub-slide that continues a part is
  headed "… (continued)".
* Every result stays. A code cell is shown with its output when it has at most ``CODE_LINES`` (8) lines; a longer
  one shows its output only (text, table or figure) and its code goes into the speaker notes. Printed output is cut
  at ``OUTPUT_LINES`` lines, saying how much is left out.
* Figures are sized for the room: the smallest text drawn in a figure (read from the code that drew it: the
  course style's 12 pt, or a ``fontsize`` it sets) is ``MIN_TEXT_PX`` canvas pixels where the slide has room, up to
  1.5 times the saved size, and never below ``FLOOR_TEXT_PX`` (16). A figure whose panels do not fit side by side at
  the floor is cut into its panels (found by the white columns between them) and shown as rows, one sub-slide each
  when need be. A figure's code, when shown,
  comes first, then its figure (one key press each), below it or in its place.
* Left out: the ``## Setup`` section (imports, seeds), the code of ``## Pitfalls`` (its outputs stay: what the
  mistake does), the export cell and the sentence that introduces it,
  the code of ``## Exercises`` (solutions, self-checks), a long definition with no output (unless the text
  announces it, ending with a colon: then its outline), magics with no output (``%timeit``), and sentences
  that only make sense in the notebook (cells, collapsed hints, the student edition, a widget's controls: "Move
  the …", "Pick a …", sliders, "the figures below"); a widget's heading "Now you drive: X" says "X".
* What the learners write is never on a slide: the final class (``#| export`` cells) shows as its outline
  (signatures and the first line of each docstring), and a step's solution region as ``...``. With
  ``--solutions`` (the instructor's decks) the full code goes into the speaker notes.
* The appendix: ``## Verify``, the final class's ``### Check it`` and the rest of ``## The final class`` after its
  first cell (the task stays in the lecture; the outline, a reference for the workshop, moves) go after the recap,
  as uncounted slides (reveal.js's ``data-visibility="uncounted"``): in the deck, out of the lecture's path. A
  step's self-check shows its output only.
* Every lecture slide has a speaker note (press S for the speaker view) that opens with what a lecturer says:
  the notebook's own talking points where a Markdown cell carries them in ``metadata.lecturer`` (``{"minutes": 3,
  "say": …, "ask": …, "expect": …}``, which JupyterLab does not show the learner: see ``lecturer_note``), on the slide
  where that cell starts; else the slide's point (its first sentence, or what it shows) and its minutes
  (``_point_note``). ``sessions`` adds the minutes up for the lecturers' page. ``<details>`` blocks follow in the
  notes: the hints in every deck, the exercises' answers in the instructor's decks only (``--solutions``).
* The final class's first cell (its task) stays in the lecture; where its lists (how the class is written) would
  take more than a slide, they move to the appendix under a heading of their own. Pitfalls listed on one slide get
  a full sentence each and, where there is room, the sentence that gives the fix.
* A widget's controls become a one-line note naming them, above the default figure the notebook stored. Where it
  stored preset states (``interactive_figure(states=...)``), they follow over that figure instead, one fragment
  each, each with its sentence below it; the speaker notes list them and name the controls.

Keys in a deck (reveal.js's linear navigation): → ↓ Space PageDown (a clicker's keys) the next fragment or slide,
sub-slides included (a section is always entered at its top, even after a jump back), ← ↑ PageUp back one,
Esc overview (the sections as columns), F full screen, S speaker view (notes), ? all keys.
"""

from __future__ import annotations

import argparse
import ast
import base64
import copy
import html
import io
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbconvert.exporters import SlidesExporter
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

from . import interactive, web
from .web import REPO, TEMPLATES, FigureAlt, Page, WidgetNote, copy_assets, notebook_link, notebooks, rewrite_links

DEFAULT_OUT = REPO / "build" / "slides"
INSTRUCTOR_OUT = REPO / "build" / "slides-instructor"
SKIPPED_SECTIONS = ("## Setup",)
PITFALLS = "## Pitfalls"  # its code shows its output only: one or two slides in the lecture
PITFALL_PAGES = 2  # more, and the lecture lists the pitfalls on one slide; the appendix holds them in full
# The sentence of a pitfall that says how to get it right (on the slide that lists the pitfalls, after its first).
PITFALL_FIX = re.compile(r"\b(the fix|fix(es|ed)? (it|this)|instead|rather than|the right way|always|never)\b|; (decode|use|"
                         r"keep|cut|count|compute|call|pass|take|add|hold)\b", re.IGNORECASE)
APPENDIX_SECTIONS = ("## Verify",)  # moved after the recap
APPENDIX_PARTS = ("### Check it",)  # a ### part moved into the appendix, from wherever it is
# A section whose first cell (its heading and the task) stays in the lecture and the rest moves to the appendix: the
# final class's outline is the workshop's reference, not the lecture's (each of its steps was on a slide already).
APPENDIX_AFTER_INTRO = ("## The final class",)
APPENDIX_PREFIX = "Appendix · "
# A lecture longer than LECTURE_MAX slides becomes two sessions: part 1 ends on a slide listing what it built, part 2
# opens on a title slide "Part 2 · …" with the notebook's diagram, what part 1 built and what part 2 shows.
LECTURE_MAX = 40
PART_TWO = "Part 2 · "
PART_TWO_BEFORE = "## See it"  # the break goes here, or before a part of the build, where the two come out most even
PART_TWO_AFTER = "Build it step by step"
PART_ONE_DONE = "End of part 1"
NAMES = {"Llama", "Shakespeare", "Adam", "AdamW", "Hugging", "PyTorch"}  # kept capitalised inside a sentence
CODE_LINES = 8  # longer code shows its output only, and goes into the speaker notes
OUTPUT_LINES = 16  # printed output beyond this many (wrapped) lines is cut, saying how much is left out
WIDTH, HEIGHT = 1280, 720  # reveal.js's canvas; templates/static/slides.css sizes the text for it

# Estimated heights in canvas pixels, matching templates/static/slides.css. A sub-slide's content fills at most
# BUDGET pixels from the top: below it sit the controls (bottom right) and the slide number (bottom left).
BUDGET = 636
PROSE = (32.5, 98)  # (pixels per rendered line, characters per line) of body text
CODE = (24.7, 104)
OUTPUT = (21.25, 116)
HEADING = {1: 56, 2: 76, 3: 56}  # the first rendered line, with its margins
HEADING_LINE = {1: 53, 2: 46, 3: 37}  # each further line
HEADING_CHARS = {1: 44, 2: 60, 3: 76}
GAP = 14  # between two cells
PARAGRAPH = 12  # below a paragraph
CODE_PADDING = 20
SWAP_ABOVE = 330  # a code cell with its output taller than this may show its output in place of its code
TASK_PADDING = 22  # the box around a "Your turn" task
IMAGE_MAX_HEIGHT = 400  # an image in the markdown
NOTE_HEIGHT = 34
CAPTION = (28, 110)  # a figure's title as a caption (templates/static/slides.css: .course-figure-title)
TITLE_FIGURE_ROOM = BUDGET - HEADING[3] - GAP  # the most a figure may take, below a sub-slide's heading
# A page that ends on a figure may go further down than the text: the controls and the slide number sit in the
# corners, beside a centred figure: FIGURE_BOTTOM further when it is at most CLEAR_WIDTH wide, else WIDE_BOTTOM.
FIGURE_BOTTOM = 52
WIDE_BOTTOM = 28
CLEAR_WIDTH = 1140

# Figures. The notebooks draw with the course's style (nbtools/course.mplstyle: text at 12 pt unless a figure says
# otherwise) and save PNGs at 100 dpi.
FLOOR_TEXT_PX = 16.3  # no text in a deck's figure is smaller, in canvas pixels: 16 and a margin for rounding
MIN_TEXT_PX = 17.5  # the size a figure's smallest text takes where the slide has room; pages may shrink it to the floor


def _style_font_pt() -> float:
    """font.size of the course's matplotlib style, the size of every text a figure does not size itself."""
    style = Path(__file__).with_name("course.mplstyle").read_text(encoding="utf-8")
    return float(re.search(r"^font\.size\s*:\s*([0-9.]+)", style, re.MULTILINE).group(1))


DEFAULT_FONT_PT = _style_font_pt()
NAMED_FONT_SIZES = {"xx-small": 0.579, "x-small": 0.694, "small": 0.833, "medium": 1.0, "large": 1.2,
                    "x-large": 1.44, "xx-large": 1.728, "smaller": 0.833}
MAX_FIGURE_SCALE = 1.5
FIGURE_MAX_WIDTH = 1170  # centred, clear of the controls (right) and the slide number (left)
IMAGE_MARGIN = 24  # around an <img> in an output
MIN_PANEL_WIDTH = 150  # narrower runs of ink (a colorbar, a rotated label) belong to a neighbouring panel

# Page-breaking costs (``paginate``): fewer pages first, then even ones; breaks where the notebook has a heading.
PAGE_COST = 1000
SLACK_COST = 60  # per (100 px of empty room)², so that pages are even
CONTINUED_COST = 250  # a page that continues a part ("(continued)")
MERGE_COST = 700  # a ### part that shares the page of the part before it
SPLIT_PROSE_COST = 2500  # prose separated from the code or figure right after it
KEEP_COST = 10**6  # a page that ends on an exercise's heading
COLON_COST = 5000  # a page that ends on a colon (rewritten as a full stop): worse than a leftover, not than a title alone
# A list stays on one slide with the sentence that introduces it: a break inside it, or between the sentence ending
# in a colon and the list, is worse than any leftover or a top-third page, and only a list too long for one slide pays.
LIST_COST = 10**5
# Figures may shrink below MIN_TEXT_PX, to the floor, to stay with the text that explains them (Figure.floor_scale).
SHRINK_COST = 200  # per percent they shrink
NEAR_EMPTY = 170  # a page whose content (heading aside) is shorter than this is a leftover
NEAR_EMPTY_COST = 4000
# A page whose estimated content, heading included, ends above TOP_THIRD may end in the slide's top third (240 px):
# the estimates run up to 50 px high.
TOP_THIRD = HEIGHT // 3 + 50
TOP_THIRD_COST = 20000
MAX_WORDS = 150  # about the most words of prose on a slide, as the room reads it (maths and code aside)
WORD_COST = 200  # per word over MAX_WORDS: a few more beat a leftover page
WORDY_COST = 10**6  # a page of several paragraphs with 10% more words than MAX_WORDS: cut it
OVERFULL_COST = 10**7


def _rows(text: str, chars: int) -> int:
    return sum(max(1, math.ceil(len(line) / chars)) for line in text.splitlines()) if text else 0


@dataclass
class Figure:
    """One saved PNG on a slide: its size, the smallest text drawn in it, the scales it may take."""

    output: nbformat.NotebookNode
    width: int
    height: int
    text_px: float  # the smallest text, in the PNG's pixels
    dpi: float = 100.0

    @property
    def max_scale(self) -> float:
        return min(MAX_FIGURE_SCALE, FIGURE_MAX_WIDTH / self.width, TITLE_FIGURE_ROOM / self.height)

    @property
    def min_scale(self) -> float:
        """The scale that makes the smallest text MIN_TEXT_PX, if the slide has room for it."""
        return min(MIN_TEXT_PX / self.text_px, self.max_scale)

    @property
    def floor_scale(self) -> float:
        """The least scale a page may shrink it to: its smallest text FLOOR_TEXT_PX (or its largest scale)."""
        return min(FLOOR_TEXT_PX / self.text_px, self.max_scale)


def _least_shrink(figures: list[Figure]) -> float:
    """How far a page may shrink all its figures alike below ``min_scale``: none of them below its floor."""
    return max((f.floor_scale / f.min_scale for f in figures), default=1.0)


@dataclass
class Piece:
    """One cell of the deck, with what starts it and its estimated height."""

    cell: nbformat.NotebookNode
    kind: str  # "slide" (##), "subslide" (###), "flow", "figure" (a code cell's figures), "notes"
    height: int = 0  # fixed height: for a figure, its code (0 when hidden) and its other outputs
    heading: str = ""  # a slide's or sub-slide's heading, repeated on its continuations
    keep: bool = False  # never the last thing on a page (a paragraph ending with a colon, an exercise's heading)
    soft: bool = False  # a page may start here without "(continued)" (an exercise's heading)
    code_height: int = 0  # a figure's code, 0 when it is left out
    figures: list[Figure] = field(default_factory=list)
    words: int = 0  # the words of its prose (maths, code and outputs aside)
    joined: bool = False  # a list item with more of its list after it: a page breaks here only at LIST_COST

    @property
    def is_prose(self) -> bool:
        return self.kind == "flow" and self.cell.cell_type == "markdown" and not self.soft

    @property
    def is_code(self) -> bool:
        return self.kind == "figure" or (self.kind == "flow" and self.cell.cell_type == "code")


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


def _list_items(block: str) -> list[str]:
    """A Markdown list cut into its items (each still a list of one item, numbered as before)."""
    items: list[list[str]] = []
    for line in block.splitlines():
        if re.match(r"([*-]|\d+\.) ", line) or not items:
            items.append([line])
        else:
            items[-1].append(line)
    return ["\n".join(item) for item in items]


def _details_to_notes(block: str) -> str:
    """A <details><summary>Hint 1: …</summary> … </details> block as plain Markdown for the speaker notes."""
    text = re.sub(r"<summary>(.*?)</summary>", r"**\1**\n\n", block, flags=re.DOTALL)
    text = re.sub(r"</?details>", "", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


# Sentences about a widget's controls (a slider, a choice, "now you drive"): in a deck a control is the figure it drew.
WIDGET_WORDING = (
    r"|\bsliders?\b|\bnow you drive\b|\bpick an? (configuration|token|head|depth|prompt|model|value|pair)\b"
    r"|^(move|drag|pick|choose|set|turn|slide) (the|a|an|its|your)\b|\bframed bar is your choice\b"
    r"|\bthe (figures?|plots?|panels?) (below|above)\b|\bthis notebook does both\b|\bthis notebook's recipe\b"
    r"|\b(the|a) (drop-?down|checkbox|text box|knob)\b|\byour choice\b")
# Sentences that only make sense in the notebook: the cells, the collapsed hints, the student edition.
NOTEBOOK_ONLY = re.compile(
    r"\b(the|this|that|each|every|a new|next|your|its) (solution )?cells?\b|\bcells? (after|below|above|before)\b"
    r"|\bcollapsed\b|\bfolded\b|\bopen (its|the|their) hints?\b|\bhints? one at a time\b|\bstudent edition\b"
    r"|[\"*_']See it[\"*_'] below|\bself-check below\b|\bin a new cell\b|\brun the cell\b"
    # A widget's controls: the deck shows the figure the notebook stored, never the controls.
    + WIDGET_WORDING,
    re.IGNORECASE)
# The heading of a widget's part says "now you drive"; on a slide the part is named by what it shows.
_DRIVE_HEADING = re.compile(r"^(#{1,6} )(?:now you drive\s*[:·—-]\s*(.+)|(.+?)\s*[:·—-]\s*now you drive\s*(.*)|now you drive)$",
                            re.IGNORECASE)
_PROTECT = re.compile(r"`[^`]*`|\$\$.*?\$\$|\$[^$]*\$", re.DOTALL)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*_`$(\"'\0])")  # \0: code or maths, hidden while splitting


def _sentences(text: str) -> list[str]:
    """Split prose into sentences, never inside `code` or $maths$."""
    protected: list[str] = []

    def hide(match: re.Match) -> str:
        protected.append(match[0])
        return f"\0{len(protected) - 1}\0"

    hidden = _PROTECT.sub(hide, text)
    parts = _SENTENCE_END.split(hidden)
    return [re.sub(r"\0(\d+)\0", lambda m: protected[int(m[1])], part) for part in parts]


def for_slides(block: str) -> str:
    """A paragraph as the deck says it: without the sentences that only make sense in the notebook. '' when none
    is left. Headings, lists, tables, maths and HTML are kept as they are."""
    stripped = block.strip()
    drive = _DRIVE_HEADING.match(stripped)
    if drive:  # "### Now you drive: temperature" -> "### Temperature"; "### The schedule: now you drive" -> "### The schedule"
        named = (drive[2] or ": ".join(part for part in (drive[3], drive[4]) if part) or "What the controls change")
        named = re.sub(r"^(pick|choose|move|drag|set|try) ", "", named, flags=re.IGNORECASE)  # "pick a head" -> "a head"
        return drive[1] + named[0].upper() + named[1:]
    if re.match(r"(#|[*-] |\d+\. |\||\$\$|<|```|>)", stripped):
        return block
    text = re.sub(r"\s*\((student edition|computed below|see below|below)\)", "", stripped)
    kept = [s for s in _sentences(text) if not NOTEBOOK_ONLY.search(s)]
    return " ".join(kept).strip()


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


def words(markdown: str) -> int:
    """The words a slide shows of this Markdown: maths, HTML tags, link targets and markup aside."""
    text = re.sub(r"\$\$.*?\$\$|\$[^$]*\$", " ", markdown, flags=re.DOTALL)
    text = re.sub(r"<[^>]+>|\]\([^)]*\)|^#+ .*$", " ", text, flags=re.MULTILINE)
    return sum(1 for word in text.split() if re.search(r"\w", word))


def _visible_length(text: str) -> int:
    """About how many characters ``text`` shows once rendered: no link targets, markup, TeX command names."""
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"\\(text|mathrm|operatorname|mathbf|mathbb)\{([^}]*)\}", r"\2", text)
    text = re.sub(r"\\[a-zA-Z]+", "x", text)
    return len(re.sub(r"[`*_{}^$\\]", "", text))


_MATRIX = re.compile(r"\\begin\{(p|b|v|V)?matrix\}(.*?)\\end\{(p|b|v|V)?matrix\}|\\begin\{cases\}(.*?)\\end\{cases\}",
                     re.DOTALL)


def _maths_height(tex: str) -> float:
    """The rendered height of a display formula: its rows (``\\`` outside matrices), each as tall as its
    tallest part (a fraction, a sum with limits, a matrix of r rows)."""
    matrix_rows = [m.group(0).count("\\\\") + 1 for m in _MATRIX.finditer(tex)]
    outside = _MATRIX.sub("M", tex)
    rows = outside.count("\\\\") + 1
    line = 46.0
    if re.search(r"\\(frac|dfrac|tfrac|sum|prod|int|binom|underbrace|overbrace)", outside):
        line = 72.0
    if re.search(r"\\sqrt\{[^}]*\\(frac|sum)", outside):
        line = 100.0
    if matrix_rows:
        line = max(line, 30.0 * max(matrix_rows) + 12)
    return rows * line + 48


def _markdown_height(block: str, notebook_dir: Path) -> int:
    heading = re.match(r"(#{1,3}) (.*)", block)
    if heading:
        level = len(heading[1])
        lines = max(1, math.ceil(_visible_length(heading[2]) / HEADING_CHARS[level]))
        return HEADING[level] + HEADING_LINE[level] * (lines - 1) + GAP
    if re.match(r"\s*(<img|!\[)", block):
        return _image_height(block, notebook_dir) + GAP
    height, item, maths = 0.0, "", None

    def flush() -> float:
        if not item.strip():
            return 0
        extra = sum(24 * m.group(0).count("\\\\") for m in _MATRIX.finditer(item))  # an inline matrix
        return PROSE[0] * math.ceil(_visible_length(item) / PROSE[1]) + extra

    table = False
    for line in block.splitlines():
        stripped = line.strip()
        if maths is not None:  # inside display maths
            if "$$" in stripped:
                height += _maths_height(maths + stripped.replace("$$", ""))
                maths = None
            else:
                maths += stripped + "\n"
        elif stripped.startswith("$$"):
            height, item = height + flush(), ""
            rest = stripped[2:]
            if "$$" in rest:
                height += _maths_height(rest.replace("$$", ""))
            else:
                maths = rest + "\n"
        elif stripped.startswith("|"):  # a table row (its rule is no row)
            height, item = height + flush(), ""
            if not table:
                height, table = height + 14, True
            height += 0 if set(stripped) <= set("|-: ") else 38
        elif re.match(r"([*-]|\d+\.) ", stripped):  # a list item starts
            height, item = height + flush() + 6, stripped + " " * 6
        else:
            item += " " + stripped
    if maths is not None:
        height += _maths_height(maths)
    return int(height + flush()) + PARAGRAPH


def _markdown_pieces(cell, notebook_dir: Path, title: bool) -> list[Piece]:
    pieces = []
    for block in _blocks(cell.source):
        stripped = block.strip()
        if stripped.startswith("<details"):
            pieces.append(Piece(nbformat.v4.new_markdown_cell(_details_to_notes(block)), "notes"))
            continue
        if not title:
            block = for_slides(block)
            stripped = block.strip()
            if not stripped:
                continue
        new = nbformat.v4.new_markdown_cell(block)
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
            match = re.match(r"\*\*(\d+\.[^*]*)\*\*((?:\s*·\s*[^·.]+?)*)\.\s+", stripped)
            name = f"Exercise {match[1].strip()}{match[2]}" if match else "Exercise"
            start = nbformat.v4.new_markdown_cell(f"### {name}")
            start.metadata["tags"] = ["slides-exercise"]
            pieces.append(Piece(start, "flow", _markdown_height(start.source, notebook_dir), keep=True, soft=True))
            new.source = stripped[match.end():] if match else stripped
            pieces.append(Piece(new, "flow", _markdown_height(new.source, notebook_dir), keep=new.source.endswith(":")))
        elif title and re.match(r"<img|!\[", stripped):
            new.metadata["tags"] = ["slides-aside"]  # floats right of the title and the promise
            pieces.append(Piece(new, "flow", 0))
        elif re.match(r"([*-]|\d+\.) ", stripped) and height > BUDGET // 3 and not title:
            items = _list_items(block)  # a long list: one piece per item, so that it can continue when it must
            for k, item in enumerate(items):
                pieces.append(Piece(nbformat.v4.new_markdown_cell(item), "flow", _markdown_height(item, notebook_dir),
                                    keep=item.rstrip().endswith(":"), joined=k + 1 < len(items)))
        else:
            if re.match(r"\*\*Your turn\*\*", stripped):
                new.metadata["tags"] = ["slides-task"]
                height += TASK_PADDING
            pieces.append(Piece(new, "flow", height, keep=stripped.endswith(":")))
    if title:  # one cell: the diagram first, floating right of the heading and the promise
        asides = [p for p in pieces if p.cell.metadata.get("tags") == ["slides-aside"]]
        rest = [p for p in pieces if p not in asides]
        end = next((i for i, p in enumerate(rest) if i and p.kind != "flow"), len(rest))
        if asides and rest:
            first = rest[0]
            first.cell.source = "\n\n".join([asides[0].cell.source] + [p.cell.source for p in rest[:end]])
            first.cell.metadata["tags"] = ["slides-title"]
            first.height = BUDGET  # the slide is full
            pieces = [first] + rest[end:]
    for piece in pieces:
        if piece.kind == "flow" and not piece.soft:
            piece.words = words(piece.cell.source)
    return pieces


# --- Code ---------------------------------------------------------------------------------------------

def outline(source: str, brief: bool = False) -> str | None:
    """The classes' and functions' signatures and first docstring lines, bodies as ``...``; ``brief``: a class's
    methods as their signatures alone (the outline of a long class within CODE_LINES)."""
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
        if doc and not (brief and depth):
            out.append(f'{indent}"""{doc.strip().splitlines()[0]}"""')
        if isinstance(node, ast.ClassDef):
            for child in node.body:
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        (not child.name.startswith("_") or child.name in {"__init__", "__call__"}):
                    if not brief:
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


def _png(output) -> bytes:
    return base64.b64decode(output["data"]["image/png"])


def _png_info(png: bytes) -> tuple[int, int, float]:
    """Width, height and dots per inch (100 where the PNG does not say) of a PNG."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        dpi = image.info.get("dpi", (100, 100))[0] or 100
        return image.width, image.height, float(dpi)


# The text sizes in a figure, read from the code that drew it: matplotlib's default, or any fontsize it sets,
# following the calls into the notebook's functions and nbtools.plotting's (an `if annotate:` block counts only
# when the call passes annotate=True).
_FONT_KEYWORDS = {"fontsize", "size", "labelsize", "title_fontsize"}


def _plotting_functions() -> dict[str, ast.FunctionDef]:
    tree = ast.parse((Path(__file__).parent / "plotting.py").read_text(encoding="utf-8"))
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def smallest_font_pt(source: str, functions: dict[str, ast.FunctionDef]) -> float:
    """The smallest font size (points) the code of a cell draws text with."""
    tree = web._parse(source)
    sizes = [DEFAULT_FONT_PT]
    if tree is None:
        return DEFAULT_FONT_PT
    everything = {**_plotting_functions(), **functions}
    seen: set[tuple] = set()

    def size_of(node: ast.AST) -> float | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.Constant) and node.value in NAMED_FONT_SIZES:
            return DEFAULT_FONT_PT * NAMED_FONT_SIZES[node.value]
        return None

    def visit(nodes: list[ast.AST], bound: dict[str, object], depth: int) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id in bound:
                visit(node.body if bound[node.test.id] else node.orelse, bound, depth)
                continue
            for child in ast.iter_child_nodes(node):
                visit([child], bound, depth)
            if not isinstance(node, ast.Call):
                continue
            for keyword in node.keywords:
                if keyword.arg in _FONT_KEYWORDS:
                    size = size_of(keyword.value)
                    if size is not None:
                        sizes.append(size)
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            targets = [name] + [a.id for a in node.args if isinstance(a, ast.Name)]
            for target in targets:
                definition = everything.get(target)
                if definition is None or depth >= 4:
                    continue
                arguments = definition.args
                names = [a.arg for a in arguments.args + arguments.kwonlyargs]
                defaults = dict(zip([a.arg for a in arguments.args][::-1], arguments.defaults[::-1]))
                defaults.update({a.arg: d for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None})
                values = {n: (d.value if isinstance(d, ast.Constant) else True) for n, d in defaults.items()}
                values.update({k.arg: (k.value.value if isinstance(k.value, ast.Constant) else True)
                               for k in node.keywords if k.arg in names})
                key = (target, depth, tuple(sorted((k, repr(v)) for k, v in values.items())))
                if key in seen:  # the same helper with the same arguments draws the same text: once is enough
                    continue
                seen.add(key)
                visit(definition.body, values, depth + 1)

    visit(tree.body, {}, 0)
    return min(sizes)


def _cut_text(outputs: list) -> list:
    """Merge the printed output (where it first appears) and keep its first OUTPUT_LINES lines; no stderr."""
    kept, text, at = [], [], None
    for output in outputs:
        if output.output_type == "stream" and output.name == "stdout":
            at = len(kept) if at is None else at
            text.append(output.text)
        elif output.output_type == "stream":
            continue
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


# --- A widget's preset states (interactive_figure(states=...)): fragments over its default figure ---------------

STATE_CAPTION = (25, 9.6)  # (pixels per line, pixels per character): templates/static/slides.css .course-state p
STATE_MIN_WIDTH = 1000  # a layer is at least this wide, so that a narrow figure's sentence wraps as estimated
_STATE_IMAGE = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def _take_states(outputs: list) -> tuple[list[dict], list]:
    """The preset states a widget's cell stored (each its PNG, size and sentence), and the outputs without them."""
    for output in outputs:
        meta = output.get("metadata", {}).get("course", {}).get(interactive.STATES)
        if meta:
            images = _STATE_IMAGE.findall("".join(output["data"]["text/html"]))
            if len(images) != len(meta):
                raise ValueError(f"a widget's preset states: {len(meta)} sentences but {len(images)} images")
            states = []
            for image, state in zip(images, meta):
                width, height, _ = _png_info(base64.b64decode(image))
                states.append({"png": image, "width": width, "height": height, "sentence": state["sentence"]})
            return states, [o for o in outputs if o is not output]
    return [], outputs


def _states_caption_height(states: list[dict], width: float) -> int:
    """The room the states' sentences take below a figure ``width`` pixels wide on the slide: the longest one."""
    chars = max(width, STATE_MIN_WIDTH) / STATE_CAPTION[1]
    lines = max((math.ceil(len(s["sentence"]) / chars) for s in states), default=0)
    return int(STATE_CAPTION[0] * lines) + 8 if states else 0


def _shown_width(figure: Figure) -> float:
    """About how wide a figure is on its slide (its text at MIN_TEXT_PX, clear of the controls)."""
    return min(figure.width * figure.min_scale, CLEAR_WIDTH)


def _stack_states(output, figure: Figure) -> None:
    """Give a widget's default figure, sized for its page, reveal.js's stack (``metadata.course.stack``, which the
    deck's template shows in the figure's place): the default, then each preset state over it, one fragment each,
    with its sentence below. Each layer is as large as the largest image, on white, so that it covers the one
    before."""
    states = output.metadata["course"].pop(interactive.STATES)
    size = output.metadata["image/png"]
    scale = size["width"] / figure.width
    box_w, box_h = max(size["width"], STATE_MIN_WIDTH), size["height"]
    caption_h = _states_caption_height(states, box_w)
    default_w, default_h, _ = _png_info(_png(output))
    alt = output.metadata["course"].get("alt", "Figure")
    text_px = output.metadata["course"].get("text_px")
    data = f' data-text-px="{text_px}"' if text_px else ""

    def layer(png: str, width: int, height: int, text: str, alt: str, extra: str = "") -> str:
        return (f'<div class="course-state{extra}" style="width:{box_w}px;height:{box_h + caption_h}px">'
                f'<img src="data:image/png;base64,{png}" alt="{html.escape(alt)}" width="{round(width * scale)}" '
                f'height="{round(height * scale)}"{data}><p>{html.escape(text) or "&nbsp;"}</p></div>')

    layers = [layer(output.data["image/png"], default_w, default_h, "", alt)]
    layers += [layer(s["png"], s["width"], s["height"], s["sentence"], s["sentence"], " fragment") for s in states]
    # The output stays a PNG (the figure, for everything that counts figures); the deck's template shows the stack.
    output.metadata["course"]["stack"] = f'<div class="r-stack course-states">{"".join(layers)}</div>'


def _outputs_height(outputs: list) -> int:
    """The height of the outputs that are not PNG figures."""
    height = 0.0
    for output in outputs:
        data = output.get("data", {})
        if output.output_type == "stream":
            height += OUTPUT[0] * _rows(output.text, OUTPUT[1]) + 12
        elif "image/png" in data:
            continue
        elif _is_figure(output):
            height += 400
        elif "text/html" in data:
            rows = "".join(data["text/html"]).count("<tr")
            height += 34 * rows + 12 if rows else NOTE_HEIGHT
        else:
            height += OUTPUT[0] * _rows("".join(data.get("text/plain", "")), OUTPUT[1]) + 12
    return int(height)


def _code_height(source: str) -> int:
    return int(CODE[0] * _rows(source, CODE[1])) + CODE_PADDING + GAP


def _code_cell(source: str, outputs: list, hide_source: bool = False):
    cell = nbformat.v4.new_code_cell(source, outputs=outputs)
    if hide_source or not source.strip():
        cell.metadata["transient"] = {"remove_source": True}
    return cell


def _solution_notes(source: str, label: str = "Solution") -> Piece:
    code = web.without_markers(source).replace("#| export\n", "", 1)
    return Piece(nbformat.v4.new_markdown_cell(f"**{label}**\n\n```python\n{code}\n```"), "notes")


def _is_check(source: str) -> bool:
    """A learner check: imports from the checks and calls them, nothing else drawn."""
    return "transformer_from_scratch.checks" in source and re.search(r"\bcheck_\w+\(", source) is not None


def _is_magic_only(source: str) -> bool:
    lines = [line for line in source.splitlines() if line.strip() and not line.strip().startswith("#")]
    return bool(lines) and all(line.lstrip().startswith(("%", "!")) for line in lines)


def _code_pieces(cell, section: str, functions: dict, solutions: bool, previous: Piece | None) -> list[Piece]:
    source = cell.source.strip()
    if section == web.EXERCISES:
        return [_solution_notes(source)] if solutions and web.has_solution(source) else []
    if "export_notebook(" in source:
        return []
    if source.startswith("#| export"):
        shape = outline(source)
        if shape and len(shape.splitlines()) > CODE_LINES:
            shape = outline(source, brief=True)
        notes = [_solution_notes(source, "The class, in full")] if solutions else []
        return ([Piece(_code_cell(shape, []), "flow", _code_height(shape))] if shape else []) + notes
    notes = [_solution_notes(source)] if solutions and web.has_solution(source) else []
    shown = web.stubbed(source)
    outputs = _cut_text(copy.deepcopy(cell.get("outputs", [])))
    if not outputs and _is_magic_only(source):
        return []
    # A pitfall's code stages the mistake; the slide shows what it does (its output), the prose names the mistake.
    short = len(shown.splitlines()) <= CODE_LINES and not _is_check(source) and section != PITFALLS
    if not short and not _is_check(source) and section != PITFALLS and (outputs or shown.strip()):
        # Longer code is the notebook's to read: the slide shows what it printed or drew, the notes hold the code.
        notes = [Piece(nbformat.v4.new_markdown_cell(
            f"**The code behind this result** ({len(shown.splitlines())} lines, in the notebook)\n\n"
            f"```python\n{shown}\n```"), "notes")] + notes
    pngs = [o for o in outputs if "image/png" in o.get("data", {})]
    if pngs:
        font = smallest_font_pt(source, functions)
        states, outputs = _take_states(outputs)
        figures = []
        for output in pngs:
            width, height, dpi = _png_info(_png(output))
            if states and output is pngs[-1]:  # the widget's default figure: its preset states go on top of it
                output.setdefault("metadata", {}).setdefault("course", {})[interactive.STATES] = states
                width, height = max(width, *(s["width"] for s in states)), max(height, *(s["height"] for s in states))
            figures.append(Figure(output, width, height, font * dpi / 72, dpi))
        code = _code_height(shown) if short else 0
        others = [o for o in outputs if o not in pngs]
        suptitles, _ = web.figure_titles(source, functions)
        title = suptitles[0] if len(suptitles) == 1 and "…" not in suptitles[0] and not states else None
        if states:
            # The controls' note goes to the speaker notes: the slide's room is the figure's and its sentences'.
            widget_notes = [o for o in outputs if "course-widget-note" in "".join(o.get("data", {}).get("text/html", ""))]
            outputs = [o for o in outputs if o not in widget_notes]
            controls = " ".join(_plain(html.unescape("".join(o.data["text/html"]))) for o in widget_notes)
            steps = "\n".join(f"{n}. {s['sentence']}" for n, s in enumerate(states, 1))
            notes = [Piece(nbformat.v4.new_markdown_cell(
                f"**Step through the figure** (one key press each, after the default):\n\n{steps}\n\n{controls}"),
                "notes")] + notes
            others = [o for o in others if o not in widget_notes]
        return _figure_pieces(_code_cell(shown, outputs, hide_source=not short), figures, code,
                              _outputs_height(others) + _states_caption_height(states, _shown_width(figures[-1])),
                              title) + notes
    out_height = _outputs_height(outputs)
    if short and outputs and _code_height(shown) + out_height > SWAP_ABOVE:
        # Tall: the code, then its output below it or, where the page is short of room, in its place.
        return [Piece(_code_cell(shown, outputs), "figure", out_height, code_height=_code_height(shown))] + notes
    if short:
        return [Piece(_code_cell(shown, outputs), "flow", _code_height(shown) + out_height)] + notes
    if outputs:
        return [Piece(_code_cell(shown, outputs, hide_source=True), "flow", out_height + GAP)] + notes
    announced = previous is not None and previous.is_prose and previous.cell.source.rstrip().endswith(":")
    shape = outline(shown) if announced else None
    return ([Piece(_code_cell(shape, []), "flow", _code_height(shape))] if shape else []) + notes


# --- Figures for the room -----------------------------------------------------------------------------

def _ink(png: bytes):
    """A boolean array, True where the PNG has ink (not white, not transparent)."""
    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        rgba = np.asarray(image.convert("RGBA"), dtype=np.int16)
    return (rgba[..., 3] > 16) & (rgba[..., :3].min(axis=2) < 245)


def _runs(mask) -> list[tuple[int, int]]:
    """[start, end) of each run of True."""
    runs, start = [], None
    for i, value in enumerate(list(mask) + [False]):
        if value and start is None:
            start = i
        elif not value and start is not None:
            runs.append((start, i))
            start = None
    return runs


def panels(png: bytes) -> tuple[tuple[int, int] | None, list[tuple[int, int]], tuple[int, int]]:
    """Where a figure's panels are: (its title band's rows or None, each panel's columns, the panels' rows).

    Each run of ink at least MIN_PANEL_WIDTH wide (below the title) is a panel's axes; the narrower runs between
    two of them (tick labels, a colorbar, a rotated axis label) part at the widest gap.
    """
    ink = _ink(png)
    height, width = ink.shape
    bands = _runs(ink.any(axis=1))
    title = None
    top = bands[0][0] if bands else 0
    if len(bands) > 1 and bands[0][1] - bands[0][0] < 0.15 * height:
        title = bands[0]
        top = bands[1][0]
    bottom = bands[-1][1] if bands else height
    runs = _runs(ink[top:bottom].any(axis=0))
    anchors = [i for i, (a, b) in enumerate(runs) if b - a >= MIN_PANEL_WIDTH]  # the axes
    if len(anchors) < 2:
        return title, [(runs[0][0], runs[-1][1])] if runs else [(0, width)], (top, bottom)
    # Between two axes, the panels part at the widest gap (a colorbar's label and the next panel's axis label
    # sit closer to their own axes than to each other).
    cuts = []
    for left, right in zip(anchors, anchors[1:]):
        gaps = [(runs[k + 1][0] - runs[k][1], k) for k in range(left, right)]
        cuts.append(max(gaps)[1])
    columns = []
    start_run = 0
    for cut in cuts:
        columns.append((runs[start_run][0], runs[cut][1]))
        start_run = cut + 1
    columns.append((runs[start_run][0], runs[-1][1]))
    return title, columns, (top, bottom)


def _crop(png: bytes, box: tuple[int, int, int, int], pad: int = 4) -> bytes:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        left, top, right, bottom = box
        box = (max(0, left - pad), max(0, top - pad), min(image.width, right + pad), min(image.height, bottom + pad))
        part = image.crop(box)
        buffer = io.BytesIO()
        part.save(buffer, format="PNG", dpi=image.info.get("dpi", (100, 100)))
        return buffer.getvalue()


def _image_output(png: bytes, original) -> nbformat.NotebookNode:
    output = nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(png).decode(),
                                                          "text/plain": "<Figure>"})
    output.metadata = copy.deepcopy(original.get("metadata", {}))
    output.metadata.pop("image/png", None)
    return output


def _rows_of_panels(figure: Figure, caption: bool = False) -> list[list[Figure]] | None:
    """The figure cut into rows of its panels, as many in a row as fit at about the scale its text needs; None
    when it has one panel or reads well enough whole."""
    if interactive.STATES in figure.output.get("metadata", {}).get("course", {}):
        return None  # a widget's default figure with its preset states over it stays whole
    needed = MIN_TEXT_PX / figure.text_px
    floor = FLOOR_TEXT_PX / figure.text_px
    whole = min(needed, FIGURE_MAX_WIDTH / figure.width, TITLE_FIGURE_ROOM / figure.height)
    if whole * figure.text_px >= FLOOR_TEXT_PX:  # whole, it reads: cut into rows only below the floor
        return None
    png = _png(figure.output)
    title, columns, (top, bottom) = panels(png)
    if len(columns) < 2:
        return None
    title_height = title[1] - title[0] + 8 if title else 0
    for per_row in range(len(columns) - 1, 0, -1):
        rows = math.ceil(len(columns) / per_row)
        per_row = math.ceil(len(columns) / rows)  # even rows: 4 panels as 2 + 2, not 3 + 1
        groups = [columns[i:i + per_row] for i in range(0, len(columns), per_row)]
        widest = max(group[-1][1] - group[0][0] for group in groups)
        scale = min(needed, FIGURE_MAX_WIDTH / widest, TITLE_FIGURE_ROOM / (bottom - top + title_height))
        if scale >= floor or per_row == 1:
            break
    result = []
    for n, group in enumerate(groups):
        parts = []
        if n == 0 and title is not None and not caption:  # the title as an image, when no caption replaces it
            strip = _crop(png, (0, title[0], figure.width, title[1]))
            w, h, _ = _png_info(strip)
            # The title band is text of its own (matplotlib's suptitle is 12 pt): it may shrink to fit the width.
            parts.append(Figure(_image_output(strip, figure.output), w, h, figure.text_px * 1.2, figure.dpi))
        cut = _crop(png, (group[0][0], top, group[-1][1], bottom))
        w, h, _ = _png_info(cut)
        parts.append(Figure(_image_output(cut, figure.output), w, h, figure.text_px, figure.dpi))
        result.append(parts)
    return result


def _figure_pieces(cell, figures: list[Figure], code_height: int, others_height: int,
                   title: str | None = None) -> list[Piece]:
    """A code cell with figures as one piece, or, when a figure has to be cut into rows of panels, one piece per
    row (the code, when shown, and the other outputs go with the first and the last). A figure cut into rows
    loses its title band when its ``title`` is known: the title becomes a caption above the rows, as text that
    wraps (a title as wide as four panels would be tiny as an image)."""
    split = [(figure, _rows_of_panels(figure, caption=title is not None)) for figure in figures]
    if not any(rows for _, rows in split):
        return [Piece(cell, "figure", others_height, figures=figures, code_height=code_height)]
    pieces: list[Piece] = []
    if title is not None:
        caption = nbformat.v4.new_markdown_cell(f'<p class="course-figure-title">{html.escape(title)}</p>')
        lines = math.ceil(len(title) / CAPTION[1])
        pieces.append(Piece(caption, "flow", int(CAPTION[0] * lines) + GAP, keep=True))
    outputs = list(cell.outputs)
    current: list = []  # outputs of the piece being built
    current_figures: list[Figure] = []

    def flush(first: bool) -> None:
        nonlocal current, current_figures
        if not current:
            return
        piece_cell = _code_cell(cell.source if first else "", current,
                                hide_source=first and cell.metadata.get("transient", {}).get("remove_source", False))
        if not first:
            piece_cell.metadata["transient"] = {"remove_source": True}
        fixed = _outputs_height([o for o in current if "image/png" not in o.get("data", {})])
        pieces.append(Piece(piece_cell, "figure", fixed, figures=current_figures,
                            code_height=code_height if first else 0))
        current, current_figures = [], []

    rows_for = {id(figure.output): rows for figure, rows in split}
    for output in outputs:
        rows = rows_for.get(id(output))
        figure = next((f for f, _ in split if f.output is output), None)
        if figure is None:
            current.append(output)
        elif rows is None:
            current.append(output)
            current_figures.append(figure)
        else:
            for row in rows:
                current += [part.output for part in row]
                current_figures += row
                flush(not pieces)
    flush(not pieces)
    return pieces


# --- Pages --------------------------------------------------------------------------------------------

def _continued(heading: str) -> Piece:
    heading = re.sub(r"\s*\(continued\)$", "", heading)
    cell = nbformat.v4.new_markdown_cell(f"### {heading} (continued)" if heading else "")
    cell.metadata["tags"] = ["slides-continued"]
    return Piece(cell, "subslide", HEADING[3] + GAP, heading)


def _fit(items: list[Piece], room: float) -> tuple[float, float, float]:
    """How a page's items fit in ``room``: (height used, room left, shrink). Each figure takes the largest scale
    that fits, never less than its text needs (``Figure.min_scale``) unless the page cannot hold it: then
    ``shrink`` < 1 is the factor all its figures are shrunk by below that, and the room left is negative."""
    fixed = sum(p.height for p in items)
    figures = [f for p in items for f in p.figures]
    codes = sum(p.code_height for p in items if p.kind == "figure")
    minimum = sum(f.height * f.min_scale for f in figures)
    margins = IMAGE_MARGIN * len(figures)
    left = room - fixed - minimum - margins - codes  # each figure's code above it
    if left < 0:  # the code shows first, then the figure takes its place: only what exceeds the figure counts
        left = room - fixed - minimum - margins - _swap_extra(items)
    if left < 0:
        return room - left, left, max(0.0, (minimum + left) / minimum) if minimum else 0.0
    growth = sum(f.height * (f.max_scale - f.min_scale) for f in figures)
    grow = min(left, growth)
    return room - left + grow, left - grow, 1.0


def _room(items: list[Piece], heading_height: int) -> tuple[float, bool]:
    """The height a page's items may fill below its heading, and whether it ends on a figure that may go lower."""
    shown = [p for p in items if p.kind != "notes"]
    last = shown[-1] if shown else None
    ends_on_figure = (last is not None and last.kind == "figure" and bool(last.figures)
                      and "image/png" in last.cell.outputs[-1].get("data", {}))
    clear = ends_on_figure and all(f.width * f.min_scale <= CLEAR_WIDTH for f in last.figures)
    bonus = FIGURE_BOTTOM if clear else WIDE_BOTTOM if ends_on_figure else 0
    return BUDGET - heading_height + bonus, clear


def _swap_extra(items: list[Piece]) -> float:
    """How much taller the figures' code is than the figures (at their text's size) it is swapped with."""
    return sum(max(0.0, p.code_height - sum(f.height * f.min_scale for f in p.figures) - p.height)
               for p in items if p.kind == "figure")


def _page_cost(items: list[Piece], heading_height: int, end_break: Piece | None, first_page: bool,
               free_merge: bool) -> float:
    room, _ = _room(items, heading_height)
    used, left, shrink = _fit(items, room)
    used = min(used, room) + heading_height
    cost = PAGE_COST + (CONTINUED_COST if heading_height else 0)
    if left < -2:
        if shrink < _least_shrink([f for p in items for f in p.figures]) - 1e-9 and len(items) > 1:
            cost += OVERFULL_COST
        else:
            cost += SHRINK_COST * (1 - shrink) * 100
        left = 0
    cost += SLACK_COST * (max(0.0, left) / 100) ** 2
    content = used - heading_height - sum(p.height for p in items if p.kind in ("slide", "subslide"))
    if content < NEAR_EMPTY and not any(p.kind == "figure" for p in items):
        cost += NEAR_EMPTY_COST * (2.5 if content <= 0 else 1)  # a title alone is the worst
    if used < TOP_THIRD:
        cost += TOP_THIRD_COST
    prose = [p for p in items if p.words]
    total = sum(p.words for p in prose)
    if total > MAX_WORDS and len(prose) > 1:
        cost += WORDY_COST if total > 1.1 * MAX_WORDS else WORD_COST * (total - MAX_WORDS)
    last = items[-1] if items else None
    at_boundary = end_break is None or end_break.kind in ("slide", "subslide")
    if last is not None and end_break is not None and not (at_boundary or end_break.soft):
        if last.keep and last.is_prose and _starts_list(end_break):
            cost += LIST_COST  # "… and two are new:" on one slide, its list on the next
        elif last.keep:
            cost += COLON_COST if last.is_prose else KEEP_COST
        elif last.joined and _starts_list(end_break):
            cost += LIST_COST  # a list cut in two
        elif last.is_prose and end_break.is_code:
            cost += SPLIT_PROSE_COST
    elif last is not None and last.keep and end_break is None:
        cost += KEEP_COST / 10  # the section ends on a colon: rewritten, but better not
    merged = [p for k, p in enumerate(items) if k and p.kind == "subslide"]
    if first_page and merged:  # the section's first part may start on the section's page, and continue after it
        cost += 0 if free_merge else MERGE_COST / 3
        merged = merged[1:]
    cost += MERGE_COST * len(merged)
    if merged and not at_boundary:  # a later part that shares a page is on it in full
        cost += KEEP_COST
    return cost


def _starts_list(piece: Piece) -> bool:
    """Whether a piece of prose is a list (or its next item)."""
    return piece.is_prose and re.match(r"\s*([*-]|\d+\.) ", piece.cell.source) is not None


def paginate(pieces: list[Piece]) -> list[list[Piece]]:
    """Cut one ## section into pages (sub-slides) at the cheapest breaks (``_page_cost``), by dynamic programming.

    ``pieces[0]`` is the section's heading; notes stay with the piece before them. A page starts at a ### heading,
    at an exercise's heading or anywhere else as a "(continued)" page; the ## heading may share its page with the
    ### right after it.
    """
    # Notes travel with the piece before them.
    units: list[list[Piece]] = []
    for piece in pieces:
        if piece.kind == "notes" and units:
            units[-1].append(piece)
        else:
            units.append([piece])
    n = len(units)
    best = [math.inf] * (n + 1)
    choice = [0] * (n + 1)
    best[0] = 0.0
    heading = [""] * n
    current = ""
    for i, unit in enumerate(units):
        if unit[0].kind in ("slide", "subslide"):
            current = unit[0].heading
        heading[i] = current
    for i in range(n):
        if best[i] == math.inf:
            continue
        starts = units[i][0].kind in ("slide", "subslide")
        head = 0 if starts else _continued(heading[i]).height
        for j in range(i + 1, n + 1):
            items = [p for unit in units[i:j] for p in unit if p.kind != "notes"]
            # The "## X" heading right before "### Y" shares its page for free.
            free = i == 0 and len(items) > 1 and items[1].kind == "subslide" and items[0].kind == "slide"
            cost = _page_cost(items, head, units[j][0] if j < n else None, i == 0, free)
            if best[i] + cost < best[j]:
                best[j] = best[i] + cost
                choice[j] = i
            if cost >= OVERFULL_COST:
                break
    pages = []
    j = n
    while j > 0:
        i = choice[j]
        pages.append([p for unit in units[i:j] for p in unit])
        j = i
    return pages[::-1]


def _fragment_cells(page: list[Piece], heading_height: int) -> list[nbformat.NotebookNode]:
    """The cells of one page with their slide types (the first is set by the caller): figures sized as ``_fit``
    says, their code and figure one fragment each, and what follows a figure a fragment too."""
    room, clear = _room(page, heading_height)
    shown = [p for p in page if p.kind != "notes"]
    figures = [f for p in shown for f in p.figures]
    fixed = sum(p.height for p in shown)
    codes = sum(p.code_height for p in shown if p.kind == "figure")
    minimum = sum(f.height * f.min_scale for f in figures)
    margins = IMAGE_MARGIN * len(figures)
    together = room - fixed - minimum - margins - codes >= 0
    if figures:
        left = room - fixed - minimum - margins - (codes if together else _swap_extra(shown))
        growth = sum(f.height * (f.max_scale - f.min_scale) for f in figures)
        if left >= 0:
            t = min(1.0, left / growth) if growth else 0.0
            scales = {id(f): f.min_scale + t * (f.max_scale - f.min_scale) for f in figures}
        else:  # the page cannot hold them at their text's size: shrink them all alike
            shrink = max(0.2, (minimum + left) / minimum)
            scales = {id(f): f.min_scale * shrink for f in figures}
        for f in figures:
            scale = min(scales[id(f)], CLEAR_WIDTH / f.width) if clear else scales[id(f)]
            f.output.setdefault("metadata", {})["image/png"] = {"width": round(f.width * scale),
                                                                "height": round(f.height * scale)}
            f.output.metadata.setdefault("course", {})["text_px"] = round(f.text_px, 2)
            if interactive.STATES in f.output.metadata["course"]:
                _stack_states(f.output, f)
    cells = []
    after_figure = False
    for piece in page:
        cell = piece.cell
        if os.environ.get("COURSE_SLIDES_ESTIMATES") and piece.kind != "notes":
            estimate = piece.height + sum(IMAGE_MARGIN + o.metadata["image/png"]["height"] for o in
                                          (f.output for f in piece.figures))
            if piece.kind == "figure":
                estimate += piece.code_height if together else _swap_extra([piece])
            cell.metadata.setdefault("tags", []).append(f"est-{round(estimate)}-{piece.kind}")
        if piece.kind == "notes":
            cell.metadata["slideshow"] = {"slide_type": "notes"}
        elif piece.kind == "figure":
            mode = "figure" if not piece.code_height else ("together" if together else "swap")
            cell.metadata["slides_figure"] = mode
            cell.metadata["slideshow"] = {"slide_type": "fragment" if after_figure else "-"}
            after_figure = after_figure or mode != "figure"
        else:
            cell.metadata["slideshow"] = {"slide_type": "fragment" if after_figure else "-"}
        cells.append(cell)
    return cells


# --- Speaker notes for the lecturer ---------------------------------------------------------------------

LECTURER = "lecturer"  # a Markdown cell's metadata field: the lecturer's talking points for the slide it opens
NOTE_MINUTES = "course_minutes"  # a notes cell's minutes (the lecturers' page adds them up)
MINUTES_TEXT, MINUTES_FIGURE = 1, 2  # a slide without the lecturer's note: a slide of text, a slide with a figure


def lecturer_note(meta: dict) -> Piece:
    """The speaker note of a cell's ``metadata.lecturer``: ``{"minutes": 3, "say": "the point, as said to the room",
    "ask": "a question for the room", "expect": "the answer to expect"}`` (``ask`` and ``expect`` optional). JupyterLab
    keeps a cell's metadata out of the notebook's view, so the learner never sees it; the deck makes it the note."""
    minutes = meta.get("minutes", MINUTES_TEXT)
    text = f"**Lecturer · {minutes} min.** {meta.get('say', '').strip()}"
    if meta.get("ask"):
        text += f"\n\n**Ask the room:** {meta['ask'].strip()}"
        if meta.get("expect"):
            text += f" *Expect:* {meta['expect'].strip()}"
    cell = nbformat.v4.new_markdown_cell(text)
    cell.metadata[NOTE_MINUTES] = minutes
    cell.metadata["course_lecturer"] = True
    return Piece(cell, "notes")


def _plain(markdown: str) -> str:
    text = re.sub(r"\]\([^)]*\)", "]", markdown)
    text = re.sub(r"<[^>]+>|\*|[\[\]]", "", text)
    return " ".join(text.split())


def _point_note(page: list[Piece], heading: str) -> nbformat.NotebookNode:
    """A slide's note where the notebook gives none: its point (the first sentences it shows, else what it shows)
    and its minutes, so that no lecture slide has an empty note."""
    shown = [p for p in page if p.kind != "notes"]
    heading = re.sub(r"\s*\(continued\)$", "", _plain(heading))
    tags = {tag for p in shown for tag in p.cell.metadata.get("tags", [])}
    prose = next((p for p in shown if p.is_prose and not re.match(r"\s*(\$\$|\||<img|!\[)", p.cell.source)), None)
    figure = any(p.figures for p in shown)
    task = "slides-task" in tags
    if "slides-title" in tags and "slides-part" not in tags:
        prose = None
        point = "Say what this lecture builds, point to it in the diagram, and read out the promise."
    elif "slides-part" in tags:
        prose = None
        point = ("Recap what part 1 built, one line a step; say what part 2 shows." if heading.startswith(PART_ONE_DONE)
                 else "Open the second session: what part 1 built, in a sentence, and what today shows.")
    if prose is not None:
        sentences = _sentences(_plain(re.sub(r"^\s*([*-]|\d+\.)\s+", "", prose.cell.source)))
        said = sentences[0]
        if len(said.split()) <= 4 and len(sentences) > 1:  # a bold lead-in ("Cross-entropy."): with what it says
            said += " " + sentences[1]
        point = said if len(said.split()) <= 45 else " ".join(said.split()[:45]) + " …"
    elif figure:
        point = f"{heading}: let the room read the figure (its title states the finding), then say what it shows."
    elif "slides-title" not in tags and "slides-part" not in tags:
        point = f"{heading}: say what the result on the slide shows, and what it would look like if it were wrong."
    minutes = MINUTES_FIGURE if figure else MINUTES_TEXT
    extra = " The task is done in the workshop: read it out, say how long it takes." if task else ""
    cell = nbformat.v4.new_markdown_cell(f"**The point · {minutes} min.** {point}{extra}")
    cell.metadata[NOTE_MINUTES] = minutes
    cell.metadata["slideshow"] = {"slide_type": "notes"}
    return cell


def _with_note(page: list[Piece], cells: list[nbformat.NotebookNode], heading: str) -> list[nbformat.NotebookNode]:
    """A lecture page's cells with a note that leads its speaker notes: the lecturer's, else the slide's point."""
    if any(p.cell.metadata.get("course_appendix") for p in page):
        return cells
    lecturer = [c for c in cells if c.metadata.get("course_lecturer")]
    first = lecturer[0] if lecturer else _point_note(page, heading)
    rest = [c for c in cells if c is not first]
    return rest[:1] + [first] + rest[1:]


def _unend_colon(page: list[Piece]) -> None:
    """A page that still ends on a colon (what followed is not on the slide) ends on a full stop."""
    shown = [p for p in page if p.kind != "notes"]
    if shown and shown[-1].is_prose and shown[-1].cell.source.rstrip().endswith(":"):
        shown[-1].cell.source = shown[-1].cell.source.rstrip()[:-1] + "."


def layout(pieces: list[Piece]) -> list[nbformat.NotebookNode]:
    """Give each piece its slide type: each ## section paginated (``paginate``), its pages as sub-slides."""
    cells: list[nbformat.NotebookNode] = []
    sections: list[list[Piece]] = []
    for piece in pieces:
        if piece.kind == "slide" or not sections:
            sections.append([])
        sections[-1].append(piece)
    for section in sections:
        for page in paginate(section):
            _unend_colon(page)
            first = page[0]
            if first.kind in ("slide", "subslide"):
                page_cells = _fragment_cells(page, 0)
                page_cells[0].metadata["slideshow"] = {"slide_type": first.kind}
                start_cell, head = page_cells[0], 0
            else:
                start = _continued(_heading_before(section, first))
                if first.cell.metadata.get("course_appendix"):
                    start.cell.metadata["course_appendix"] = True
                cells.append(_set(start, "subslide"))
                page_cells = _fragment_cells(page, start.height)
                start_cell, head = start.cell, start.height
            page_cells = _with_note(page, page_cells, first.heading if first.kind in ("slide", "subslide")
                                    else _heading_before(section, first))
            if os.environ.get("COURSE_SLIDES_ESTIMATES"):  # for calibrating the heights against a browser
                used, _, _ = _fit([p for p in page if p.kind != "notes"], _room(page, head)[0])
                start_cell.metadata["slideshow"]["data"] = {"estimate": str(round(used + head))}
            cells += page_cells
    return cells


def _heading_before(section: list[Piece], piece: Piece) -> str:
    heading = ""
    for p in section:
        if p is piece:
            break
        if p.kind in ("slide", "subslide"):
            heading = p.heading
    return heading


def _set(piece: Piece, slide_type: str) -> nbformat.NotebookNode:
    piece.cell.metadata["slideshow"] = {"slide_type": slide_type}
    return piece.cell


def _join_title(nb) -> None:
    """Make the title slide of every Markdown cell above the first ``##`` (the guided-only note left out): the title
    and its promise, then the diagram and the objectives, which a notebook may keep in a cell of its own so that the
    editions' notes sit above the diagram. The first cell takes their text; the others are left empty, in place, so
    that cell indices stay the notebook's."""
    first = next((i for i, cell in enumerate(nb.cells) if cell.cell_type != "markdown"
                  or re.search(r"^## ", cell.source, re.MULTILINE)), len(nb.cells))
    joined = [cell for cell in nb.cells[1:first] if "guided-only" not in cell.metadata.get("tags", [])]
    if nb.cells and joined:
        nb.cells[0].source = "\n\n".join([nb.cells[0].source.rstrip()] + [cell.source.strip() for cell in joined])
        for cell in joined:
            cell.source = ""


def _unique_ids(cells: list) -> None:
    """A cell cut into several slides is several cells: each copy after the first gets an id of its own (nbformat
    warns at every duplicate, and a page's anchors must not repeat)."""
    seen: set[str] = set()
    for cell in cells:
        base = cell.get("id")
        if base is None:
            continue
        number = 1
        while cell["id"] in seen:
            number += 1
            cell["id"] = f"{base}-{number}"
        seen.add(cell["id"])


class DeriveSlides(Preprocessor):
    """Set every cell's ``slideshow.slide_type`` from the notebook's structure (on a copy of it)."""

    solutions = Bool(False, help="put the solutions' code into the speaker notes (the instructor's decks)").tag(config=True)

    def preprocess(self, nb, resources):
        nb = copy.deepcopy(nb)
        _join_title(nb)
        notebook_dir = Path(resources.get("metadata", {}).get("path") or REPO / "notebooks")
        functions = web.definitions(nb)
        lecture: list[Piece] = []
        appendix: dict[str, list[Piece]] = {}
        section = part = ""
        section_start = 0
        outlined: list[str] = []  # the final class's public names, listed at the top of the appendix
        for index, cell in enumerate(nb.cells):
            if "guided-only" in cell.metadata.get("tags", []):
                continue  # the note on how to start the workshop: for a reader of the guided notebook alone
            if cell.cell_type == "markdown":
                for line in cell.source.splitlines():
                    if line.startswith("## "):
                        section = line.strip() if not line.startswith("## Why") else "## Why"
                        part, section_start = "", index
                    elif line.startswith("### "):
                        part = line.strip()
                if section in SKIPPED_SECTIONS:
                    continue
                following = nb.cells[index + 1] if index + 1 < len(nb.cells) else None
                if following is not None and following.cell_type == "code" and "export_notebook(" in following.source \
                        and not re.search(r"^#", cell.source, re.MULTILINE):
                    continue  # the sentence that introduces the export cell
                source = rewrite_links(cell.source, lambda target: notebook_link(target, ".slides.html"))
                if not self.solutions:  # a published deck: the exercises' answers stay with the instructor's
                    source = web.without_answers(source)
                new = _markdown_pieces(nbformat.v4.new_markdown_cell(source), notebook_dir, title=index == 0)
                if cell.metadata.get(LECTURER) and new:  # on the slide where the cell starts, before the hints
                    at = next((k + 1 for k, p in enumerate(new) if p.kind != "notes"), 0)
                    new.insert(at, lecturer_note(cell.metadata[LECTURER]))
            elif cell.cell_type == "code" and section not in SKIPPED_SECTIONS:
                previous = next((p for p in reversed(lecture) if p.kind != "notes"), None)
                new = _code_pieces(cell, section, functions, self.solutions, previous)
            else:
                continue
            for piece in new:
                if cell.cell_type == "code" and piece.kind != "notes":
                    piece.cell.metadata["course_source"] = index  # which notebook cell it shows (for the tests)
            if section in APPENDIX_SECTIONS:
                appendix.setdefault(section, []).extend(new)
            elif part in APPENDIX_PARTS:
                appendix.setdefault(part, []).extend(new)
            elif section in APPENDIX_AFTER_INTRO and index > section_start:
                appendix.setdefault(section, []).extend(new)
                if cell.cell_type == "code" and cell.source.startswith("#| export"):
                    outlined.extend(_public_names(cell.source))
            elif section in APPENDIX_AFTER_INTRO and index == section_start:
                kept, notes = _final_class_intro(new)  # the task stays; a long list of design notes moves
                lecture.extend(kept)
                if notes:
                    appendix.setdefault(section, []).extend(notes)
            else:
                lecture.extend(new)
        lecture = _pitfalls_in_brief(lecture, appendix)
        pieces = lecture + _appendix(appendix, outlined)
        _orphaned_colons(pieces)
        pieces = _two_parts(pieces, nb.cells[0].source, notebook_dir)
        nb.cells = layout(pieces)
        _unique_ids(nb.cells)
        return nb, resources


FINAL_CLASS_NOTES = "How the final class is written"


def _final_class_intro(pieces: list[Piece]) -> tuple[list[Piece], list[Piece]]:
    """The final class's first cell on the lecture's slide: its heading, its first sentences and the task. Where its
    lists (the notes on how the class is written: the workshop's reference) would take more than one slide or more
    than MAX_WORDS words, they move to the appendix under a heading of their own, with the speaker notes that follow
    them, so that the lecture names the task on one slide and no list is cut in two."""
    shown = [p for p in pieces if p.kind != "notes"]
    listed = [p for p in shown if _starts_list(p)]
    if not listed or (sum(p.words for p in shown) <= MAX_WORDS and sum(p.height for p in shown) <= BUDGET):
        return pieces, []
    kept: list[Piece] = []
    moved: list[Piece] = []
    last_moved = False
    for piece in pieces:
        if piece.kind == "notes":  # a hint stays with what it follows
            (moved if last_moved else kept).append(piece)
        else:
            last_moved = _starts_list(piece)
            (moved if last_moved else kept).append(piece)
    # On the lecture's slide, the list in brief (each item's first sentence, else its first clause), where it fits.
    items = [re.sub(r"^\s*([*-]|\d+\.)\s+", "", p.cell.source) for p in moved if p.kind != "notes"]
    room = MAX_WORDS - sum(p.words for p in kept if p.kind != "notes") - 5
    for shorten in (False, True):
        lines = []
        for item in items:
            first = _sentences(" ".join(item.split()))[0]
            end = _clause_end(first) if shorten else None
            lines.append("* " + (first[:end].rstrip(" ,") + "." if end is not None else first))
        listing = "\n".join(lines)
        if words(listing) <= room:
            brief = Piece(nbformat.v4.new_markdown_cell(listing), "flow", _markdown_height(listing, REPO / "notebooks"))
            brief.words = words(listing)
            at = next((k for k, p in enumerate(kept) if "slides-task" in p.cell.metadata.get("tags", [])), len(kept))
            kept.insert(at, brief)
            break
    heading = nbformat.v4.new_markdown_cell(f"### {FINAL_CLASS_NOTES}")
    return kept, [Piece(heading, "subslide", HEADING[3] + GAP, FINAL_CLASS_NOTES)] + moved


def _pitfalls_in_brief(lecture: list[Piece], appendix: dict[str, list[Piece]]) -> list[Piece]:
    """The lecture with its ## Pitfalls on at most PITFALL_PAGES slides: when they take more, one slide lists them
    (each heading with the first sentences of its first paragraph, a round at a time while they stay within
    MAX_WORDS) and the section, in full, moves to the appendix."""
    start = next((i for i, p in enumerate(lecture) if p.kind == "slide" and p.heading == PITFALLS[3:]), None)
    if start is None:
        return lecture
    end = next((i for i in range(start + 1, len(lecture)) if lecture[i].kind == "slide"), len(lecture))
    section = lecture[start:end]
    if len(paginate(copy.deepcopy(section))) <= PITFALL_PAGES:
        return lecture
    named: list[tuple[str, list[str]]] = []  # each pitfall's heading and the sentences of its prose, in order
    for piece in section:
        if piece.kind == "subslide":
            named.append((piece.heading, []))
        elif named and piece.is_prose and not piece.cell.source.lstrip().startswith(("$$", "|")):
            text = " ".join(piece.cell.source.split())
            named[-1][1].extend(re.sub(r":$", ".", sentence.strip()) for sentence in _sentences(text) if sentence.strip())
    # Every pitfall gets its heading and its first sentence, in full; then the sentence that gives its fix; then more
    # of its first sentences, a round at a time, while the slide stays within MAX_WORDS, so that each gets its share.
    headings = [f"* **{re.sub(r'^[0-9]+[.] ', '', heading)}.**" for heading, _ in named]
    sentences = [told for _, told in named]
    chosen: list[set[int]] = [{0} if told else set() for told in sentences]

    def listing_of(picked: list[set[int]]) -> str:
        return "\n".join(" ".join([h] + [told[i] for i in sorted(p)]) for h, told, p in zip(headings, sentences, picked))

    def add(k: int, i: int) -> bool:
        trial = [set(p) for p in chosen]
        trial[k].add(i)
        if words(listing_of(trial)) <= MAX_WORDS:
            chosen[k].add(i)
            return True
        return False

    # Where the first sentences alone say too much, or leave no room for a fix, the longest ones end at their first
    # colon or semicolon.
    def cut_longest() -> bool:
        longest = sorted(((len(told[0].split()), k) for k, told in enumerate(sentences) if told), reverse=True)
        cut = next(((k, c) for _, k in longest if (c := _clause_end(sentences[k][0])) is not None), None)
        if cut is not None:
            sentences[cut[0]][0] = sentences[cut[0]][0][:cut[1]].rstrip(" ,") + "."
        return cut is not None

    while words(listing_of(chosen)) > MAX_WORDS and cut_longest():
        pass
    for k, told in enumerate(sentences):
        fix = next((i for i, sentence in enumerate(told) if i and PITFALL_FIX.search(sentence)), None)
        while fix is not None and not add(k, fix) and cut_longest():
            pass
    grown = True
    while grown:
        grown = False
        for k, told in enumerate(sentences):
            following = next((i for i in range(len(told)) if i not in chosen[k]), None)
            if following is not None and following < 3 and add(k, following):
                grown = True
    said = [[told[i] for i in sorted(p)] for told, p in zip(sentences, chosen)]
    lines = [" ".join([heading] + told) for heading, told in zip(headings, said)]
    listing = "\n".join(lines)
    cell = nbformat.v4.new_markdown_cell(listing)
    brief = Piece(cell, "flow", _markdown_height(listing, REPO / "notebooks"))
    brief.words = words(listing)
    appendix[PITFALLS] = section
    # The lecturer's note on the section (its first, where several pitfalls have one) stays with the listing.
    said_notes = [p for p in section if p.kind == "notes" and p.cell.metadata.get("course_lecturer")][:1]
    return lecture[:start] + [section[0], brief] + copy.deepcopy(said_notes) + lecture[end:]


def _clause_end(sentence: str) -> int | None:
    """Where a sentence's first clause ends (its first colon or semicolon outside code and maths), if it says enough
    before it (eight words or more); None otherwise."""
    hidden = _PROTECT.sub(lambda m: "x" * len(m[0]), sentence)
    match = re.search(r"[:;] ", hidden)
    return match.start() if match and len(hidden[:match.start()].split()) >= 8 else None


def lecture_slides(cells: list) -> int:
    """The slides (and sub-slides) of a derived deck before its appendix: the lecture's path."""
    count = 0
    for cell in cells:
        kind = cell.metadata.get("slideshow", {}).get("slide_type")
        if kind == "slide" and cell.source.startswith(f"## {APPENDIX_PREFIX}"):
            break
        count += kind in ("slide", "subslide")
    return count


def _two_parts(pieces: list[Piece], title: str, notebook_dir: Path) -> list[Piece]:
    """A lecture of more than LECTURE_MAX slides as two sessions: part 1 ends on a slide that lists what it built, part
    2 opens on a title slide "Part 2 · …" with the notebook's diagram and what it shows. The break goes before a part
    (a ## section or a ### part, not a continued page) of the lecture's build or See it, where the two sessions come
    out most even; on a tie, before "## See it"."""
    trial = copy.deepcopy(pieces)
    for k, piece in enumerate(trial):
        piece.cell.metadata["course_piece"] = k
    before: dict[int, int] = {}  # a piece that opens a page -> the lecture slides before it
    count = 0
    for cell in layout(trial):
        kind = cell.metadata.get("slideshow", {}).get("slide_type")
        if kind == "slide" and cell.source.startswith(f"## {APPENDIX_PREFIX}"):
            break
        if kind in ("slide", "subslide"):
            if "course_piece" in cell.metadata:
                before[cell.metadata["course_piece"]] = count
            count += 1
    if count <= LECTURE_MAX:
        return pieces
    build = next((k for k, p in enumerate(pieces) if p.kind == "slide" and p.heading == PART_TWO_AFTER), None)
    see_it = next((k for k, p in enumerate(pieces) if p.kind == "slide" and p.heading == PART_TWO_BEFORE[3:]), None)
    if build is None or see_it is None:
        return pieces
    end = next((k for k in range(see_it + 1, len(pieces)) if pieces[k].kind == "slide"), len(pieces))
    candidates = [k for k in range(build + 1, end + 1) if k in before and pieces[k].kind in ("slide", "subslide")]
    at = min(candidates, key=lambda k: (abs(before[k] - (count - before[k])), k != see_it))
    return pieces[:at] + [_part_one_done(pieces[:at], pieces[at:])] + [_part_two(title, pieces, at, notebook_dir)] \
        + pieces[at:]


def _parts(pieces: list[Piece], section: str = "") -> list[tuple[str, str]]:
    """The (## section, ### part) headings of these pieces, continued pages and the appendix left out; ``section`` is
    the one the first piece is in."""
    found = []
    for piece in pieces:
        if piece.kind == "slide":
            if piece.heading.startswith(APPENDIX_PREFIX):
                break
            section = piece.heading
        elif piece.kind == "subslide" and not piece.heading.endswith("(continued)"):
            found.append((section, piece.heading))
    return found


def _said(heading: str) -> str:
    """A heading as a phrase inside a sentence: no "Step n · ", no trailing colon, lower case unless it opens on an
    acronym ("GPT-2", "FLOPs") or a name ("Llama's recipe")."""
    phrase = re.sub(r"^Step \d+ · ", "", heading).rstrip(":")
    first = re.match(r"[A-Z][a-z]*\b", phrase)
    keep = first is None or first[0].rstrip("'s") in NAMES
    return phrase if keep else phrase[0].lower() + phrase[1:]


def _part_two_shows(rest: list[Piece]) -> str:
    """What the second session shows: the rest of the build, the See it parts, then the sections after it."""
    first = PART_TWO_AFTER if rest and rest[0].kind == "subslide" else ""  # the break is inside the build or before
    shown = [_said(part) for section, part in _parts(rest, first) if section in (PART_TWO_AFTER, PART_TWO_BEFORE[3:])]
    return "; ".join(shown) + ". Then the final class, its pitfalls and the exercises."


def _slide_piece(source: str, tags: list[str], notebook_dir: Path, height: int | None = None) -> Piece:
    cell = nbformat.v4.new_markdown_cell(source)
    cell.metadata["tags"] = tags
    piece = Piece(cell, "slide", height or _markdown_height(source, notebook_dir), source.splitlines()[0][3:])
    piece.words = words(source)
    return piece


def _part_one_done(done: list[Piece], rest: list[Piece]) -> Piece:
    """The last slide of the first session: each part it built, and what the next session shows."""
    built = [part for section, part in _parts(done) if section == PART_TWO_AFTER]
    source = (f"## {PART_ONE_DONE}\n\nBuilt, one step at a time:\n\n" + "\n".join(f"* {part}" for part in built)
              + f"\n\n**Next session, part 2:** {_part_two_shows(rest)}")
    return _slide_piece(source, ["slides-part"], REPO / "notebooks")


def _part_two(title: str, pieces: list[Piece], at: int, notebook_dir: Path) -> Piece:
    """The title slide of a lecture's second part: the notebook's diagram, what part 1 built and what part 2 shows."""
    name = re.match(r"#\s*\d*\s*·?\s*([^:\n]+)", title)
    built = [_said(part) for section, part in _parts(pieces[:at]) if section == PART_TWO_AFTER
             and part.startswith("Step ")]
    diagram = re.search(r"<img[^>]*>", pieces[0].cell.source) if pieces else None
    source = (f"## {PART_TWO}{name[1].strip() if name else 'the lecture goes on'}\n\n"
              + (f"{diagram[0]}\n\n" if diagram else "")
              + f"**Part 1** built it, one step at a time: {'; '.join(built)}.\n\n"
              + f"**Part 2** shows {_part_two_shows(pieces[at:])}")
    return _slide_piece(source, ["slides-title", "slides-part"] if diagram else ["slides-part"], notebook_dir,
                        BUDGET if diagram else None)


def _orphaned_colons(pieces: list[Piece]) -> None:
    """A paragraph that ends with a colon announces what follows it: code, a figure, a list, a table or maths. When
    what it announced is not on the slides (a definition left out, a cell with no output), it ends on a full stop
    and is free to end a page."""
    shown = [p for p in pieces if p.kind != "notes"]
    for piece, after in zip(shown, shown[1:] + [None]):
        if not (piece.is_prose and piece.keep):
            continue
        source = after.cell.source.lstrip() if after is not None else ""
        announced = after is not None and (after.is_code or (after.is_prose and re.match(r"([*-] |\d+\. |\||\$\$|<img|!\[)", source)))
        if not announced:
            piece.keep = False
            piece.cell.source = piece.cell.source.rstrip()[:-1] + "."


def _public_names(source: str) -> list[str]:
    """The classes and functions a cell defines at its top level, but those whose name starts with an underscore."""
    tree = web._parse(source)
    return [node.name for node in (tree.body if tree else []) if isinstance(node, (ast.ClassDef, ast.FunctionDef))
            and not node.name.startswith("_")]


def _appendix(parts: dict[str, list[Piece]], outlined: tuple[str, ...] | list[str] = ()) -> list[Piece]:
    """One ## slide "Appendix · The final class · Verify" holding the moved parts: the final class's check, its
    outline, then Verify's content. A sentence under the heading names what the appendix holds, so that its first
    page is not a heading alone when the outline needs a page of its own."""
    if not parts:
        return []
    order = ([key for key in parts if key.startswith("### ")] + [key for key in APPENDIX_AFTER_INTRO if key in parts]
             + [key for key in parts if key.startswith("## ") and key not in APPENDIX_AFTER_INTRO])
    names = [re.sub(r"^#+ ", "", key) for key in order if key.startswith("## ")] or ["Checks"]
    heading = nbformat.v4.new_markdown_cell(f"## {APPENDIX_PREFIX}{' · '.join(names)}")
    pieces = [Piece(heading, "slide", HEADING[2] + GAP, heading.source[3:])]
    held = ["the final class's check" for key in order if key in APPENDIX_PARTS][:1]
    if outlined:
        whose = "its" if held else "the final class's"
        listed = ", ".join(f"`{name}`" for name in outlined)
        held.append(f"{whose} outline ({listed}), the signatures and docstrings the learners fill in")
    held += [f"*{name}*" for name in names if name not in ("The final class", "Checks")]
    if held:
        sentence = f"For the workshop: {'; '.join(held[:-1])}{'; and ' if len(held) > 1 else ''}{held[-1]}."
        intro = nbformat.v4.new_markdown_cell(sentence)
        pieces.append(Piece(intro, "flow", _markdown_height(sentence, REPO / "notebooks")))
    for number, key in enumerate(order):
        for piece in parts[key]:
            if piece.kind == "slide":  # the section's own heading: the appendix has one; a later section its sub-slide
                if number and key.startswith("## "):
                    name = key[3:]
                    pieces.append(Piece(nbformat.v4.new_markdown_cell(f"### {name}"), "subslide", HEADING[3] + GAP, name))
                continue
            pieces.append(piece)
    for piece in pieces:
        piece.cell.metadata["course_appendix"] = True
    return pieces


class AppendixData(Preprocessor):
    """Mark the appendix's slides uncounted (reveal.js leaves them out of the slide numbers and the progress bar)."""

    def preprocess_cell(self, cell, resources, index):
        if cell.metadata.pop("course_appendix", False):
            slideshow = cell.metadata.setdefault("slideshow", {})
            if slideshow.get("slide_type") in ("slide", "subslide"):
                slideshow.setdefault("data", {}).update({"visibility": "uncounted", "appendix": "true"})
        return cell, resources


# --- Code that wraps keeps its indentation ------------------------------------------------------------

_TAG = re.compile(r"(<[^>]+>)")


def hanging_lines(highlighted: str) -> str:
    """Each line of a highlighted code block as a block of its own whose wrapped part stays indented: the line's
    leading spaces become a left padding (CSS ``--indent``), and a continuation is indented 4 more."""
    match = re.search(r"(<pre[^>]*>)(.*?)(</pre>)", highlighted, re.DOTALL)
    if not match:
        return highlighted
    body = match[2]
    lines: list[str] = []
    current = ""
    open_tags: list[str] = []
    for token in _TAG.split(body):
        if not token:
            continue
        if token.startswith("<"):
            if token.startswith("</"):
                if open_tags:
                    open_tags.pop()
            elif not token.endswith("/>"):
                open_tags.append(token)
            current += token
            continue
        parts = token.split("\n")
        for k, part in enumerate(parts):
            if k:
                current += "</span>" * len(open_tags)
                lines.append(current)
                current = "".join(open_tags)
            current += part
    lines.append(current)
    if lines and not re.sub(r"<[^>]+>", "", lines[-1]).strip():
        lines.pop()
    out = []
    for line in lines:
        text = html.unescape(re.sub(r"<[^>]+>", "", line))
        indent = len(text) - len(text.lstrip(" "))
        stripped = re.sub(r"^((?:<[^>]+>)*) {%d}" % indent, r"\1", line) if indent else line
        if indent and stripped == line:  # the spaces are split by tags: leave the line as it is
            indent = 0
        out.append(f'<span class="course-line" style="--indent:{indent}ch">{stripped or " "}</span>')
    return highlighted[:match.start(2)] + "".join(out) + highlighted[match.end(2):]


# --- The session plan (the lecturers' page) ------------------------------------------------------------------

_TASK_MINUTES = re.compile(r"\*\*Your turn\*\*[^\n]*?(?:about\s+)?(\d+)\s*min")


@dataclass
class Session:
    """One lecture of a deck: its slides, the minutes its notes add up to, its "Your turn" tasks and their minutes."""

    slides: int
    minutes: int
    tasks: int
    task_minutes: int


def derived_cells(path: Path) -> list[nbformat.NotebookNode]:
    """The deck's cells, as ``make slides`` derives them (without the solutions)."""
    nb = nbformat.read(path, as_version=4)
    nb, _ = WidgetNote().preprocess(nb, {})
    derived, _ = DeriveSlides().preprocess(nb, {"metadata": {"path": str(path.parent)}})
    return derived.cells


def sessions(path: Path) -> list[Session]:
    """The lecture sessions of a notebook's deck (two where it has a "Part 2" slide), measured on the deck: its
    slides before the appendix, each slide's minutes from its speaker note (the lecturer's, else the builder's
    estimate), and the tasks ("Your turn") it shows with the minutes the notebook gives them."""
    found: list[Session] = [Session(0, 0, 0, 0)]
    for cell in derived_cells(path):
        kind = cell.metadata.get("slideshow", {}).get("slide_type")
        if kind == "slide" and cell.source.startswith(f"## {APPENDIX_PREFIX}"):
            break
        if kind in ("slide", "subslide"):
            if kind == "slide" and cell.source.startswith(f"## {PART_TWO}"):
                found.append(Session(0, 0, 0, 0))
            found[-1].slides += 1
        if kind == "notes" and NOTE_MINUTES in cell.metadata:  # the lecturer's notes on the slide, else its point's
            found[-1].minutes += cell.metadata[NOTE_MINUTES]
        if kind != "notes" and cell.cell_type == "markdown":
            for match in _TASK_MINUTES.finditer(cell.source):
                found[-1].tasks += 1
                found[-1].task_minutes += int(match[1])
    return found


def exporter(solutions: bool = False) -> SlidesExporter:
    slides = SlidesExporter(
        template_name="course_slides",
        extra_template_basedirs=[str(TEMPLATES)],
        extra_template_paths=[str(TEMPLATES)],
        preprocessors=[WidgetNote(), FigureAlt(), DeriveSlides(solutions=solutions), AppendixData()],
        exclude_input_prompt=True,
        exclude_output_prompt=True,
        reveal_url_prefix="assets/reveal.js",
        reveal_theme="white",
        reveal_width=str(WIDTH),
        reveal_height=str(HEIGHT),
    )
    slides.register_filter("hanging_lines", hanging_lines)
    return slides


def deck(path: Path, slides: SlidesExporter | None = None, solutions: bool = False) -> str:
    """The HTML of the deck for the notebook at ``path`` (it expects assets/ and images/ beside it)."""
    page = Page.of(path)
    nb = nbformat.read(path, as_version=4)
    resources = {"metadata": {"name": path.stem, "path": str(path.parent)},
                 "course": {"title": page.short, "page": f"{path.stem}.html"}}
    body, _ = (slides or exporter(solutions)).from_notebook_node(nb, resources=resources)
    return body


def build(paths: list[Path], out: Path = DEFAULT_OUT, solutions: bool = False) -> list[Path]:
    """Write one deck per notebook into ``out`` (and the assets beside them); return the decks' paths."""
    out.mkdir(parents=True, exist_ok=True)
    copy_assets(out, reveal=True, css="slides.css")
    slides = exporter(solutions)
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
    parser.add_argument("--out", type=Path, default=None,
                        help="where the decks go (default: build/slides, or build/slides-instructor with --solutions)")
    parser.add_argument("--solutions", action="store_true",
                        help="the instructor's decks: the solutions' code in the speaker notes")
    args = parser.parse_args(argv)
    out = (args.out or (INSTRUCTOR_OUT if args.solutions else DEFAULT_OUT)).resolve()
    paths = [p.resolve() for p in args.notebooks] or notebooks()
    for written in build(paths, out, args.solutions):
        print(f"wrote {written}")
    print(f"Open a deck in a browser (offline is fine): {out / (paths[0].stem + '.slides.html')}; "
          "press ? for the keys, S for the speaker notes." +
          (" The speaker notes hold the solutions: do not publish these decks." if args.solutions else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
