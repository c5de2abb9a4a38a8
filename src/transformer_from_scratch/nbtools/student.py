"""``make student``: the exercise edition of every notebook, generated from the guided ones.

    python -m transformer_from_scratch.nbtools.student [--out notebooks/student] [NOTEBOOK ...]

Each guided notebook goes through nbconvert with nbgrader's ``ClearSolutions`` preprocessor, which
replaces every region between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` with
``# YOUR CODE HERE`` / ``raise NotImplementedError()``: the bodies of the final classes and functions,
and the exercise solutions. Signatures, docstrings and annotations stay: they are the specification.
Outputs are cleared (they would show the answers). Then ``StudentEdition`` adapts the notebook to its
new home:

* Imports of the components (``from transformer_from_scratch import Linear``) become imports from the
  learner's own package, ``my_transformer`` (``notebooks/student/my_transformer/``), which each student
  notebook's export cell writes. So the learner's attention uses the learner's softmax, and the
  reference package in ``src/`` is never touched. The checks and the notebook tooling still come from
  ``transformer_from_scratch``.
* Relative links to images and files outside ``notebooks/`` get one more ``../``.
* A note under the title says how to work, and the export cell says how to continue with the
  reference when stuck: ``export_notebook("01_linear.ipynb", reference=True)``.

A learner's work is never overwritten: ``.generated.json`` records a hash of every file as it was
written; a file that no longer matches it was changed by the learner and is skipped (the run says so).
``my_transformer/`` gets an ``__init__.py`` and, for any component module still missing, the stub
module exported from the student notebook; existing modules are left alone.
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

from .export import PACKAGE, STUDENT_PACKAGE, export_notebook, module_name

REPO = Path(__file__).resolve().parents[3]
DEFAULT_OUT = REPO / "notebooks" / "student"
MANIFEST = ".generated.json"
CODE_STUB = "# YOUR CODE HERE\nraise NotImplementedError()"

STUDENT_NOTE = """> **Student edition.** You write the parts marked `# YOUR CODE HERE` (replace the
> `raise NotImplementedError()`); the markdown above each one says what to build, and the hints under it
> open one at a time. Run the `check_…` cell after your class: it tells you what is wrong, or prints ✓.
> The export cell then writes your code into your own package, `my_transformer/` (next to this notebook),
> which the later notebooks import. Stuck? `export_notebook("{name}", reference=True)` continues with the
> course's reference instead. The guided notebook with every solution is [`../{name}`](../{name})."""

REFERENCE_LINE = (
    '# Stuck? Continue with the course\'s reference instead of yours (here and in the later notebooks):\n'
    '# export_notebook("{name}", reference=True)'
)


def component_modules() -> list[str]:
    """The reference package's component modules (those generated from a notebook), e.g. ``["attention", ...]``."""
    package = REPO / "src" / PACKAGE
    return sorted(p.stem for p in package.glob("*.py")
                  if p.read_text(encoding="utf-8").startswith("# Generated from notebooks/"))


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


def student_notebook(notebook: Path) -> str:
    """The student edition of ``notebook``, as the text of an .ipynb file."""
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
    lines += ["", f"__all__ = {names!r}", ""]
    return "\n".join(lines)


def build(notebooks: list[Path], out: Path = DEFAULT_OUT) -> list[str]:
    """Write the student edition of ``notebooks`` into ``out``; return one report line per file."""
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / MANIFEST
    manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.exists() else {}
    report = []
    for notebook in notebooks:
        status = _write_unless_edited(out / notebook.name, student_notebook(notebook), manifest, out)
        report.append(f"{notebook.name}: {status}")

    package = out / STUDENT_PACKAGE
    package.mkdir(exist_ok=True)
    modules = [module_name(nb) for nb in notebooks if module_name(nb) in component_modules()]
    status = _write_unless_edited(package / "__init__.py", _package_init(modules), manifest, out)
    report.append(f"{STUDENT_PACKAGE}/__init__.py: {status}")
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for notebook in notebooks:
        target = package / f"{module_name(notebook)}.py"
        if not target.exists():  # the stubs, so that `import my_transformer` works from the first notebook on
            export_notebook(out / notebook.name, quiet=True)
            report.append(f"{STUDENT_PACKAGE}/{target.name}: written (stubs, from {notebook.name})")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE}.nbtools.student", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="guided notebooks (default: all of them)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the student edition goes")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for line in build([nb.resolve() for nb in notebooks], args.out.resolve()):
        print(line)
    print(f"The student edition is in {args.out}/: start with {notebooks[0].name} there "
          "(`make lab`, then open it from the file browser).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
