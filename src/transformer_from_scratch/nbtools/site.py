"""``make site``: the course as a static website, from README.md and the notebooks' stored outputs.

    python -m transformer_from_scratch.nbtools.site [--out build/site]

What it writes into ``--out`` (default ``build/site/``), every link relative, nothing fetched from elsewhere
when it is built or read (open ``index.html`` from disk, or serve the folder with any static server):

* ``index.html``: README.md rendered; its links to ``notebooks/NN_x.ipynb`` point at the pages.
* ``contributing.html``: CONTRIBUTING.md, which the README links to.
* ``NN_x.html``: each guided notebook with the outputs it was saved with (figures, printed results, the
  widgets' default figures, the maths typeset by MathJax), its hints and answers collapsed as in
  JupyterLab, and navigation on top and at the bottom: previous · index · next.
* ``student/NN_x.ipynb``: each notebook's student edition (what ``make student`` writes to
  ``notebooks/student/``, generated here the same way), linked from its page for download.
* ``images/`` (the diagrams) and ``assets/`` (MathJax from jupyter-server-mathjax, the site's CSS).

The pages are nbconvert's HTMLExporter with the ``course_site`` template (``templates/course_site/``): the
JupyterLab look, minus what would load from a CDN (require.js, the widget manager, mermaid), plus the
navigation.
"""

from __future__ import annotations

import argparse
import html
import sys
from pathlib import Path

import nbformat
from nbconvert.exporters import HTMLExporter
from nbconvert.preprocessors import Preprocessor

from .web import REPO, TEMPLATES, Page, WidgetNote, copy_assets, notebook_link, notebooks, rewrite_links

DEFAULT_OUT = REPO / "build" / "site"
COURSE = "Transformer LM from scratch"
STUDENT_DIR = "student"
# README and CONTRIBUTING link to each other and to the notebooks; on the site they are pages.
DOCUMENTS = {"README.md": "index.html", "CONTRIBUTING.md": "contributing.html"}


def _document_link(target: str) -> str | None:
    path, _, anchor = target.partition("#")
    name = Path(path).name
    if name in DOCUMENTS and path in (name, f"../{name}", f"./{name}"):
        return DOCUMENTS[name] + (f"#{anchor}" if anchor else "")
    return notebook_link(target, ".html")


class SiteLinks(Preprocessor):
    """Point a notebook's links at the site: other notebooks' pages, images/, the landing page."""

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "markdown":
            cell.source = rewrite_links(cell.source, _document_link)
        return cell, resources


def exporter() -> HTMLExporter:
    return HTMLExporter(
        template_name="course_site",
        extra_template_basedirs=[str(TEMPLATES)],
        extra_template_paths=[str(TEMPLATES)],
        preprocessors=[WidgetNote(), SiteLinks()],
        exclude_input_prompt=True,
        exclude_output_prompt=True,
    )


def _link(href: str, text: str, rel: str = "", css: str = "") -> str:
    attributes = f' rel="{rel}"' if rel else ""
    attributes += f' class="{css}"' if css else ""
    return f'<a href="{html.escape(href)}"{attributes}>{html.escape(text)}</a>'


def navigation(page: Page | None, all_pages: list[Page], where: str) -> str:
    """The bar on top (``where="top"``) and at the bottom of a page: previous · index · next and the student
    edition; on the landing page (``page`` None), the way to the first notebook."""
    parts = [f'<nav class="course-nav course-nav-{where}" aria-label="Course navigation">',
             _link("index.html", COURSE, css="course-home")]
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
        student = _link(f"{STUDENT_DIR}/{page.notebook.name}", "Student edition (.ipynb)")
        parts += [f'<span class="course-prev">{previous}</span>',
                  f'<span class="course-index">{_link("index.html", "Index", "index")}</span>',
                  f'<span class="course-next">{following}</span>',
                  f'<span class="course-student">{student}</span>']
    parts.append("</nav>")
    return "\n".join(parts)


def student_box(page: Page) -> str:
    name = html.escape(page.notebook.name)
    return (f'<aside class="course-student-box"><b>Write it yourself.</b> The student edition of this notebook '
            f'blanks the final class and the exercises for you to write, with hints and a check that names your '
            f'mistake: <a href="{STUDENT_DIR}/{name}" download>download {name}</a>. It runs inside the course\'s '
            f'repository, where <code>make student</code> writes it to <code>notebooks/student/{name}</code> and '
            f'<code>make lab</code> opens it.</aside>')


def _render(html_exporter: HTMLExporter, nb, title: str, name: str, path: Path, top: str, bottom: str,
            intro: str = "") -> str:
    nb.metadata["title"] = title
    resources = {"metadata": {"name": name, "path": str(path)},
                 "course": {"nav_top": top, "intro": intro, "nav_bottom": bottom}}
    body, _ = html_exporter.from_notebook_node(nb, resources=resources)
    return body


def _document(path: Path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(rewrite_links(path.read_text(encoding="utf-8"), _document_link))]
    return nb


def notebook_page(page: Page, all_pages: list[Page], html_exporter: HTMLExporter | None = None) -> str:
    """The HTML of ``page``'s notebook: its cells and stored outputs, navigation, the student edition's box."""
    nb = nbformat.read(page.notebook, as_version=4)
    return _render(html_exporter or exporter(), nb, f"{page.short} · {COURSE}", page.stem, page.notebook.parent,
                   navigation(page, all_pages, "top"), navigation(page, all_pages, "bottom"), student_box(page))


def document_page(document: str, all_pages: list[Page], html_exporter: HTMLExporter | None = None) -> str:
    """The HTML of README.md (the landing page) or CONTRIBUTING.md."""
    page_name = DOCUMENTS[document]
    title = COURSE if page_name == "index.html" else f"{Path(document).stem.capitalize()} · {COURSE}"
    return _render(html_exporter or exporter(), _document(REPO / document), title, Path(page_name).stem, REPO,
                   navigation(None, all_pages, "top"), navigation(None, all_pages, "bottom"))


def pages() -> list[Page]:
    """Every guided notebook, in order, as the site names it."""
    return [Page.of(path) for path in notebooks()]


def build(out: Path = DEFAULT_OUT, notebooks: list[Path] | None = None, landing: bool = True) -> list[Path]:
    """Write the site into ``out``: the pages of ``notebooks`` (default: all) with their student editions and,
    with ``landing``, the landing page and CONTRIBUTING. Return the pages written."""
    from .student import student_notebook  # nbgrader is slow to import; only the site needs it here

    all_pages = pages()
    chosen = [Page.of(path.resolve()) for path in notebooks] if notebooks else all_pages
    out.mkdir(parents=True, exist_ok=True)
    copy_assets(out, reveal=False, css="site.css")
    html_exporter = exporter()
    written = []
    if landing:
        for document, page_name in DOCUMENTS.items():
            (out / page_name).write_text(document_page(document, all_pages, html_exporter), encoding="utf-8")
            written.append(out / page_name)
    (out / STUDENT_DIR).mkdir(exist_ok=True)
    for page in chosen:
        (out / f"{page.stem}.html").write_text(notebook_page(page, all_pages, html_exporter), encoding="utf-8")
        (out / STUDENT_DIR / page.notebook.name).write_text(student_notebook(page.notebook), encoding="utf-8")
        written.append(out / f"{page.stem}.html")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m transformer_from_scratch.nbtools.site",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the site goes (default: build/site)")
    args = parser.parse_args(argv)
    pages = build(args.out.resolve())
    print(f"wrote {len(pages)} pages and the student editions to {args.out}/")
    print(f"Open {args.out / 'index.html'} in a browser, or serve it: "
          f"python -m http.server --directory {args.out} 8000, then http://localhost:8000")
    return 0


if __name__ == "__main__":
    sys.exit(main())
