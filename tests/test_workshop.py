"""The student edition is a workshop: the learner writes every step and every class, nothing on the page gives the
final class away, a learner who writes every stub correctly can Run All through notebooks 01 to 12, in order, each
importing the learner's own package, and a learner stuck on every final class can run them all on the reference.

These tests build the student edition into a temporary folder. The Run All tests play the learner: they write into
each stub the code of the guided edition's solution region (the stuck learner: all but the final class's, which is
taken from the reference where it is met), and execute the twelve notebooks one after the other, in fresh kernels of
the project's Python, as JupyterLab would.
"""

import difflib
import io
import json
import re
import tokenize
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from transformer_from_scratch.nbtools.export import STUDENT_PACKAGE
from transformer_from_scratch.nbtools.student import build, student_notebook

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
REGION = re.compile(r"^([ \t]*)### BEGIN SOLUTION[ \t]*\n(.*?)^[ \t]*### END SOLUTION[ \t]*\n?", re.MULTILINE | re.DOTALL)
STUB = re.compile(r"^([ \t]*)# YOUR CODE HERE\n[ \t]*raise NotImplementedError\(.*\)[ \t]*\n?", re.MULTILINE)

# Issue 18's measure: at most this share of the final class's solution lines may stand, verbatim or nearly (a
# difflib ratio of 0.8 or more), anywhere outside the stubs of the student edition: code, prose, hints, inline code.
MAX_SHOWN = 0.15
SIMILAR = 0.8
# Lines this short say nothing about the solution: `)`, `return p`, `break`, `else:`.
MIN_LINE = 12
MIN_STEPS = 3  # learner-written, self-checked steps in each notebook's Build it step by step


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def _code_line(line: str) -> str:
    """The line without its comment, with runs of white space made one space."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(line + "\n").readline):
            if token.type == tokenize.COMMENT:
                line = line[: token.start[1]]
                break
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return " ".join(line.split())


def solution_lines(notebook: Path) -> list[str]:
    """The code lines in the solution regions of the final class (the notebook's `#| export` cells)."""
    lines = []
    for cell in _cells(notebook):
        source = _source(cell)
        if cell["cell_type"] == "code" and source.startswith("#| export"):
            for _, body in REGION.findall(source):
                lines += [line for line in map(_code_line, body.splitlines()) if len(line) >= MIN_LINE]
    return lines


def visible_lines(student: dict) -> list[str]:
    """Every line the student edition shows outside its stubs, and every inline `code` span of its prose."""
    lines = []
    for cell in student["cells"]:
        for line in _source(cell).splitlines():
            if cell["cell_type"] == "code":
                lines.append(_code_line(line))
            else:
                lines.append(" ".join(line.split()))
                # A bare name (`reset_parameters`, `self.weight`) is the specification's vocabulary, not code.
                lines += [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", line)
                          if not re.fullmatch(r"[\w.]+(\(\))?", span.strip())]
    return [line for line in lines if line]


def shown_elsewhere(notebook: Path) -> tuple[list[str], list[str]]:
    """(the final class's solution lines, those of them that the student edition shows outside its stubs)."""
    solution = solution_lines(notebook)
    visible = visible_lines(json.loads(student_notebook(notebook)))
    shown = [line for line in solution
             if any(difflib.SequenceMatcher(None, line, other).ratio() >= SIMILAR for other in visible)]
    return solution, shown


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_the_final_class_is_not_shown_outside_its_stubs(notebook):
    solution, shown = shown_elsewhere(notebook)
    assert solution, "no solution lines found in the final class"
    assert len(shown) <= MAX_SHOWN * len(solution), (
        f"{len(shown)} of {len(solution)} solution lines of the final class stand elsewhere in the student "
        f"edition (at most {MAX_SHOWN:.0%}): " + " | ".join(shown))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_the_learner_writes_the_steps_and_each_is_checked(notebook):
    """In Build it step by step, each solution region is a step the learner writes, checked in the next code cell
    by a step check (transformer_from_scratch.checks.steps), never by a bare assert."""
    cells = _cells(notebook)
    start = next(i for i, c in enumerate(cells) if _source(c).startswith("## Build it step by step"))
    end = next(i for i, c in enumerate(cells) if _source(c).startswith("## See it"))
    steps = 0
    for i in range(start, end):
        if cells[i]["cell_type"] != "code" or "### BEGIN SOLUTION" not in _source(cells[i]):
            continue
        steps += 1
        after = next(c for c in cells[i + 1:] if c["cell_type"] == "code")
        assert re.search(r"^check_\w+\(", _source(after), re.MULTILINE) and \
            "transformer_from_scratch.checks.steps" in _source(after), \
            f"the step in cell {cells[i]['id']} is not followed by its step check: {_source(after)[:80]!r}"
    assert steps >= MIN_STEPS, f"{steps} learner-written steps in Build it step by step, expected {MIN_STEPS} or more"


def _fill(student: dict, guided: dict) -> int:
    """Write the guided solution into every stub of the student notebook, in place, as a learner would."""
    solutions = {cell["id"]: [body for _, body in REGION.findall(_source(cell))] for cell in guided["cells"]}
    filled = 0
    for cell in student["cells"]:
        if cell["cell_type"] != "code" or "# YOUR CODE HERE" not in _source(cell):
            continue
        bodies = iter(solutions[cell["id"]])
        cell["source"] = STUB.sub(lambda match: next(bodies), _source(cell))
        assert next(bodies, None) is None, f"cell {cell['id']}: more solution regions than stubs"
        filled += 1
    return filled


def _run_edition(course: Path, write, *, allow_errors: bool = False) -> tuple[Path, dict]:
    """Build the student edition into course/notebooks/student, let write(student, guided, name) play the learner on
    each notebook (in place), then run 01 to 12 in order, in fresh kernels: the folder and the executed notebooks."""
    (course / "notebooks").mkdir()
    (course / "notebooks" / "data").symlink_to(REPO / "notebooks" / "data")  # the corpus, at ../data as in a clone
    out = course / "notebooks" / "student"
    build(NOTEBOOKS, out)
    for notebook in NOTEBOOKS:
        student = nbformat.read(out / notebook.name, as_version=4)
        write(student, nbformat.read(notebook, as_version=4), notebook.name)
        nbformat.write(student, out / notebook.name)
    executed = {}
    for notebook in NOTEBOOKS:
        nb = nbformat.read(out / notebook.name, as_version=4)
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(out)}},
                       allow_errors=allow_errors).execute()
        executed[notebook.name] = nb
    return out, executed


def _write_everything(student: dict, guided: dict, name: str) -> None:
    assert _fill(student, guided) >= 2, name


@pytest.fixture(scope="module")
def written_edition(tmp_path_factory):
    """The student edition of 01 to 12 with every stub written (the guided solution), run in order."""
    return _run_edition(tmp_path_factory.mktemp("course"), _write_everything)


def test_run_all_works_from_01_to_12_on_the_learners_own_package(written_edition):
    out, executed = written_edition
    assert list(executed) == [nb.name for nb in NOTEBOOKS]
    for name, nb in executed.items():
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
        assert not errors, f"{name}: {errors[0]}"
        printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
        assert printed.count("✓ ") >= 1 + MIN_STEPS, f"{name}: the step checks and the class check did not all pass"
    for module in (out / STUDENT_PACKAGE).glob("*.py"):
        text = module.read_text(encoding="utf-8")
        if module.name != "__init__.py":
            assert text.startswith("# Written from your") and "NotImplementedError(" not in text, module.name


def _take_the_reference(student: dict, name: str) -> None:
    """After each export cell that still holds a stub, the line its errors suggest: continue with the reference."""
    stubbed = [i for i, cell in enumerate(student["cells"])
               if _source(cell).startswith("#| export") and "# YOUR CODE HERE" in _source(cell)]
    assert stubbed, f"{name}: no final class to leave unwritten"
    for number, i in enumerate(reversed(stubbed)):
        student["cells"].insert(i + 1, nbformat.v4.new_code_cell(f'export_notebook("{name}", reference=True)',
                                                                  id=f"stuck-{number}"))


def _write_all_but_the_final_class(student: dict, guided: dict, name: str) -> None:
    classes = {id(cell): cell["source"] for cell in student["cells"] if _source(cell).startswith("#| export")}
    _fill(student, guided)
    for cell in student["cells"]:
        cell["source"] = classes.get(id(cell), cell["source"])  # the final class stays unwritten
    _take_the_reference(student, name)


@pytest.fixture(scope="module")
def stuck_edition(tmp_path_factory):
    """01 to 12 with every step and exercise written but no final class: each is taken from the reference where its
    stubs are met (the line their errors suggest), and every notebook is run to the end, in order."""
    return _run_edition(tmp_path_factory.mktemp("stuck"), _write_all_but_the_final_class, allow_errors=True)


def test_a_learner_stuck_on_every_final_class_runs_every_notebook_on_the_reference(stuck_edition):
    """The later notebooks import what they need from the reference modules (private helpers too), and each
    notebook's own export cell keeps the reference while the class is unwritten instead of putting the stubs back."""
    out, executed = stuck_edition
    for name, nb in executed.items():
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
        assert not errors, f"{name}: {errors[0]['ename']}: {errors[0]['evalue']}"
        printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
        assert "kept the reference you chose" in printed, f"{name}: the export cell did not keep the reference"
    for module in (out / STUDENT_PACKAGE).glob("*.py"):
        if module.name != "__init__.py":
            assert module.read_text(encoding="utf-8").startswith("# The course's reference"), module.name
