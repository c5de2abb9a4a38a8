"""`make student`: the exercise edition blanks what the learner builds, points their notebooks at their own
package, never touches the guided notebooks or src/, and never overwrites a learner's edit."""

import ast
import hashlib
import importlib
import json
import re
import sys
from pathlib import Path

import pytest

from transformer_from_scratch import checks
from transformer_from_scratch._project import repo_root
from transformer_from_scratch.nbtools import export
from transformer_from_scratch.nbtools.student import build

REPO = repo_root()
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
REGION = re.compile(r"^([ \t]*)### BEGIN SOLUTION[ \t]*\n(.*?)^[ \t]*### END SOLUTION[ \t]*$", re.MULTILINE | re.DOTALL)


def _code(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "code"]


def _tree_digest(paths) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.is_file()}


@pytest.fixture(scope="module")
def edition(tmp_path_factory):
    """The student edition of every notebook, built once into a temporary notebooks/student/."""
    out = tmp_path_factory.mktemp("course") / "notebooks" / "student"
    protected = list((REPO / "src").rglob("*.py")) + NOTEBOOKS
    before = _tree_digest(protected)
    report = build(NOTEBOOKS, out)
    after = _tree_digest(protected)
    return out, report, before, after


def test_guided_notebooks_and_src_are_never_modified(edition):
    _, _, before, after = edition
    assert before == after


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_solution_region_becomes_a_stub(edition, notebook):
    out, _, _, _ = edition
    guided, student = _code(notebook), _code(out / notebook.name)
    assert len(guided) == len(student)
    regions = 0
    for before, after in zip(guided, student):
        for indent, body in REGION.findall(before):
            regions += 1
            assert body.strip() and body.strip() not in after, "a solution is still visible"
            stub = re.search(rf"^{indent}# YOUR CODE HERE\n{indent}raise NotImplementedError\('(.+)'\)$", after, re.MULTILINE)
            assert stub and "not written yet: write " in stub[1] and notebook.name in stub[1], after[:300]
        assert "### BEGIN SOLUTION" not in after and "### END SOLUTION" not in after
    assert regions >= 2
    cells = json.loads((out / notebook.name).read_text(encoding="utf-8"))["cells"]
    assert all(not cell.get("outputs") for cell in cells if cell["cell_type"] == "code"), "outputs show answers"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_the_guided_notebook_says_how_to_start_the_workshop_and_the_student_edition_does_not(edition, notebook):
    out, _, _, _ = edition
    def notes(path):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return ["".join(cell["source"]) for cell in cells if "guided-only" in cell["metadata"].get("tags", [])]
    guided = notes(notebook)
    assert len(guided) == 1 and "make workshop" in guided[0] and f"student/{notebook.name}" in guided[0]
    assert notes(out / notebook.name) == []
    assert "make workshop" not in (out / notebook.name).read_text(encoding="utf-8")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_signatures_and_docstrings_stay(edition, notebook):
    out, _, _, _ = edition
    student = "\n".join(_code(out / notebook.name))
    for source in _code(notebook):
        if source.startswith("#| export"):
            in_solution = False  # a helper the learner writes inside a solution (a nested def) goes with it
            for line in source.splitlines():
                if line.strip() in ("### BEGIN SOLUTION", "### END SOLUTION"):
                    in_solution = line.strip() == "### BEGIN SOLUTION"
                elif not in_solution and line.lstrip().startswith(("def ", "class ", '"""')):
                    assert line in student, f"{line!r} is missing from the student edition"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_components_come_from_the_learners_package(edition, notebook):
    out, _, _, _ = edition
    for source in _code(out / notebook.name):
        for match in re.finditer(r"from transformer_from_scratch(\.\w+)? import", source):
            # .reference: the built-in oracle the Verify sections compare with, never a component the learner writes;
            # .weights: where `make weights` put the GGUF file (notebook 14), tooling
            assert match.group(1) in (".checks", ".shapes", ".reference", ".nbtools.export", ".nbtools.interactive", ".nbtools.helpers",
                                      ".nbtools.plotting", ".weights"), f"{match.group(0)}: a component from the reference"
    markdown = json.loads((out / notebook.name).read_text(encoding="utf-8"))["cells"]
    for cell in markdown:
        for ref in re.findall(r'src="([^"]+)"', "".join(cell["source"])):
            assert ref.startswith("../../") and (REPO / "notebooks" / "student" / ref).resolve().exists(), ref


@pytest.fixture
def learner_package(tmp_path, monkeypatch):
    """A fresh student edition; load() imports its my_transformer (anew each time), forgotten afterwards."""
    out = tmp_path / "notebooks" / "student"
    build(NOTEBOOKS, out)
    monkeypatch.syspath_prepend(str(out))
    monkeypatch.setattr(export, "_ran_cells", {})

    def load():
        for name in [m for m in sys.modules if m == "my_transformer" or m.startswith("my_transformer.")]:
            del sys.modules[name]
        return importlib.import_module("my_transformer")

    yield out, load
    for name in [m for m in sys.modules if m == "my_transformer" or m.startswith("my_transformer.")]:
        del sys.modules[name]


def test_the_learners_package_starts_as_stubs_that_the_checks_reject(learner_package):
    _, load = learner_package
    mine = load()
    assert "from my_transformer.softmax import softmax" in Path(mine.attention.__file__).read_text()
    with pytest.raises(AssertionError, match="not written yet"):
        checks.check_linear(mine.Linear)


def test_a_stuck_learner_continues_with_the_reference_in_one_line(learner_package, capsys):
    out, load = learner_package
    export.export_notebook(out / "01_linear.ipynb", reference=True)
    assert "reference" in capsys.readouterr().out
    import transformer_from_scratch

    assert load().Linear is transformer_from_scratch.Linear
    export.export_notebook(out / "01_linear.ipynb")  # the notebook's export cell, run next: their class is a stub
    assert ("kept the reference you chose: Linear.__init__, Linear.reset_parameters, Linear.forward not "
            "written yet in 01_linear.ipynb") in capsys.readouterr().out
    assert load().Linear is transformer_from_scratch.Linear
    notebook = json.loads((out / "01_linear.ipynb").read_text(encoding="utf-8"))
    guided = {"".join(cell["source"]) for cell in json.loads((REPO / "notebooks" / "01_linear.ipynb").read_text(
        encoding="utf-8"))["cells"] if "".join(cell["source"]).startswith("#| export")}
    for cell in notebook["cells"]:  # the learner writes the class: the guided notebook's, solution markers and all
        if "".join(cell["source"]).startswith("#| export\nclass Linear"):
            cell["source"] = next(source for source in guided if "class Linear" in source)
    (out / "01_linear.ipynb").write_text(json.dumps(notebook), encoding="utf-8")
    export.export_notebook(out / "01_linear.ipynb")  # written: theirs again
    assert load().Linear is not transformer_from_scratch.Linear
    assert "written from 01_linear.ipynb" in capsys.readouterr().out


def test_with_every_module_taken_from_the_reference_every_notebook_imports_what_it_needs(learner_package):
    """A learner stuck in every notebook can still run the next: each `from my_transformer… import …` that a student
    notebook makes (generate's import of notebook 12's KVCache, made inside the function, included) finds its names
    in the modules re-exported from the reference."""
    out, load = learner_package
    for notebook in sorted(out.glob("[0-9][0-9]_*.ipynb")):
        export.export_notebook(notebook, reference=True, quiet=True)
    load()
    imports = set()
    for notebook in sorted(out.glob("[0-9][0-9]_*.ipynb")):
        for cell in _code(notebook):
            python = "\n".join(line for line in cell.splitlines() if not line.lstrip().startswith(("%", "!")))
            imports |= {(node.module, alias.name) for node in ast.walk(ast.parse(python))
                        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("my_transformer")
                        for alias in node.names}
    assert ("my_transformer.kv_cache", "KVCache") in imports
    for module, name in sorted(imports):
        assert hasattr(importlib.import_module(module), name), f"{module} has no {name} once taken from the reference"


def test_the_export_cell_run_before_the_class_is_written_writes_the_stubs(learner_package):
    """A learner may run a notebook's export cell before writing its class: the module gets the stubs, whose errors
    say what to write, and no complaint about names that only the unwritten code defines (count_resources' flops)."""
    out, load = learner_package
    for notebook in sorted(out.glob("[0-9][0-9]_*.ipynb")):
        export.export_notebook(notebook, quiet=True)
    with pytest.raises(NotImplementedError, match="count_resources is not written yet"):
        load().count_resources(256, 64, 32, 2, 4, 96)


def test_reference_mode_is_refused_in_the_guided_notebooks():
    with pytest.raises(export.ExportError, match="student edition"):
        export.export_notebook(NOTEBOOKS[0], reference=True)


def test_a_second_run_keeps_what_the_learner_changed(tmp_path):
    out = tmp_path / "notebooks" / "student"
    build(NOTEBOOKS[:2], out)
    edited = out / NOTEBOOKS[0].name
    notebook = json.loads(edited.read_text(encoding="utf-8"))
    notebook["cells"][-1]["source"] = "my own notes"
    edited.write_text(json.dumps(notebook), encoding="utf-8")
    mine = edited.read_bytes()
    (out / "my_transformer" / "linear.py").write_text("# my Linear\n", encoding="utf-8")

    report = build(NOTEBOOKS[:2], out)
    assert edited.read_bytes() == mine
    assert any(line.startswith(f"{NOTEBOOKS[0].name}: kept") for line in report)
    assert f"{NOTEBOOKS[1].name}: unchanged" in report
    assert (out / "my_transformer" / "linear.py").read_text(encoding="utf-8") == "# my Linear\n"


def test_a_learners_components_are_what_their_later_notebooks_use(learner_package):
    """The learner writes softmax (03) and attention (05): their attention runs on their softmax."""
    out, load = learner_package
    for name in ("03_softmax.ipynb", "05_attention.ipynb"):
        _write_like_the_guided_notebook(out, name)
    mine = load()
    attention_module = importlib.import_module("my_transformer.attention")
    assert attention_module.softmax is importlib.import_module("my_transformer.softmax").softmax
    checks.check_softmax(mine.softmax)
    checks.check_scaled_dot_product_attention(mine.scaled_dot_product_attention)


def _write_like_the_guided_notebook(out: Path, name: str) -> None:
    """Play the learner: fill every stubbed export cell of student notebook ``name`` as the guided one has it."""
    guided = json.loads((REPO / "notebooks" / name).read_text(encoding="utf-8"))
    student = json.loads((out / name).read_text(encoding="utf-8"))
    written = {cell["id"]: cell["source"] for cell in guided["cells"]}
    for cell in student["cells"]:
        if "".join(cell["source"]).startswith("#| export") and "YOUR CODE HERE" in "".join(cell["source"]):
            cell["source"] = written[cell["id"]]
    (out / name).write_text(json.dumps(student), encoding="utf-8")
    export.export_notebook(out / name, quiet=True)


def test_a_stub_in_an_earlier_notebook_is_named_with_the_way_out(learner_package):
    """SwiGLU written, Linear (notebook 01) still a stub: the check says which stub and how to go on."""
    out, load = learner_package
    _write_like_the_guided_notebook(out, "07_swiglu.ipynb")
    with pytest.raises(AssertionError) as verdict:
        checks.check_swiglu(load().SwiGLU)
    first = str(verdict.value).splitlines()[0]
    assert "Linear.__init__ from 01_linear.ipynb, which is still a stub" in first
    assert 'export_notebook("01_linear.ipynb", reference=True)' in first


def test_the_student_notebook_runs_until_the_learners_gate(tmp_path):
    """Executed as a learner would before writing anything, notebook 01 stops at its check, which says why."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    out = tmp_path / "notebooks" / "student"
    build(NOTEBOOKS[:1], out)
    notebook = nbformat.read(out / NOTEBOOKS[0].name, as_version=4)
    client = NotebookClient(notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(out)}})
    with pytest.raises(CellExecutionError) as stopped:
        client.execute()
    failed = next(cell for cell in notebook.cells if cell.cell_type == "code"
                  and any(o.get("output_type") == "error" for o in cell.get("outputs", [])))
    assert "check_apply_weight(apply_weight)" in failed.source, "the first step's check is the first gate"
    assert "AssertionError" in str(stopped.value)
    assert "apply_weight is not written yet: write it here, in 01_linear.ipynb (Build it step by step)" in str(stopped.value)


def test_one_notebook_made_alone_leaves_the_learners_package_whole(learner_package):
    """`make student NB=notebooks/06_rope.ipynb` (a fresh copy of one notebook) keeps every module and export."""
    out, load = learner_package
    (out / "06_rope.ipynb").unlink()
    (out / "my_transformer" / "swiglu.py").unlink()  # a module lost meanwhile comes back as stubs
    report = build([REPO / "notebooks" / "06_rope.ipynb"], out)
    assert "06_rope.ipynb: written" in report
    assert "my_transformer/swiglu.py: written (stubs, from 07_swiglu.ipynb)" in report
    mine = load()
    for name in ("Linear", "Embedding", "softmax", "RMSNorm", "scaled_dot_product_attention",
                 "RotaryPositionalEmbedding", "SwiGLU", "MultiHeadSelfAttention", "TransformerBlock", "TransformerLM",
                 "generate", "set_shape_checks", "shape_checks"):
        assert hasattr(mine, name), f"my_transformer lost {name}"


def test_a_stub_met_from_a_later_notebook_says_where_to_write_it(learner_package):
    _, load = learner_package
    rope = load().RotaryPositionalEmbedding
    with pytest.raises(NotImplementedError) as error:
        rope(10000.0, 16, 32)
    assert str(error.value) == ("RotaryPositionalEmbedding.__init__ is not written yet: write it in 06_rope.ipynb "
                                '(The final class), or continue with the reference: '
                                'export_notebook("06_rope.ipynb", reference=True)')


def test_a_module_exported_as_the_reference_says_so_in_its_header(learner_package):
    out, _ = learner_package
    export.export_notebook(out / "06_rope.ipynb", reference=True, quiet=True)
    first = (out / "my_transformer" / "rope.py").read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# The course's reference, not your code")
    assert 'export_notebook("06_rope.ipynb")' in first
