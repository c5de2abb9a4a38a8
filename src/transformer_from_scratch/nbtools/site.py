"""``make site``: the course as a static website that can be published, from the notebooks' stored outputs.

    python -m transformer_from_scratch.nbtools.site [--out build/site] [--solutions] [--repository URL]

What it writes into ``--out`` (default ``build/site/``; ``build/site-instructor/`` with ``--solutions``), every link
relative, nothing fetched from elsewhere when it is built or read (open ``index.html`` from disk, or serve the
folder with any static server):

* ``index.html``: the landing page for learners (``templates/site/index.md``): what the course builds, the ten
  notebooks with one line each (their titles' promises), how to start, and one line linking the lecturers' page.
* ``lecturers.html``: the lecturers' page (``templates/site/lecturers.md``): the decks, their keys and speaker notes,
  a session plan measured on the decks (``session_plan``: slides, the notes' minutes, the *Your turn* tasks and their
  minutes, per deck and per part), what to do at each *Your turn*, what to prepare, the instructor's build
  (``SOLUTIONS=1``).
* ``NN_x.html``: each notebook's page. By default it is the **student edition**, what ``make student`` gives the
  learner: every solution region is the stub the learner fills in (``# YOUR CODE HERE``), no solution code and no
  solution marker anywhere, and no answer to an exercise: the outputs of the cells that held a solution and of
  every cell of ``## Exercises`` (a self-check prints what the answer gives) are left out, and so are the exercises'
  collapsed answers, and an exercise's self-check that compares with the answer in view (``states_an_answer``: the
  page says it runs in the notebook); every other output (figures, printed results, the widgets' default figures) is the guided
  notebook's, so the page still shows what the finished code does. With ``--solutions`` (``make site SOLUTIONS=1``)
  it is the instructor's edition: the guided notebook with its solutions, the marker lines removed, and a banner on
  every page saying so.
  Each page says how to run the notebook (clone, ``make workshop``), links its deck, its student notebook for
  download, and previous · index · next.
* ``NN_x.slides.html``: each notebook's deck (``nbtools/slides.py``), with the solutions and the exercises' answers
  in the speaker notes only in the instructor's edition.
* ``student/NN_x.ipynb``: each notebook's student edition (what ``make student`` writes to ``notebooks/student/``),
  without the exercises' collapsed answers except in the instructor's edition.
* ``images/`` (the diagrams) and ``assets/`` (MathJax, reveal.js, ``notebook.css``, the site's and the decks' CSS).

The repository's address on the pages comes from one setting: ``--repository`` (``make site REPOSITORY=…``), else
the ``COURSE_REPOSITORY`` environment variable, else git's ``origin``. An ``origin`` that is a local path (a clone of
a clone, not an http(s), ssh or git address) is never published. Without an address the public site is refused
(exit status 2), since its pages would say ``git clone <repository-address>``, unless it is built for this machine
only: ``--local`` (``make site LOCAL=1``, as CI does), where the pages say to ask for the address. The instructor's
edition (``--solutions``) is never published and needs none. With an http(s) address, the README sections a notebook
names (``README's *Speed*``) link to the repository's README, and the landing page links it.

The pages are nbconvert's HTMLExporter with the ``course_site`` template (``templates/course_site/``): the
JupyterLab look, minus what would load from a CDN (require.js, the widget manager, mermaid), plus the
navigation.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
from nbconvert.exporters import HTMLExporter
from nbconvert.preprocessors import Preprocessor

from . import slides, web
from .web import REPO, TEMPLATES, FigureAlt, Page, WidgetNote, copy_assets, notebook_link, notebooks, rewrite_links

DEFAULT_OUT = REPO / "build" / "site"
INSTRUCTOR_OUT = REPO / "build" / "site-instructor"
COURSE = "Transformer LM from scratch"
STUDENT_DIR = "student"
LANDING = TEMPLATES / "site" / "index.md"
LECTURERS = TEMPLATES / "site" / "lecturers.md"
REPOSITORY_VARIABLE = "COURSE_REPOSITORY"
# A site built for this machine only (make site LOCAL=1: make passes a command line's variables to the build's
# environment): without it, a site with no repository address to publish is refused.
LOCAL_VARIABLE = "LOCAL"


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() not in ("", "0", "no", "false")
STUDENT_NOTE_ID = "student-edition-note"  # the note nbtools/student.py puts under the title


def is_remote(url: str) -> bool:
    """True for an address others can clone: http(s)://, ssh://, git://, or scp-like ``user@host:path``."""
    return bool(re.match(r"(https?|ssh|git)://", url) or re.fullmatch(r"[\w.-]+@[\w.-]+:.+", url))


def repository_url(setting: str | None = None, repo: Path = REPO) -> str | None:
    """The repository's address for ``git clone``: ``setting``, else $COURSE_REPOSITORY, else git's ``origin``
    in ``repo`` (``git@host:owner/name.git`` as ``https://host/owner/name.git``); None when there is none, or when
    the origin is a local path, which must not be published (a warning on stderr says so)."""
    url = setting or os.environ.get(REPOSITORY_VARIABLE)
    if not url:
        try:
            url = subprocess.run(["git", "-C", str(repo), "remote", "get-url", "origin"], capture_output=True,
                                 text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            url = ""
        if url and not is_remote(url):
            print(f"WARNING: git's origin is a local path ({url}), not published: the pages ask learners for the "
                  f"address; set it with make site REPOSITORY=https://…", file=sys.stderr)
            return None
    if not url:
        return None
    ssh = re.fullmatch(r"[\w.-]+@([\w.-]+):(.+)", url)
    return f"https://{ssh[1]}/{ssh[2]}" if ssh else url


def _clone_folder(url: str | None) -> str:
    if not url:
        return "<folder>"
    name = re.sub(r"\.git$", "", url.rstrip("/").rsplit("/", 1)[-1])
    return name or "<folder>"


class SiteLinks(Preprocessor):
    """Point a notebook's links at the site: other notebooks' pages, images/; and the README it names (``README's
    *Speed*``) at the repository's README, where the repository has a web address."""

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "markdown":
            cell.source = rewrite_links(cell.source, lambda target: notebook_link(target, ".html"))
            cell.source = web.link_readme(cell.source, resources.get("course", {}).get("repository"))
        return cell, resources


def exporter() -> HTMLExporter:
    return HTMLExporter(
        template_name="course_site",
        extra_template_basedirs=[str(TEMPLATES)],
        extra_template_paths=[str(TEMPLATES)],
        preprocessors=[WidgetNote(), FigureAlt(), SiteLinks()],
        exclude_input_prompt=True,
        exclude_output_prompt=True,
    )


# --- The editions -------------------------------------------------------------------------------------------

def student_page_notebook(path: Path) -> nbformat.NotebookNode:
    """The notebook a default page shows: the guided notebook's Markdown and outputs with the student edition's
    code (``nbtools.student``), without what would give an answer away: the output of a cell that held a solution,
    every output of ``## Exercises`` (a self-check prints what the learner's answer gives) and the exercises'
    collapsed answers."""
    from .student import GUIDED_ONLY, student_notebook  # nbgrader is slow to import; only the site needs it here

    guided = nbformat.read(path, as_version=4)
    guided.cells = [cell for cell in guided.cells if GUIDED_ONLY not in cell.metadata.get("tags", [])]
    student = nbformat.reads(student_notebook(path), as_version=4)
    by_id = {cell.get("id"): cell for cell in student.cells if cell.get("id") != STUDENT_NOTE_ID}
    same_ids = all(cell.get("id") in by_id for cell in guided.cells)
    fallback = [cell for cell in student.cells if cell.get("id") != STUDENT_NOTE_ID]
    section = ""
    for index, cell in enumerate(guided.cells):
        if cell.cell_type == "markdown":
            cell.source = web.without_answers(cell.source)
            section = next((line.strip() for line in reversed(cell.source.splitlines()) if line.startswith("## ")),
                           section)
            continue
        if cell.cell_type != "code":
            continue
        twin = by_id[cell.get("id")] if same_ids else (fallback[index] if index < len(fallback) else None)
        if twin is None or twin.cell_type != "code":
            raise ValueError(f"{path.name}: the student edition's cells do not match the guided notebook's")
        if web.has_solution(cell.source) or section == web.EXERCISES:
            cell.outputs = []
            cell.execution_count = None
        cell.source = twin.source
        if section == web.EXERCISES and states_an_answer(cell.source):
            cell.source = SELF_CHECK_HIDDEN
    return guided


# An exercise's self-check that computes in view what it compares with (an assert with the expected value, a loop that
# builds the answer) gives the answer away on a public page; one that calls a check from
# transformer_from_scratch.checks (computed out of view, as 12 to 14 do) does not. The page shows this line instead:
# the learner runs the check in the notebook.
SELF_CHECK_HIDDEN = ("# Self-check: it runs in your notebook (make workshop). Its code compares your answer with the\n"
                     "# right one in view, so this public page leaves it out.")
_IN_VIEW = re.compile(r"^\s*assert\b|\bassert_close\(|\bmath\.isclose\(|\btorch\.(allclose|equal)\(", re.MULTILINE)


def states_an_answer(source: str) -> bool:
    """Whether an exercise's code cell (outside its solution) checks the answer in view: it asserts, and not only
    through a check imported from the course's package."""
    return not web.has_solution(source) and "# YOUR CODE HERE" not in source and _IN_VIEW.search(source) is not None


def instructor_page_notebook(path: Path) -> nbformat.NotebookNode:
    """The guided notebook with its solutions, the marker lines left out."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = web.without_markers(cell.source)
    return nb


# --- The pieces of a page -----------------------------------------------------------------------------------

DISK_TIP = "Opened from disk, the browser shows the notebook instead of saving it: right-click, Save link as…"


def _link(href: str, text: str, rel: str = "", css: str = "", download: bool = False, title: str = "") -> str:
    attributes = f' rel="{rel}"' if rel else ""
    attributes += f' title="{html.escape(title)}"' if title else ""
    attributes += f' class="{css}"' if css else ""
    attributes += " download" if download else ""
    return f'<a href="{html.escape(href)}"{attributes}>{html.escape(text)}</a>'


def navigation(page: Page | None, all_pages: list[Page], where: str, solutions: bool = False) -> str:
    """The bar on top (``where="top"``) and at the bottom of a page: previous · index · next, the deck and the
    student notebook; on the landing page (``page`` None), the way to the first notebook."""
    home = COURSE + (" · instructor's edition" if solutions else "")
    parts = [f'<nav class="course-nav course-nav-{where}" aria-label="Course navigation">',
             _link("index.html", home, css="course-home")]
    if page is None:
        first = all_pages[0]
        start = _link(f"{first.stem}.html", f"Start: {first.short} →", "next")
        parts.append(f'<span class="course-next">{start}</span>')
    else:
        at = [p.stem for p in all_pages].index(page.stem)
        before = all_pages[at - 1] if at > 0 else None
        after = all_pages[at + 1] if at + 1 < len(all_pages) else None
        previous = _link(f"{before.stem}.html", f"← {before.short}", "prev") if before else \
            '<span class="course-none">← (first notebook)</span>'
        following = _link(f"{after.stem}.html", f"{after.short} →", "next") if after else \
            '<span class="course-none">(last notebook) →</span>'
        student_link = _link(f"{STUDENT_DIR}/{page.notebook.name}", "Student notebook (.ipynb)", download=True,
                             title=DISK_TIP)
        parts += [f'<span class="course-prev">{previous}</span>',
                  f'<span class="course-index">{_link("index.html", "Index", "index")}</span>',
                  f'<span class="course-next">{following}</span>',
                  f'<span class="course-deck">{_link(f"{page.stem}.slides.html", "Slides")}</span>',
                  f'<span class="course-student">{student_link}</span>']
    parts.append("</nav>")
    return "\n".join(parts)


def solutions_banner() -> str:
    return ('<aside class="course-solutions-banner" role="note"><b>Instructor\'s edition.</b> This page shows the '
            'reference solutions. Do not publish it: the site for learners is <code>make site</code>, without '
            '<code>SOLUTIONS=1</code>.</aside>')


def run_box(page: Page, repository: str | None, solutions: bool) -> str:
    """How to run this notebook: clone, set up, open the workshop; the repository's address from one setting."""
    name = html.escape(page.notebook.name)
    if repository:
        clone = f"git clone {html.escape(repository)}\ncd {html.escape(_clone_folder(repository))}"
        where = f'the course\'s repository, <a href="{html.escape(repository)}">{html.escape(repository)}</a>'
    else:
        clone = "git clone &lt;repository-address&gt;\ncd &lt;repository-folder&gt;"
        where = "the course's repository (ask your lecturer for its address)"
    edition = ("This page is the <b>instructor's edition</b>: the guided notebook with every solution."
               if solutions else
               "This page is the <b>student edition</b>: the code you write is left blank "
               "(<code># YOUR CODE HERE</code>), and the figures and results are those of the finished notebook.")
    return (
        f'<aside class="course-run-box"><p>{edition} <b>To run it yourself</b>, work in {where}; you need Python 3.10 or '
        f'newer and <code>make</code>:</p>\n<pre><code>{clone}\n'
        f'make workshop   # first run: installs everything into .venv (about 2 minutes)</code></pre>\n'
        f'<p><code>make workshop</code> writes the student edition to <code>notebooks/student/</code> (never over your '
        f'edits) and opens JupyterLab; this notebook is <code>notebooks/student/{name}</code>. The '
        f'<a href="{STUDENT_DIR}/{name}" download>downloaded {name}</a> is the same file (<span '
        f'class="course-from-disk">site opened from disk? the browser shows the file instead of saving it: '
        f'right-click the link and choose <i>Save link as…</i>, or take <code>{STUDENT_DIR}/{name}</code> from the '
        f'site\'s folder</span>): it runs only there, inside '
        f'the repository, because it imports your own package and the course\'s checks. The notebook\'s slides: '
        f'<a href="{html.escape(page.stem)}.slides.html">{html.escape(page.short)}, the deck</a>.</p></aside>')


def _render(html_exporter: HTMLExporter, nb, title: str, name: str, path: Path, top: str, bottom: str,
            intro: str = "", outro: str = "", solutions: bool = False, repository: str | None = None) -> str:
    nb.metadata["title"] = title
    resources = {"metadata": {"name": name, "path": str(path)},
                 "course": {"nav_top": top, "intro": intro, "outro": outro, "nav_bottom": bottom,
                            "solutions": solutions, "repository": repository}}
    body, _ = html_exporter.from_notebook_node(nb, resources=resources)
    return body


def notebook_page(page: Page, all_pages: list[Page], html_exporter: HTMLExporter | None = None,
                  solutions: bool = False, repository: str | None = None) -> str:
    """The HTML of ``page``'s notebook: the student edition (or with ``solutions``, the instructor's), its stored
    outputs, navigation, and how to run it."""
    nb = instructor_page_notebook(page.notebook) if solutions else student_page_notebook(page.notebook)
    box = nbformat.v4.new_markdown_cell(run_box(page, repository, solutions))  # HTML, which Markdown keeps
    nb.cells.insert(1 if nb.cells else 0, box)  # under the title
    intro = solutions_banner() if solutions else ""
    return _render(html_exporter or exporter(), nb, f"{page.short} · {COURSE}", page.stem, page.notebook.parent,
                   navigation(page, all_pages, "top", solutions), navigation(page, all_pages, "bottom", solutions),
                   intro, solutions=solutions, repository=repository)


def landing_markdown(all_pages: list[Page], repository: str | None, solutions: bool = False,
                     template: Path = LANDING) -> str:
    """The landing page's Markdown: ``templates/site/index.md`` (or ``template``: the lecturers' page) with its
    placeholders filled in."""
    text = template.read_text(encoding="utf-8")
    rows = "\n".join(f"| {p.number} | [{p.name}]({p.stem}.html) | {p.promise[:1].upper() + p.promise[1:]} | "
                     f"[slides]({p.stem}.slides.html) |" for p in all_pages)
    notebooks_table = "| # | notebook | what it builds | deck |\n|---|---|---|---|\n" + rows
    decks = " · ".join(f"[{p.number} {p.name}]({p.stem}.slides.html)" for p in all_pages)
    if repository:
        clone = f"git clone {repository}\ncd {_clone_folder(repository)}"
        where = f"The course lives in a git repository: [{repository}]({repository})."
        readme = web.web_address(repository)
        if readme:
            where += f" Its [README]({readme}#readme) says how to train the model for real and chat with it."
    else:
        clone = "git clone <repository-address>\ncd <repository-folder>"
        where = "The course lives in a git repository; your lecturer gives you its address."
    edition = ("**This is the instructor's edition of the site: every page shows the solutions. Do not publish "
               "it.**\n\n" if solutions else "")
    replacements = {"<!-- edition -->": edition, "<!-- notebooks -->": notebooks_table,
                    "<!-- decks -->": decks, "<!-- clone -->": clone, "<!-- repository -->": where,
                    "<!-- first -->": f"[{all_pages[0].short}]({all_pages[0].stem}.html)"}
    if "<!-- plan -->" in text:
        replacements["<!-- plan -->"] = session_plan(all_pages)
    for key, value in replacements.items():
        text = text.replace(key, value)
    return rewrite_links(text, lambda target: notebook_link(target, ".html"))


def session_plan(all_pages: list[Page]) -> str:
    """The lecturers' page's table: for each deck's sessions, the lecture slides, the minutes their speaker notes add
    up to, and the "Your turn" tasks it shows with their minutes (the workshop); then the totals."""
    rows = ["| deck | session | slides | talk | *Your turn* tasks | workshop |", "|---|---|---|---|---|---|"]
    total = slides.Session(0, 0, 0, 0)
    count = 0
    for page in all_pages:
        parts = slides.sessions(page.notebook)
        for k, part in enumerate(parts):
            name = f"[{page.number} {page.name}]({page.stem}.slides.html)" if k == 0 else ""
            session = f"part {k + 1} of {len(parts)}" if len(parts) > 1 else "one"
            rows.append(f"| {name} | {session} | {part.slides} | {part.minutes} min | {part.tasks} | "
                        f"{part.task_minutes} min |")
            total = slides.Session(total.slides + part.slides, total.minutes + part.minutes,
                                   total.tasks + part.tasks, total.task_minutes + part.task_minutes)
            count += 1
    rows.append(f"| **all** | **{count} sessions** | **{total.slides}** | **{total.minutes} min** | **{total.tasks}** | "
                f"**{total.task_minutes} min** |")
    return "\n".join(rows)


def landing_page(all_pages: list[Page], html_exporter: HTMLExporter | None = None, solutions: bool = False,
                 repository: str | None = None, lecturers: bool = False) -> str:
    """The HTML of the landing page (with ``lecturers``, of the lecturers' page)."""
    nb = nbformat.v4.new_notebook()
    template = LECTURERS if lecturers else LANDING
    nb.cells = [nbformat.v4.new_markdown_cell(landing_markdown(all_pages, repository, solutions, template))]
    intro = solutions_banner() if solutions else ""
    title = f"For lecturers · {COURSE}" if lecturers else COURSE
    return _render(html_exporter or exporter(), nb, title, "lecturers" if lecturers else "index", REPO,
                   navigation(None, all_pages, "top", solutions), navigation(None, all_pages, "bottom", solutions),
                   intro, solutions=solutions)


def pages() -> list[Page]:
    """Every guided notebook, in order, as the site names it."""
    return [Page.of(path) for path in notebooks()]


def build(out: Path = DEFAULT_OUT, notebooks: list[Path] | None = None, landing: bool = True,
          solutions: bool = False, repository: str | None = None, decks: bool = True) -> list[Path]:
    """Write the site into ``out``: the pages of ``notebooks`` (default: all) with their decks and student
    notebooks and, with ``landing``, the landing page. Return the pages written."""
    from .student import GUIDED_ONLY, student_notebook  # nbgrader is slow to import; only the site needs it here

    all_pages = pages()
    chosen = [Page.of(path.resolve()) for path in notebooks] if notebooks else all_pages
    out.mkdir(parents=True, exist_ok=True)
    copy_assets(out, reveal=decks, css=["site.css"] + (["slides.css"] if decks else []))
    html_exporter = exporter()
    written = []
    if landing:
        (out / "index.html").write_text(landing_page(all_pages, html_exporter, solutions, repository),
                                        encoding="utf-8")
        written.append(out / "index.html")
        (out / "lecturers.html").write_text(landing_page(all_pages, html_exporter, solutions, repository,
                                                         lecturers=True), encoding="utf-8")
        written.append(out / "lecturers.html")
    (out / STUDENT_DIR).mkdir(exist_ok=True)
    for page in chosen:
        (out / f"{page.stem}.html").write_text(notebook_page(page, all_pages, html_exporter, solutions, repository),
                                               encoding="utf-8")
        (out / STUDENT_DIR / page.notebook.name).write_text(student_notebook(page.notebook, answers=solutions),
                                                            encoding="utf-8")
        written.append(out / f"{page.stem}.html")
    if decks:
        slides.build([page.notebook for page in chosen], out, solutions)
    if landing and not notebooks:  # a whole site: pages left from an earlier build (a renamed notebook) go
        keep = {path.name for path in written} | {f"{page.stem}.slides.html" for page in all_pages}
        for stale in out.glob("*.html"):
            if stale.name not in keep:
                stale.unlink()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m transformer_from_scratch.nbtools.site",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="where the site goes (default: build/site, or build/site-instructor with --solutions)")
    parser.add_argument("--solutions", action="store_true",
                        help="the instructor's edition: every page with its solutions (never publish it)")
    parser.add_argument("--repository", default=None,
                        help=f"the address learners clone (default: ${REPOSITORY_VARIABLE}, else git's origin)")
    parser.add_argument("--local", action="store_true", default=_flag(os.environ.get(LOCAL_VARIABLE)),
                        help=f"a site for this machine only, which may lack the repository's address (default: "
                             f"${LOCAL_VARIABLE}, so make site {LOCAL_VARIABLE}=1)")
    args = parser.parse_args(argv)
    out = (args.out or (INSTRUCTOR_OUT if args.solutions else DEFAULT_OUT)).resolve()
    repository = repository_url(args.repository)
    if repository is None and not (args.local or args.solutions):
        print("make site: no repository address to publish (no git origin, or a local one; no "
              f"${REPOSITORY_VARIABLE}), and a public site without it tells learners `git clone <repository-address>`. "
              f"Give it with make site REPOSITORY=https://…, or build for this machine only with make site "
              f"{LOCAL_VARIABLE}=1.", file=sys.stderr)
        return 2
    written = build(out, solutions=args.solutions, repository=repository)
    print(f"wrote {len(written)} pages, their decks and the student notebooks to {out}/")
    if args.solutions:
        print("This is the instructor's edition: every page shows the solutions. Do not publish it.")
    if repository is None:
        print(f"No repository address to publish (no git origin, or a local one; no ${REPOSITORY_VARIABLE}): the "
              "pages ask learners to get it from their lecturer. Set it with make site REPOSITORY=https://…")
    print(f"Open {out / 'index.html'} in a browser, or serve the folder: "
          f"python3 -m http.server --directory {out} 8000")
    return 0


if __name__ == "__main__":
    sys.exit(main())
