"""The student edition is a workshop: the learner writes every step and every class, nothing on the page gives the
final class away, a learner who writes every stub correctly can Run All through notebooks 01 to 12, in order, each
importing the learner's own package, and a learner stuck on every final class can run them all on the reference.

These tests build the student edition into a temporary folder. The Run All tests play the learner: they write into
each stub the code of the guided edition's solution region (the stuck learner: all but the final class's, which is
taken from the reference where it is met), and execute the twelve notebooks one after the other, in fresh kernels of
the project's Python, as JupyterLab would.
"""

import concurrent.futures
import difflib
import functools
import io
import json
import os
import re
import tokenize
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from transformer_from_scratch._project import learner_notebook, repo_root
from transformer_from_scratch.nbtools.export import STUDENT_PACKAGE
from transformer_from_scratch.nbtools.student import build, student_notebook

REPO = repo_root()
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
# The edition runs below play the learner's code through every notebook, not its numbers: a notebook whose guided run
# trains for minutes (nbval re-executes that in full) runs here at a size that takes seconds, by these replacements
# in the copy, each of which must match its cell exactly once (a renamed size fails here, not silently).
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # each edition's kernels (they run side by side)
SMALLER = {"15_finetune.ipynb": [("STEPS, BATCH, LR = 20, 16, 4e-3", "STEPS, BATCH, LR = 2, 4, 4e-3"),
                                 ('split="test")) for _ in range(200)]', 'split="test")) for _ in range(20)]')],
           "16_fast_decode.ipynb": [("new: int = 16, repeats: int = 2)", "new: int = 4, repeats: int = 1)"),
                                    ("idle = {n: timed_threads(n, new=8)", "idle = {n: timed_threads(n, new=2)"),
                                    ("busy = {n: timed_threads(n, new=4)", "busy = {n: timed_threads(n, new=2)")]}


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


@functools.cache
def _student(notebook: Path) -> dict:
    """The student edition of `notebook` (built once per test session: both leak tests read it)."""
    return json.loads(student_notebook(notebook))


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
    visible = visible_lines(_student(notebook))
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


# The steps' measure (hints lead, demos don't leak): no solution line of a step or of the final class may be readable
# before the learner writes it. "Before" is every cell above the solution region (Markdown with its hints, inline
# code, code outside the stubs, docstrings of given code, and the guided edition's stored outputs, which the site shows
# under every cell that holds no solution), the given part of the region's own cell, and what follows it up to its
# check: the final class's hints, and the check cell with the message it prints. A line shown after that (a demo on
# the learner's own function) is fine, and so is the maths ($…$) of the Markdown: the principle, not the code line.
# "Nearly verbatim" is measured on tokens: an assignment target, `return`, `self.`, commas, colons and the quote style
# are dropped (`weights = softmax(scores, dim=-1)` and `softmax(scores, dim=-1)` are the same line), and a solution line
# is shown when at least LEAK_COVER of its tokens reappear, in order and in runs, within a stretch of one visible line
# not much longer than itself.
LEAK_COVER = 0.8
MIN_TOKENS = 8  # shorter lines say too little: `return x * gain`, `x = x.float()`, `rotated.flatten(-2)`
# Lines that are not the answer: imports, signatures, decorators, `pass`/`else:`, a counting loop's header (`for _ in
# range(num_layers))`), and a call whose arguments are the names it is given (`q, k = rotate_heads(rope, q, k,
# token_positions)`): using an earlier step is what the task says.
TRIVIAL = re.compile(r"^(import |from \S+ import |def |class |@|pass$|continue$|break$|else:|try:|finally:|[rbuf]*\"\"\"|"
                     r"\'\'\'|for \w+ in range\([\w.]+\)[)\]:]*$)")
BARE_CALL = re.compile(r"^[\w.]+\(\s*((\w+=)?[\w.]+(\s*,\s*(\w+=)?[\w.]+)*\s*,?)?\s*\)$")
TARGET = re.compile(r"^(?:return\b|yield\b|[\w.]+\s*:\s*[\w.\[\], |]+=(?!=)|[\w.,\s\[\]]+[-+*/@]?=(?!=))\s*")
TOKEN = re.compile(r"\.\.\.|->|\*\*|//|[<>=!]=|\w+|\"[^\"]*\"|\S")


def _tokens(line: str) -> tuple[str, ...]:
    """The line as tokens, without its assignment target or `return`, `self.`, commas, colons, quote style."""
    line = re.sub(r"\bself\.", "", TARGET.sub("", line.strip())).replace("'", '"')
    return tuple(token for token in TOKEN.findall(line) if token not in ",:\\")


def _covers(solution: tuple[str, ...], visible: tuple[str, ...]) -> bool:
    """Whether `visible` holds the solution line nearly verbatim (see LEAK_COVER)."""
    if len(visible) < LEAK_COVER * len(solution):
        return False
    blocks = [b for b in difflib.SequenceMatcher(None, solution, visible, autojunk=False).get_matching_blocks()
              if b.size >= 2 or (b.size == 1 and solution[b.a].isidentifier() and len(solution[b.a]) > 2)]
    if not blocks:
        return False
    span = blocks[-1].b + blocks[-1].size - blocks[0].b
    return sum(b.size for b in blocks) >= LEAK_COVER * len(solution) and span <= 1.5 * len(solution) + 2


def _readable(cell: dict, guided: dict | None) -> list[tuple[str, ...]]:
    """What a cell of the student edition shows, as token lines: its code (docstrings included) or its Markdown outside
    the maths (and inline code spans on their own), and the guided edition's stored output unless the cell holds a
    solution."""
    lines = []
    if cell["cell_type"] == "code":
        lines += [_code_line(line) for line in _source(cell).splitlines()]
        if guided is not None and "### BEGIN SOLUTION" not in _source(guided):
            for output in guided.get("outputs", []):
                lines += "".join(output.get("text", "") or output.get("data", {}).get("text/plain", "")).splitlines()
    else:  # the maths ($…$, $$…$$) states the principle, which the learner may read; its code may not stand there
        prose = re.sub(r"\$[^$\n]+\$", " ", re.sub(r"\$\$.*?\$\$", " ", _source(cell), flags=re.DOTALL))
        for line in prose.splitlines():
            lines += [line, *re.findall(r"`([^`]+)`", line)]
    return [_tokens(line) for line in lines if line.strip()]


def step_solutions(notebook: Path) -> list[tuple[str, list[str], list[tuple[str, ...]]]]:
    """(where, solution lines, what the learner can read before writing them) for every solution region of a step
    (Build it step by step) and of the final class (its `#| export` cells). Exercises are left out: their answers
    run the notebook's own demo code again, and their self-checks come after them."""
    student = _student(notebook)["cells"]
    guided = {cell["id"]: cell for cell in _cells(notebook)}
    readable = [_readable(cell, guided.get(cell["id"])) for cell in student]
    found, heading, section = [], "", ""
    for i, cell in enumerate(student):
        source = _source(cell)
        if cell["cell_type"] == "markdown":
            section = ([section] + re.findall(r"^## (.+)$", source, re.MULTILINE))[-1]
            heading = ([heading] + re.findall(r"^#{2,3} (.+)$", source, re.MULTILINE))[-1]
            continue
        original = _source(guided.get(cell["id"], {"source": ""}))
        if "### BEGIN SOLUTION" not in original or section.startswith("Exercises"):
            continue
        end = i + 1  # the final class's other cells and its hints, then the check cell, are read before too
        while end < len(student) and (student[end]["cell_type"] == "markdown"
                                      or _source(student[end]).startswith("#| export")):
            end += 1
        before = [line for shown in readable[:end + 1] for line in shown]
        for match in REGION.finditer(original):
            name = (["a cell"] + re.findall(r"^\s*def (\w+)", original[:match.start()], re.MULTILINE))[-1]
            lines = [line for line in map(_code_line, match.group(2).splitlines())
                     if line and not TRIVIAL.match(line) and not BARE_CALL.match(TARGET.sub("", line))
                     and len(_tokens(line)) >= MIN_TOKENS]
            found.append((f"{heading}, {name} (cell {i} of the student edition)", lines, before))
    return found


@pytest.mark.parametrize("solution, visible, shown", [
    ("weights = softmax(scores, dim=-1)", "softmax(scores, dim=-1)", True),
    ("y = x + self.attn(self.ln1(x), token_positions)", "    y   = x + attn(ln1(x))", True),
    ("return x / rms(x, eps) * gain", "✓ rms_norm: x / rms(x, eps) * gain, with and without leading dimensions", True),
    ("x_even, x_odd = x[..., 0::2], x[..., 1::2]", "the even coordinates, `x[..., 0::2]`, and the odd, `x[..., 1::2]`", True),
    ("return x / rms(x, eps) * gain", "print(f'rms((3, 4), eps=0) = {rms(torch.tensor([3.0, 4.0]), 0.0).item():.4f}')", False),
    ("positions = torch.arange(max_seq_len, dtype=torch.float64)", "x = torch.randn(6, D, dtype=torch.float64)", False),
    ("no_key = ~mask.any(dim=-1, keepdim=True)", "print('keys each query may attend to:', mask.sum(-1).tolist())", False),
])
def test_the_leak_measure(solution, visible, shown):
    """Near-verbatim is caught whatever the assignment target, `self.` or spacing; shared vocabulary is not."""
    assert _covers(_tokens(_code_line(solution)), _tokens(visible)) is shown


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.name)
def test_no_step_is_shown_before_the_learner_writes_it(notebook):
    """Hints lead, demos don't leak: no solution line of a step or of the final class stands, nearly verbatim, in
    anything the learner reads before writing it (above it, or in the hints and the check below it)."""
    regions = step_solutions(notebook)
    assert len(regions) >= MIN_STEPS + 1, "no steps found"
    shown = [f"{where}: {line!r} is shown as {' '.join(visible)!r}"
             for where, lines, before in regions for line in lines
             for visible in [next((v for v in before if _covers(_tokens(line), v)), None)] if visible]
    assert not shown, f"{notebook.name}: solution lines readable before they are written:\n" + "\n".join(shown)


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
        _make_smaller(student, notebook.name)
        nbformat.write(student, out / notebook.name)
    executed = {}
    for notebook in NOTEBOOKS:
        nb = nbformat.read(out / notebook.name, as_version=4)
        NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(out)}},
                       allow_errors=allow_errors).execute(env={**os.environ, **ONE_THREAD})
        executed[notebook.name] = nb
    return out, executed


def _make_smaller(student: dict, name: str) -> None:
    for old, new in SMALLER.get(name, []):
        found = [cell for cell in student["cells"] if cell["cell_type"] == "code" and old in _source(cell)]
        assert len(found) == 1 and _source(found[0]).count(old) == 1, f"{name}: {old!r} is not in one cell once"
        found[0]["source"] = _source(found[0]).replace(old, new)


def _write_everything(student: dict, guided: dict, name: str) -> None:
    assert _fill(student, guided) >= 2, name


@pytest.fixture(scope="module")
def editions(tmp_path_factory):
    """Both Run All plays below, at once: each kernel on one torch thread, the two side by side on two cores (the
    notebooks' Python runs on one core; one after the other they took twice as long)."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        written = pool.submit(_run_edition, tmp_path_factory.mktemp("course"), _write_everything)
        stuck = pool.submit(_run_edition, tmp_path_factory.mktemp("stuck"), _write_all_but_the_final_class,
                            allow_errors=True)
        return {"written": written.result(), "stuck": stuck.result()}


@pytest.fixture(scope="module")
def written_edition(editions):
    """The student edition of 01 to 12 with every stub written (the guided solution), run in order."""
    return editions["written"]


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
            assert learner_notebook(text) and "NotImplementedError(" not in text, module.name


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
def stuck_edition(editions):
    """01 to 12 with every step and exercise written but no final class: each is taken from the reference where its
    stubs are met (the line their errors suggest), and every notebook is run to the end, in order."""
    return editions["stuck"]


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
