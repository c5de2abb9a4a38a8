"""Write a notebook's ``#| export`` cells to its module in this package.

The notebook is the source of truth: ``notebooks/01_linear.ipynb`` owns
``src/transformer_from_scratch/linear.py``. A code cell whose first line is ``#| export``
belongs to the module; the module is those cells, in notebook order, under a header that
names the notebook and records a hash of the body, so an edit made by hand can be detected
and is never silently overwritten.

Three ways in:

* In a notebook: ``%load_ext transformer_from_scratch.nbtools.export`` in the setup cell, then
  ``export_notebook("01_linear.ipynb")`` after the final class. The extension remembers the
  source of every cell that ran successfully in this kernel, so the export writes what you
  *ran*, even if you have not saved the notebook yet.
* ``make export`` (``python -m transformer_from_scratch.nbtools.export``): every notebook, from disk.
* ``make check-export`` (``--check``), and the unit tests: fail, naming the module, when
  ``src/`` differs from what the notebooks export.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import hashlib
import importlib
import json
import re
import symtable
import sys
from pathlib import Path

from .._project import (GENERATED_HEADER, LEARNER_HEADER, PACKAGE, PACKAGE_DIR, REFERENCE_HEADER, REFERENCE_PREFIX,
                        repo_root)
from . import failures

MARKER = "#| export"
# The learner's own package in the student edition: notebooks/student/my_transformer/ (see nbtools.student).
STUDENT_PACKAGE = "my_transformer"
# nbgrader's solution markers: `make student` blanks what lies between them; the module leaves the lines out.
_SOLUTION_MARKER = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n?", re.MULTILINE)
_NOTEBOOK_NAME = re.compile(r"^\d\d_(?P<module>[a-z][a-z0-9_]*)\.ipynb$")
_HASH_LINE = re.compile(r"^# body-sha256: (?P<digest>[0-9a-f]{64})$", re.MULTILINE)
# A stub of a final class in the student edition:
# raise NotImplementedError('Linear.forward is not written yet: write it in …')
_FINAL_CLASS_STUB = re.compile(r"""raise NotImplementedError\(['"](\S+) is not written yet: write it in """)

# cell id -> source of the last successful run of that cell in this kernel (see load_ipython_extension).
_ran_cells: dict[str, str] = {}


class ExportError(Exception):
    """The export cannot go ahead; the message says why and what to do."""


def module_name(notebook: Path) -> str:
    """``notebooks/01_linear.ipynb`` -> ``"linear"``."""
    match = _NOTEBOOK_NAME.match(Path(notebook).name)
    if match is None:
        raise ExportError(f"{notebook}: notebook names look like '01_linear.ipynb' (two digits, '_', module name)")
    return match["module"]


def module_path(notebook: Path) -> Path:
    """Where a notebook's module lives: ``<repo>/src/transformer_from_scratch/<module>.py``.

    A student-edition notebook (one with a ``my_transformer/`` package beside it) writes to the
    learner's own package instead, ``<its folder>/my_transformer/<module>.py``: the reference package
    in ``src/`` is never touched from there.
    """
    notebook = Path(notebook).resolve()
    student_package = notebook.parent / STUDENT_PACKAGE
    if (student_package / "__init__.py").is_file():
        return student_package / f"{module_name(notebook)}.py"
    try:
        package_dir = repo_root(notebook.parent) / "src" / PACKAGE
    except FileNotFoundError as error:
        raise ExportError(f"{notebook}: {error}") from None
    if not package_dir.is_dir():
        raise ExportError(f"{notebook}: expected the package at {package_dir} (notebooks/ and src/ side by side)")
    return package_dir / f"{module_name(notebook)}.py"


def _is_export_cell(source: str) -> bool:
    lines = source.lstrip().splitlines()
    return bool(lines) and lines[0].strip() == MARKER


def export_cells(notebook: Path, ran: dict[str, str] | None = None) -> list[str]:
    """The sources of the notebook's export cells, in notebook order, without the marker line.

    ``ran`` maps cell ids to the source that last ran in a kernel; for those cells it wins
    over the saved file (a learner may run a cell and export before saving).
    """
    cells = json.loads(Path(notebook).read_text(encoding="utf-8"))["cells"]
    sources = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        if ran and cell.get("id") in ran:
            source = ran[cell["id"]]
        if _is_export_cell(source):
            body = source.lstrip().split("\n", 1)[1] if "\n" in source.lstrip() else ""
            sources.append(_SOLUTION_MARKER.sub("", body).strip("\n"))
    if not sources:
        raise ExportError(f"{Path(notebook).name}: no code cell starts with '{MARKER}', so there is nothing to export")
    return sources


def render(notebook: Path, sources: list[str], *, reference: bool = False) -> str:
    """The module text: a header naming the notebook and hashing the body, then the cells.

    ``reference``: the module re-exports the course's version (``export_notebook(..., reference=True)``), and its
    first line says so: it is not the learner's code.
    """
    body = "\n\n\n".join(s.rstrip() for s in sources) + "\n"
    body = "\n".join(line.rstrip() for line in body.split("\n"))
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    name = Path(notebook).name
    if reference:
        first = REFERENCE_HEADER
    elif (Path(notebook).resolve().parent / STUDENT_PACKAGE / "__init__.py").is_file():
        first = LEARNER_HEADER
    else:
        first = GENERATED_HEADER
    header = (
        first.format(notebook=name) + "\n" +
        "# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).\n"
        f"# body-sha256: {digest}\n"
    )
    return header + "\n" + body


def undefined_names(text: str) -> list[str]:
    """The global names that ``text``'s functions and classes read but that the module never binds (nor builtins).

    A step written in a cell that is not exported (``rotate_pairs``) and called from the exported class works in its
    notebook, whose namespace holds it, and fails in every later one: this finds it before the module is written."""
    top = symtable.symtable(text, "<module>", "exec")
    bound = {symbol.get_name() for symbol in top.get_symbols()
             if symbol.is_assigned() or symbol.is_imported() or symbol.is_namespace()}
    missing: set[str] = set()

    def visit(table: symtable.SymbolTable) -> None:
        for symbol in table.get_symbols():
            name = symbol.get_name()
            free = symbol.is_referenced() and (symbol.is_global() if table is not top else True)
            if free and name not in bound and not hasattr(builtins, name):
                missing.add(name)
        for child in table.get_children():
            visit(child)

    visit(top)
    return sorted(missing)


def was_edited_by_hand(text: str) -> bool:
    """True when a module's body no longer matches the hash its header recorded (or it has no header)."""
    header, _, body = text.partition("\n\n")
    match = _HASH_LINE.search(header)
    return match is None or hashlib.sha256(body.encode("utf-8")).hexdigest() != match["digest"]


def _relative(path: Path) -> str:
    """``src/transformer_from_scratch/linear.py``: short, and free of machine-specific prefixes."""
    return str(Path(*path.parts[-3:]))


def export_notebook(notebook: str | Path, *, force: bool = False, quiet: bool = False, reference: bool = False) -> None:
    """Write ``notebook``'s export cells to its module and say whether it changed.

    Refuses (``ExportError``) when the module was edited by hand since the last export,
    unless ``force`` is true; then the hand-edited file is kept as ``<module>.py.bak``.

    ``reference=True`` is for a learner who is stuck (student edition only): their module then
    re-exports the course's reference implementation, so the later notebooks run on it, and the
    reference's names replace theirs in this notebook too. Their code in the notebook is left as
    it is; exporting again without ``reference`` puts their own version back, once it is written: while the export
    cells still hold a stub, the reference stays (the notebook's own export cell, run after the learner chose the
    reference, must not put the stubs back).
    """
    notebook = Path(notebook)
    target = module_path(notebook)
    if reference:
        names, source = _reference_module(notebook, target)
        text = render(notebook, [source], reference=True)
    else:
        text = render(notebook, export_cells(notebook, _ran_cells))
    stubs = [] if reference else list(dict.fromkeys(_FINAL_CLASS_STUB.findall(text)))  # student edition: not written
    try:  # a module that does not compile would break `import transformer_from_scratch` everywhere
        compile(text, str(target), "exec")
    except SyntaxError as error:
        raise ExportError(
            f"{notebook.name}: the '{MARKER}' cells do not compile ({error.msg}, line {error.lineno} of "
            f"{target.name}); {_relative(target)} was left as it was"
        ) from None
    # A stub leaves out the names its code would define (count_resources' `flops`): checked once every stub is written.
    if not reference and not stubs and (missing := undefined_names(text)):
        raise ExportError(
            f"{notebook.name}: the '{MARKER}' cells use {', '.join(missing)}, defined in no '{MARKER}' cell, so "
            f"{target.name} would fail with NameError in the later notebooks (here the notebook's other cells hide "
            f"it). Move the definition into an '{MARKER}' cell, or write that code inside the class; "
            f"{_relative(target)} was left as it was"
        )
    old = target.read_text(encoding="utf-8") if target.exists() else None
    if stubs and old is not None and old.startswith(REFERENCE_PREFIX):
        if not quiet:
            print(f"{_relative(target)}: kept the reference you chose: {', '.join(stubs)} not written "
                  f"yet in {notebook.name}; once they are, export again to use yours")
        return

    status = "unchanged" if old == text else "written"
    if old is not None and old != text and was_edited_by_hand(old):
        if not force:
            raise ExportError(_hand_edit_message(notebook, target))
        backup = target.with_name(target.name + ".bak")
        backup.write_text(old, encoding="utf-8")
        if not quiet:
            print(f"{_relative(target)} had a hand edit: kept it as {backup.name}")
    if status == "written":
        target.write_text(text, encoding="utf-8")
    if reference:
        _use_reference_here(target.stem, names)
        if not quiet:
            print(f"{_relative(target)}: the reference {', '.join(names)} from now on, here and in the later "
                  f"notebooks (once yours is written, export_notebook(\"{notebook.name}\") puts it back)")
    elif not quiet:
        print(f"{_relative(target)}: {status} from {notebook.name}")
        _warn_about_unsaved_cells(notebook)


def _reference_module(notebook: Path, target: Path) -> tuple[list[str], str]:
    """The public names of the reference module for ``notebook``, and a module body that re-exports every name it
    defines: the private helpers too, which later notebooks may import."""
    if target.parent.name != STUDENT_PACKAGE:
        raise ExportError(f"{notebook.name}: reference=True is for the student edition; this notebook *is* the reference")
    module = module_name(notebook)
    reference = PACKAGE_DIR / f"{module}.py"
    tree = ast.parse(reference.read_text(encoding="utf-8"))
    definitions = [node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))]
    defined = definitions + [assigned.id for node in tree.body if isinstance(node, ast.Assign)
                             for assigned in node.targets if isinstance(assigned, ast.Name)]
    source = (
        f'# The course\'s reference, chosen with export_notebook("{notebook.name}", reference=True).\n'
        f'# To use your own version again, run export_notebook("{notebook.name}") in {notebook.name}.\n'
        f"from {PACKAGE}.{module} import {', '.join(defined)}  # noqa: F401"
    )
    return [name for name in definitions if not name.startswith("_")], source


def _use_reference_here(module: str, names: list[str]) -> None:
    """Bind the reference's names in the running notebook, so the rest of it runs on them."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is always there with Jupyter
        return
    shell = get_ipython()
    if shell is not None:
        reference = importlib.import_module(f"{PACKAGE}.{module}")
        shell.user_ns.update({name: getattr(reference, name) for name in names})


def check_notebook(notebook: str | Path) -> None:
    """Raise ``ExportError`` naming the module when ``src/`` differs from what ``notebook`` exports."""
    notebook = Path(notebook)
    target = module_path(notebook)
    text = render(notebook, export_cells(notebook))
    if not target.exists():
        raise ExportError(f"{_relative(target)} is missing: run `make export` to generate it from {notebook.name}")
    old = target.read_text(encoding="utf-8")
    if old == text:
        return
    if was_edited_by_hand(old):
        raise ExportError(_hand_edit_message(notebook, target))
    raise ExportError(
        f"{_relative(target)} is out of date with {notebook.name}: "
        "run `make export` (or run the notebook's export cell) to regenerate it"
    )


def _hand_edit_message(notebook: Path, target: Path) -> str:
    return (
        f"{_relative(target)} was edited by hand after it was exported from notebooks/{notebook.name}, "
        "so the export will not overwrite it.\n"
        f"  To keep your edit: copy it into the '{MARKER}' cells of {notebook.name}, then export again with --force.\n"
        f"  To discard your edit: `make export FORCE=1` "
        f"(or `python -m {PACKAGE}.nbtools.export --force notebooks/{notebook.name}`); "
        f"your version is saved as {target.name}.bak first."
    )


def _warn_about_unsaved_cells(notebook: Path) -> None:
    """Tell a learner when what they ran and what is saved on disk disagree."""
    if not _ran_cells:
        return
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    saved = {cell.get("id"): "".join(cell["source"]) for cell in cells}
    unsaved = [cid for cid, src in _ran_cells.items() if _is_export_cell(src) and saved.get(cid) != src]
    if unsaved:
        print(
            f"note: {len(unsaved)} '{MARKER}' cell(s) you ran differ from the saved notebook. "
            "The module has what you ran (new cells that were never saved are left out): "
            "save the notebook (Ctrl+S) and run this cell again so that the two agree."
        )


def _remember_cell(result) -> None:
    info = result.info
    if result.success and getattr(info, "cell_id", None):
        _ran_cells[info.cell_id] = info.raw_cell


def load_ipython_extension(ipython) -> None:
    """``%load_ext transformer_from_scratch.nbtools.export``: remember what each cell ran, for export_notebook, and
    define export_notebook in the notebook from its setup cell on: the errors of a stub that is not written yet say
    ``export_notebook("NN_x.ipynb", reference=True)``, and that line must work wherever they are met. A failing
    learner check then shows its verdict and the learner's own code, not the checker's (``nbtools.failures``)."""
    ipython.events.register("post_run_cell", _remember_cell)
    ipython.push({"export_notebook": export_notebook})
    failures.install(ipython)


def unload_ipython_extension(ipython) -> None:
    ipython.events.unregister("post_run_cell", _remember_cell)
    failures.uninstall(ipython)


def _default_notebooks() -> list[Path]:
    return sorted((repo_root() / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE}.nbtools.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to export (default: all of them)")
    parser.add_argument("--check", action="store_true", help="write nothing; fail if src/ differs from the notebooks")
    parser.add_argument("--force", action="store_true", help="overwrite hand edits (each is kept as <module>.py.bak)")
    args = parser.parse_args(argv)

    failures = []
    for notebook in args.notebooks or _default_notebooks():
        try:
            if args.check:
                check_notebook(notebook)
            else:
                export_notebook(notebook, force=args.force)
        except ExportError as error:
            failures.append(str(error))
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr)
    if args.check and not failures:
        print("src/ matches the notebooks")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
