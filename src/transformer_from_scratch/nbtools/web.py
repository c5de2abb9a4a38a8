"""What the course's slides (``nbtools.slides``) and website (``nbtools.site``) share.

* The offline assets. Both outputs work without a network: reveal.js and MathJax 3 come from npm
  (``package.json`` pins them, ``package-lock.json`` locks them; ``npm ci`` installs them into
  ``node_modules/``, and ``make slides`` / ``make site`` run it). ``copy_assets`` puts what the pages use,
  our CSS and the course's diagrams beside the generated pages, which refer to nothing but relative paths.
* The notebooks' titles (``Page``), from each notebook's ``# NN · Name: promise`` heading.
* ``rewrite_links``: a notebook's ``../images/…`` and ``NN_x.ipynb`` links, pointed at the generated pages.
* ``WidgetNote``: a saved widget view (the controls of ``interactive_figure``) means nothing without a
  kernel; it becomes a one-line note naming the controls, above the default figure that follows it.
"""

from __future__ import annotations

import html
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbconvert.preprocessors import Preprocessor

REPO = Path(__file__).resolve().parents[3]
TEMPLATES = Path(__file__).resolve().parent / "templates"
NODE_MODULES = REPO / "node_modules"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# MathJax 3's combined TeX-to-SVG component (every TeX extension in one file; SVG needs no web fonts), and
# what it may load later: the menu, the accessibility tools and their speech engine, TeX extensions.
MATHJAX_FILES = ["LICENSE", "es5/tex-svg-full.js", "es5/ui", "es5/a11y", "es5/sre", "es5/input/tex/extensions"]
# What the decks need from reveal.js: the script, its CSS, the white theme (its fonts are local, unlike
# some other themes' Google Fonts) and the speaker-notes plugin.
REVEAL_FILES = ["LICENSE", "dist/reveal.js", "dist/reveal.css", "dist/theme/white.css",
                "dist/theme/fonts/source-sans-pro", "plugin/notes/notes.js"]
NPM_HINT = "run `npm ci` in the repository (`make slides` and `make site` do; it needs Node.js and npm)"


def notebooks() -> list[Path]:
    """The guided notebooks, in order."""
    return sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@dataclass(frozen=True)
class Page:
    """A notebook as the site and the decks name it."""

    notebook: Path
    number: str  # "05"
    name: str  # "Attention"
    promise: str  # "which tokens to look at, and how much" ('' when the title has no colon)

    @property
    def stem(self) -> str:
        return self.notebook.stem  # "05_attention"

    @property
    def short(self) -> str:
        return f"{self.number} · {self.name}"

    @classmethod
    def of(cls, notebook: Path) -> "Page":
        nb = nbformat.read(notebook, as_version=4)
        first = nb.cells[0].source.splitlines()[0] if nb.cells and nb.cells[0].source else ""
        match = re.match(r"#\s+(\d\d)\s*·\s*([^:]+?)\s*(?::\s*(.*))?$", first)
        if not match:
            return cls(notebook, notebook.name[:2], notebook.stem[3:].replace("_", " ").capitalize(), "")
        return cls(notebook, match[1], match[2], match[3] or "")


def _npm_package(name: str, probe: str) -> Path:
    path = NODE_MODULES / name
    if not (path / probe).is_file():
        raise SystemExit(f"{name} is not installed in node_modules/: {NPM_HINT}")
    return path


def mathjax_source() -> Path:
    """MathJax's package, as ``npm ci`` installs it from package-lock.json."""
    return _npm_package("mathjax", "es5/tex-svg-full.js")


def reveal_source() -> Path:
    """reveal.js's package, as ``npm ci`` installs it from package-lock.json."""
    return _npm_package("reveal.js", "dist/reveal.js")


def _copy_file(source: Path, target: Path) -> None:
    """Copy unless ``target`` already has the same size and modification time (a re-run copies nothing)."""
    if target.is_file():
        a, b = source.stat(), target.stat()
        if a.st_size == b.st_size and int(a.st_mtime) == int(b.st_mtime):
            return
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)


def _copy(source: Path, target: Path) -> None:
    if source.is_dir():
        for path in sorted(source.rglob("*")):
            if path.is_file():
                _copy_file(path, target / path.relative_to(source))
    else:
        _copy_file(source, target)


def copy_assets(out: Path, *, reveal: bool, css: str) -> None:
    """Put beside the pages in ``out``: MathJax (and with ``reveal``, reveal.js) under ``assets/``, ``css``
    (a file in ``templates/static/``) as ``assets/<css>``, and the course's diagrams under ``images/``."""
    assets = out / "assets"
    source = mathjax_source()
    for name in MATHJAX_FILES:
        _copy(source / name, assets / "mathjax" / name)
    if reveal:
        source = reveal_source()
        for name in REVEAL_FILES:
            _copy(source / name, assets / "reveal.js" / name)
    _copy(TEMPLATES / "static" / css, assets / css)
    for image in sorted((REPO / "images").glob("*")):
        if image.suffix in {".svg", ".png"}:
            _copy(image, out / "images" / image.name)


_LINK = re.compile(r"""(\]\(|(?:src|href)=")([^)"\s]+)""")


def rewrite_links(text: str, rewrite) -> str:
    """Apply ``rewrite(target) -> new target or None`` to every Markdown link and ``src``/``href``."""
    def replace(match: re.Match) -> str:
        target = match[2]
        if re.match(r"[a-z][a-z0-9+.-]*:|#", target):  # http:, mailto:, data:, an anchor on the page
            return match[0]
        return match[1] + (rewrite(target) or target)
    return _LINK.sub(replace, text)


def notebook_link(target: str, suffix: str) -> str | None:
    """``02_embedding.ipynb#x`` -> ``02_embedding<suffix>#x``; ``../images/a.svg`` -> ``images/a.svg``."""
    path, _, anchor = target.partition("#")
    if path.startswith("../images/"):
        return target[3:]
    match = re.fullmatch(r"(?:\.\./notebooks/|notebooks/)?(\d\d_[a-z0-9_]+)\.ipynb", path)
    if match:
        return match[1] + suffix + (f"#{anchor}" if anchor else "")
    return None


def widget_controls(output: dict) -> str:
    """The controls' labels from interactive_figure's text fallback, e.g. ``init scale, d_in, d_out``."""
    text = "".join(output.get("data", {}).get("text/plain", ""))
    match = re.search(r"\[controls: (.*?); run the notebook", text)
    return match[1] if match else ""


class WidgetNote(Preprocessor):
    """Replace each saved widget view by a note that names its controls; the default figure stays."""

    def preprocess_cell(self, cell, resources, index):
        for i, output in enumerate(cell.get("outputs", [])):
            if WIDGET_VIEW in output.get("data", {}):
                controls = widget_controls(output)
                named = f": <b>{html.escape(controls)}</b>" if controls else ""
                note = (f'<p class="course-widget-note">Interactive in the notebook{named}. '
                        "Here, the figure for their default values.</p>")
                cell.outputs[i] = nbformat.v4.new_output("display_data", data={"text/html": note})
        return cell, resources
