"""What the course's slides (``nbtools.slides``) and website (``nbtools.site``) share.

* The offline assets. Both outputs work without a network: reveal.js and MathJax 3 come from npm
  (``package.json`` pins them, ``package-lock.json`` locks them; ``npm ci`` installs them into
  ``node_modules/``, and ``make slides`` / ``make site`` run it). ``copy_assets`` puts what the pages use,
  our CSS and the course's diagrams beside the generated pages, which refer to nothing but relative paths.
* The notebooks' titles (``Page``), from each notebook's ``# NN · Name: promise`` heading.
* ``rewrite_links``: a notebook's ``../images/…`` and ``NN_x.ipynb`` links, pointed at the generated pages.
* ``WidgetNote``: a saved widget view (the controls of ``interactive_figure``) means nothing without a
  kernel; it becomes a one-line note naming the controls, above the default figure that follows it.
* ``FigureAlt``: each stored figure's alt text is its title, read from the code that drew it
  (``suptitle``, ``set_title``, a helper's ``title=``, through the notebook's own functions).
* ``notebook_css``: JupyterLab's notebook CSS and the code colours, which nbconvert would copy into every page,
  written once as ``assets/notebook.css``.
* The solutions: ``SOLUTION_BEGIN`` / ``SOLUTION_END`` (nbgrader's markers), ``without_markers`` and
  ``solution_regions`` for the decks and the site, which by default show none of what a learner writes.
"""

from __future__ import annotations

import ast
import html
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbconvert.preprocessors import Preprocessor

from .._project import repo_root
from .interactive import STATES

REPO = repo_root()
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


def _lab_static(name: str) -> str:
    """A CSS file of nbconvert's ``lab`` template (what it would inline into every page)."""
    from jupyter_core.paths import jupyter_path

    for base in jupyter_path("nbconvert", "templates"):
        path = Path(base) / "lab" / "static" / name
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise SystemExit(f"nbconvert's lab template is not installed (no lab/static/{name}): reinstall nbconvert")


# What nbconvert's lab template adds after its CSS files (a <style> block in every page).
_LAB_EXTRA_CSS = """
a.anchor-link { display: none; }
.jp-InputArea { overflow: hidden; }
.jp-InputArea-editor { overflow: hidden; }
.cm-editor.cm-s-jupyter .highlight pre {
  padding: var(--jp-code-padding) 4px; margin: 0;
  font-family: inherit; font-size: inherit; line-height: inherit; color: inherit;
}
.jp-OutputArea-output pre { line-height: inherit; font-family: inherit; }
.jp-RenderedText pre { color: var(--jp-content-font-color1); font-size: var(--jp-code-font-size); }
.jp-Collapser { display: none; }
"""


def notebook_css() -> str:
    """JupyterLab's notebook look (nbconvert's lab CSS, light theme) and the code colours (Pygments), as one file."""
    from pygments.formatters import HtmlFormatter

    return "\n".join([
        "/* JupyterLab's notebook CSS as nbconvert's lab template ships it (BSD-3-Clause, Project Jupyter), the light",
        "   theme, and Pygments' default colours: shared by every page and deck, written by nbtools/web.py. */",
        _lab_static("index.css"), _lab_static("theme-light.css"), _LAB_EXTRA_CSS,
        HtmlFormatter(style="default").get_style_defs(".highlight"), ""])


def _write_if_changed(path: Path, text: str) -> None:
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def copy_assets(out: Path, *, reveal: bool, css: str | list[str]) -> None:
    """Put beside the pages in ``out``: MathJax (and with ``reveal``, reveal.js) under ``assets/``, the notebook CSS
    as ``assets/notebook.css``, ``css`` (files in ``templates/static/``) as ``assets/<css>``, and the course's
    diagrams under ``images/``."""
    assets = out / "assets"
    _write_if_changed(assets / "notebook.css", notebook_css())
    source = mathjax_source()
    for name in MATHJAX_FILES:
        _copy(source / name, assets / "mathjax" / name)
    if reveal:
        source = reveal_source()
        for name in REVEAL_FILES:
            _copy(source / name, assets / "reveal.js" / name)
    for name in [css] if isinstance(css, str) else css:
        _copy(TEMPLATES / "static" / name, assets / name)
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
    """Replace each saved widget view by a note that names its controls; the default figure stays, and so do the
    preset states the cell stored (``interactive_figure(states=...)``), which the note counts."""

    def preprocess_cell(self, cell, resources, index):
        states = next((len(o.metadata["course"][STATES]) for o in cell.get("outputs", [])
                       if o.get("metadata", {}).get("course", {}).get(STATES)), 0)
        others = f", then for {states} other settings" if states else ""
        for i, output in enumerate(cell.get("outputs", [])):
            if WIDGET_VIEW in output.get("data", {}):
                controls = widget_controls(output)
                named = f": <b>{html.escape(controls)}</b>" if controls else ""
                note = (f'<p class="course-widget-note">Interactive in the notebook{named}. '
                        f"Here, the figure for their default values{others}.</p>")
                cell.outputs[i] = nbformat.v4.new_output("display_data", data={"text/html": note})
        return cell, resources


# --- Figures' alt text --------------------------------------------------------------------------------------

def _parse(source: str) -> ast.Module | None:
    """A code cell's source as Python (IPython's %magics and !commands blanked), or None."""
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def definitions(nb) -> dict[str, ast.FunctionDef]:
    """The functions the notebook's code cells define (a later definition wins), by name."""
    found: dict[str, ast.FunctionDef] = {}
    for cell in nb.cells:
        tree = _parse(cell.source) if cell.cell_type == "code" else None
        for node in (tree.body if tree else []):
            if isinstance(node, ast.FunctionDef):
                found[node.name] = node
    return found


def _constants(tree: ast.AST) -> dict[str, object]:
    """Names the code assigns a constant to (``d = 64``, ``a, b = 1024, 512``), for titles written as f-strings."""
    values: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            pairs = [(target, value)]
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
                pairs = list(zip(target.elts, value.elts))
            for name, constant in pairs:
                if isinstance(name, ast.Name) and isinstance(constant, ast.Constant):
                    values[name.id] = constant.value
    return values


def _text(node: ast.AST, values: dict[str, object]) -> str | None:
    """A title argument as text: a string, or an f-string whose unknown parts become "…"."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                parts.append(str(part.value))
            elif isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name) \
                    and part.value.id in values and part.format_spec is None and part.conversion == -1:
                parts.append(str(values[part.value.id]))
            else:
                parts.append("…")
        return "".join(parts)
    return None


def figure_titles(source: str, functions: dict[str, ast.FunctionDef]) -> tuple[list[str], list[str]]:
    """The titles a code cell gives its figures, as (``suptitle``s, every ``set_title`` / ``title`` / ``title=``),
    following the calls into the notebook's own functions."""
    tree = _parse(source)
    if tree is None:
        return [], []
    values = _constants(tree)
    main: list[str] = []
    other: list[str] = []
    seen: set[str] = set()

    def follow(name: str, depth: int) -> None:
        if name in functions and name not in seen and depth < 4:
            seen.add(name)
            visit(functions[name], depth + 1)

    def visit(node: ast.AST, depth: int) -> None:
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
            if name in ("suptitle", "set_title", "title") and call.args:
                text = _text(call.args[0], values)
                if text:
                    (main if name == "suptitle" else other).append(text)
            for keyword in call.keywords if name != "legend" else ():
                if keyword.arg == "title":
                    text = _text(keyword.value, values)
                    if text:
                        other.append(text)
            follow(name, depth)
            for argument in call.args:  # interactive_figure(draw, ...): the drawing function is an argument
                if isinstance(argument, ast.Name):
                    follow(argument.id, depth)

    visit(tree, 0)
    return main, other


def _informative(title: str) -> bool:
    """False for a title that is mostly the parts only known when it runs ("head …: …")."""
    known = re.sub(r"…|[^\w]", "", title)
    return len(known) >= 12 or (len(known) >= 4 and "…" not in title)


def figure_alt(source: str, functions: dict[str, ast.FunctionDef], fallback: str) -> str:
    """The alt text of a cell's figures: its suptitle, else its panels' titles; ``fallback`` when it has none."""
    main, other = figure_titles(source, functions)
    titles = [t for t in dict.fromkeys(main or other) if _informative(t)]
    text = "; ".join(titles[:6]) or fallback
    return re.sub(r"\$([^$]*)\$", r"\1", text).strip()  # matplotlib's TeX: $\sigma$ reads as \sigma


class FigureAlt(Preprocessor):
    """Give every stored figure its title as alt text (``output.metadata.course.alt``, which the templates write)."""

    def preprocess(self, nb, resources):
        functions = definitions(nb)
        heading = ""
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                found = re.findall(r"^#{1,3} (.+)$", cell.source, re.MULTILINE)
                heading = found[-1].strip() if found else heading
                continue
            if cell.cell_type != "code":
                continue
            images = [o for o in cell.get("outputs", []) if any(k.startswith("image/") for k in o.get("data", {}))]
            if images:
                alt = figure_alt(cell.source, functions, f"Figure: {heading}" if heading else "Figure")
                for output in images:
                    output.setdefault("metadata", {}).setdefault("course", {})["alt"] = alt
        return nb, resources


# --- Solutions ----------------------------------------------------------------------------------------------

EXERCISES = "## Exercises"  # its code is the learners' (decks leave it out) and its outputs their answers (pages do)

SOLUTION_BEGIN = "### BEGIN SOLUTION"
SOLUTION_END = "### END SOLUTION"
_REGION = re.compile(rf"^([ \t]*){re.escape(SOLUTION_BEGIN)}[ \t]*\n(.*?)^[ \t]*{re.escape(SOLUTION_END)}[ \t]*(?:\n|$)",
                     re.MULTILINE | re.DOTALL)


def has_solution(source: str) -> bool:
    return SOLUTION_BEGIN in source


# An exercise's answer: a collapsed block whose summary begins with "Answer". The guided notebook and the instructor's
# editions keep it; what is published (the default site's pages, its student notebooks and every deck without
# --solutions, notes included) leaves it out.
_ANSWER = re.compile(r"[ \t]*<details>\s*<summary>\s*Answer\b.*?</details>[ \t]*\n?", re.DOTALL)


def without_answers(markdown: str) -> str:
    """The Markdown without its exercises' answers (blank lines left by one closed up)."""
    text = _ANSWER.sub("", markdown)
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n") if text != markdown else markdown


def without_markers(source: str) -> str:
    """The code with its solutions and without the marker lines (the instructor's view)."""
    return "\n".join(line for line in source.split("\n")
                     if line.strip() not in (SOLUTION_BEGIN, SOLUTION_END)).rstrip()


def stubbed(source: str, stub: str = "...") -> str:
    """The code with each solution region replaced by ``stub`` at the region's indentation (the learner's view)."""
    return _REGION.sub(lambda m: f"{m[1]}{stub}\n", source).rstrip()


def solution_lines(source: str) -> list[str]:
    """The lines inside the solution regions of ``source``, stripped, blank ones left out."""
    return [line.strip() for match in _REGION.finditer(source) for line in match[2].splitlines() if line.strip()]


# --- The repository's README --------------------------------------------------------------------------------

README = REPO / "README.md"
# A notebook names a README section in prose: "README's *Chat with it*", "(README, *Speed*)".
README_MENTION = re.compile(r"README(?:'s|,)\s+((?:\*[^*\n]+\*(?:,\s*|\s+and\s+|\s+or\s+)?)+)")


def readme_sections(readme: Path = README) -> list[str]:
    """The README's ## and ### headings, as written."""
    return [m[1].strip() for m in re.finditer(r"^#{2,3} (.+)$", readme.read_text(encoding="utf-8"), re.MULTILINE)]


def readme_section(name: str, sections: list[str]) -> str | None:
    """The README heading a mention names: the heading itself, or the one it starts ("Speed" for "Speed, and the
    run-time checks"); None when there is none."""
    return next((s for s in sections if s == name or re.match(re.escape(name) + r"\b", s)), None)


def readme_mentions(markdown: str) -> list[str]:
    """The README sections a Markdown text names (``README's *Chat with it* and *Speed*``)."""
    return [name for match in README_MENTION.finditer(markdown) for name in re.findall(r"\*([^*\n]+)\*", match[1])]


def web_address(repository: str) -> str | None:
    """The repository's web page (where its README shows) for an http(s) clone address; None for another."""
    if not re.match(r"https?://", repository):
        return None
    return re.sub(r"\.git$", "", repository.rstrip("/"))


def heading_anchor(heading: str) -> str:
    """The anchor GitHub and GitLab give a Markdown heading."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def link_readme(markdown: str, repository: str | None, sections: list[str] | None = None) -> str:
    """The README's mentions as links to the repository's README (``<web address>#readme``, a section at its
    heading's anchor) when the repository has a web address; the text as it is otherwise, or for a section the
    README does not have."""
    base = web_address(repository) if repository else None
    if base is None:
        return markdown
    sections = readme_sections() if sections is None else sections

    def section(match: re.Match) -> str:
        found = readme_section(match[1], sections)
        return f"[*{match[1]}*]({base}#{heading_anchor(found)})" if found else match[0]

    def mention(match: re.Match) -> str:
        named = re.sub(r"\*([^*\n]+)\*", section, match[1])
        return match[0].replace("README", f"[README]({base}#readme)", 1).replace(match[1], named, 1)

    return README_MENTION.sub(mention, markdown)
