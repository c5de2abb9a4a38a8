"""``make student``: the exercise edition of every notebook, generated from the guided ones.

    python -m transformer_from_scratch.nbtools.student [--out notebooks/student] [NOTEBOOK ...]

Each guided notebook goes through nbconvert with nbgrader's ``ClearSolutions`` preprocessor, which
replaces every region between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` with
``# YOUR CODE HERE`` / ``raise NotImplementedError(...)``: the steps of *Build it step by step*, the bodies of
the final classes and functions, and the exercise solutions. Signatures, docstrings and annotations stay: they
are the specification. Outputs are cleared (they would show the answers). Then ``StudentEdition`` adapts the
notebook to its new home:

* Imports of the components (``from transformer_from_scratch import Linear``) become imports from the
  learner's own package, ``my_transformer`` (``notebooks/student/my_transformer/``), which each student
  notebook's export cell writes. So the learner's attention uses the learner's softmax, and the
  reference package in ``src/`` is never touched. The checks and the notebook tooling still come from
  ``transformer_from_scratch``; ``my_transformer`` re-exports the shape-check switch too.
* Each stub's ``NotImplementedError`` names what is missing and where to write it (a function of the final
  module also says how to continue with the course's version), so an unwritten stub met from a later
  notebook says what to do.
* Relative links to images and files outside ``notebooks/`` get one more ``../``.
* The guided edition's note on how to start the workshop (a cell tagged ``guided-only``) is left out, and a
  note under the title says how to work, and the export cell says how to continue with the
  reference when stuck: ``export_notebook("01_linear.ipynb", reference=True)``.

A learner's work is never overwritten: ``.generated.json`` records a hash of every file as it was
written; a file that no longer matches it was changed by the learner and is skipped (the run says so).
``my_transformer/`` always holds every component: its ``__init__.py`` imports them all, and a component module
still missing is written as the stubs of its student notebook; existing modules are left alone. So
``make student NB=notebooks/06_rope.ipynb`` regenerates one notebook and leaves the package whole.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sys
from pathlib import Path

import nbformat
from nbconvert.exporters import NotebookExporter
from nbconvert.preprocessors import ClearOutputPreprocessor, Preprocessor
from nbgrader.preprocessors import ClearSolutions
from traitlets import List, Unicode

from .._project import generated_from, repo_root
from .export import PACKAGE, STUDENT_PACKAGE, export_cells, module_name, render
from .web import without_answers

REPO = repo_root()
DEFAULT_OUT = REPO / "notebooks" / "student"
MANIFEST = ".generated.json"
CODE_STUB = "# YOUR CODE HERE\nraise NotImplementedError()"  # ClearSolutions' stub; StudentEdition names it
# A cell with this tag is for the guided edition alone (the note that says how to start the workshop).
GUIDED_ONLY = "guided-only"
# What my_transformer re-exports besides the components: the switch for the run-time shape checks.
TOOLING_EXPORTS = {"shapes": ["set_shape_checks", "shape_checks", "shape_checks_enabled"]}

STUDENT_NOTE = """> **Student edition: you write this notebook.** Replace each `raise NotImplementedError(...)` under a
> `# YOUR CODE HERE`: the steps of *Build it step by step* (a cell after each checks it and says what is wrong),
> then the final class, which assembles them, then the exercises; the hints open one at a time. The export cell
> writes your class into `my_transformer/` (next to this notebook), which the later notebooks import. Stuck on the
> class? `export_notebook("{name}", reference=True)` continues with the course's version. Every solution:
> [`../{name}`](../{name})."""

REFERENCE_LINE = (
    '# Stuck? Continue with the course\'s reference instead of yours (here and in the later notebooks):\n'
    '# export_notebook("{name}", reference=True)'
)


def component_modules() -> list[str]:
    """The reference package's component modules (those generated from a notebook), e.g. ``["attention", ...]``."""
    package = REPO / "src" / PACKAGE
    return sorted(p.stem for p in package.glob("*.py")
                  if generated_from(p.read_text(encoding="utf-8")))


def public_names(module: str) -> list[str]:
    """The classes and functions a reference module defines for others to import."""
    tree = ast.parse((REPO / "src" / PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    return [node.name for node in tree.body
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and not node.name.startswith("_")]


class StudentEdition(Preprocessor):
    """Point a cleared notebook at the learner's package and at files one folder further up."""

    components = List(Unicode(), help="component modules whose imports move to the learner's package").tag(config=True)
    notebook_name = Unicode(help="the notebook's file name, e.g. 01_linear.ipynb").tag(config=True)

    def preprocess(self, nb, resources):
        nb.cells = [cell for cell in nb.cells if GUIDED_ONLY not in cell.metadata.get("tags", [])]
        section = ""
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                headings = re.findall(r"^## (.+)$", cell.source, re.MULTILINE)
                section = headings[-1].strip() if headings else section
            elif STUB_RAISE in cell.source:
                cell.source = _named_stubs(cell.source, self.notebook_name, section)
        nb, resources = super().preprocess(nb, resources)
        note = nbformat.v4.new_markdown_cell(STUDENT_NOTE.format(name=self.notebook_name))
        note["id"] = "student-edition-note"
        nb.cells.insert(1, note)
        return nb, resources

    def preprocess_cell(self, cell, resources, index):
        modules = "|".join(map(re.escape, self.components))
        # `from transformer_from_scratch import X` and `from transformer_from_scratch.linear import X`,
        # but not the checks or the tooling (transformer_from_scratch.checks, transformer_from_scratch.nbtools).
        pattern = rf"\b{PACKAGE}(?=(\.({modules}))?\s+import\b)" if modules else rf"\b{PACKAGE}(?=\s+import\b)"
        cell.source = re.sub(pattern, STUDENT_PACKAGE, cell.source)
        if cell.cell_type == "markdown":
            cell.source = re.sub(r'(\]\(|src=")\.\./', r"\1../../", cell.source)
            cell.source = cell.source.replace(f"src/{PACKAGE}/", f"{STUDENT_PACKAGE}/")
        elif "export_notebook(" in cell.source and "import export_notebook" in cell.source:
            cell.source = cell.source.rstrip() + "\n" + REFERENCE_LINE.format(name=self.notebook_name)
        return cell, resources


STUB_RAISE = "raise NotImplementedError()"


def _enclosing_names(source: str) -> dict[int, str]:
    """Line number (1-based) of every stub's raise -> the qualified name of the function or class around it."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a cell with IPython syntax: the stubs keep a generic message
        return {}
    names: dict[int, str] = {}

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, scope + [child.name])
            else:
                if isinstance(child, ast.Raise) and scope:
                    names[child.lineno] = ".".join(scope)
                visit(child, scope)

    visit(tree, [])
    return names


def _named_stubs(source: str, notebook: str, section: str) -> str:
    """Give each stub's NotImplementedError a message: what is missing, and where it is written."""
    export = source.lstrip().startswith("#| export")
    names = _enclosing_names(source)
    lines = source.split("\n")
    for number, line in enumerate(lines, start=1):
        if line.strip() != STUB_RAISE:
            continue
        name = names.get(number)
        where = f"{notebook} ({section})" if section else notebook
        if name and export:
            message = (f"{name} is not written yet: write it in {where}, or continue with the reference: "
                       f'export_notebook("{notebook}", reference=True)')
        elif name:
            message = f"{name} is not written yet: write it here, in {where}"
        else:
            message = f"not written yet: write your answer here, in {where}"
        lines[number - 1] = line.replace(STUB_RAISE, f"raise NotImplementedError({message!r})")
    return "\n".join(lines)


def student_notebook(notebook: Path, answers: bool = True) -> str:
    """The student edition of ``notebook``, as the text of an .ipynb file; without the exercises' collapsed answers
    when ``answers`` is False (the notebook the published site offers)."""
    exporter = NotebookExporter()
    exporter.register_preprocessor(ClearSolutions(
        enforce_metadata=False,  # plain markers in ordinary cells, no nbgrader cell metadata
        begin_solution_delimeter="### BEGIN SOLUTION",
        end_solution_delimeter="### END SOLUTION",
        code_stub={"python": CODE_STUB},
    ), enabled=True)
    exporter.register_preprocessor(ClearOutputPreprocessor(), enabled=True)
    exporter.register_preprocessor(StudentEdition(components=component_modules(), notebook_name=notebook.name),
                                   enabled=True)
    text, _ = exporter.from_filename(str(notebook))
    if not answers:
        nb = nbformat.reads(text, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = without_answers(cell.source)
        text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _write_unless_edited(path: Path, text: str, manifest: dict[str, str], out: Path) -> str:
    """Write ``path`` unless the learner changed it since we last wrote it; return what happened."""
    key = path.relative_to(out).as_posix()
    if path.exists():
        current = path.read_text(encoding="utf-8")
        if manifest.get(key) != _digest(current):
            return "kept (you have changed it; delete or rename it to get a fresh copy)"
        if current == text:
            return "unchanged"
        status = "updated"
    else:
        status = "written"
    path.write_text(text, encoding="utf-8")
    manifest[key] = _digest(text)
    return status


def _package_init(modules: list[str]) -> str:
    lines = [
        '"""Your Transformer LM: each module is written by the export cell of its student notebook."""',
        "",
    ]
    names = []
    for module in modules:
        exported = public_names(module)
        names += exported
        lines.append(f"from .{module} import {', '.join(exported)}")
    lines += ["", "# Not a component: the switch that turns the run-time shape checks off (for training runs)."]
    for module, exported in TOOLING_EXPORTS.items():
        names += exported
        lines.append(f"from {PACKAGE}.{module} import {', '.join(exported)}")
    lines += ["", f"__all__ = {names!r}", ""]
    return "\n".join(lines)


def _guided_notebooks() -> list[Path]:
    return sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _write_stub_module(guided: Path, out: Path) -> Path:
    """Write the stubs of ``guided``'s student notebook as its module in the learner's package, and return it.

    The module is what that notebook's export cell would write before any stub is filled in, so every later
    notebook can import it (and meets a stub that says where to write it).
    """
    scratch = out / f".stubs-{guided.name}"
    scratch.write_text(student_notebook(guided), encoding="utf-8")
    try:
        text = render(out / guided.name, export_cells(scratch))
    finally:
        scratch.unlink()
    target = out / STUDENT_PACKAGE / f"{module_name(guided)}.py"
    target.write_text(text, encoding="utf-8")
    return target


def build(notebooks: list[Path], out: Path = DEFAULT_OUT) -> list[str]:
    """Write the student edition of ``notebooks`` into ``out``; return one report line per file.

    Whatever ``notebooks`` holds, the learner's package is left whole: every component module exists (the
    stubs, where none does) and ``__init__.py`` imports every one.
    """
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / MANIFEST
    manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.exists() else {}
    report = []
    for notebook in notebooks:
        status = _write_unless_edited(out / notebook.name, student_notebook(notebook), manifest, out)
        report.append(f"{notebook.name}: {status}")

    package = out / STUDENT_PACKAGE
    package.mkdir(exist_ok=True)
    every = [nb for nb in _guided_notebooks() if module_name(nb) in component_modules()]
    status = _write_unless_edited(package / "__init__.py", _package_init([module_name(nb) for nb in every]),
                                  manifest, out)
    report.append(f"{STUDENT_PACKAGE}/__init__.py: {status}")
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for notebook in every:  # the stubs, so that `import my_transformer` works from the first notebook on
        target = package / f"{module_name(notebook)}.py"
        if not target.exists():
            _write_stub_module(notebook, out)
            report.append(f"{STUDENT_PACKAGE}/{target.name}: written (stubs, from {notebook.name})")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE}.nbtools.student", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="guided notebooks (default: all of them)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the student edition goes")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or _guided_notebooks()
    for line in build([nb.resolve() for nb in notebooks], args.out.resolve()):
        print(line)
    print(f"The student edition is in {args.out}/. `make workshop` opens JupyterLab on its first notebook.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
