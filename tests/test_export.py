"""The notebook -> package export: deterministic, idempotent, checked, and never destroys a hand edit."""

import importlib.util
import json
import re
from pathlib import Path

import nbformat
import pytest
from jupyter_client.manager import start_new_kernel

from transformer_from_scratch import _project
from transformer_from_scratch._project import repo_root
from transformer_from_scratch.checks import _harness
from transformer_from_scratch.nbtools import export
from transformer_from_scratch.nbtools.export import ExportError, check_notebook, export_notebook, module_name

REPO = repo_root()
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def make_repo(root: Path, cells: list[tuple[str, str]]) -> Path:
    """A miniature repo: its pyproject.toml, notebooks/01_demo.ipynb with the given cells, and an empty package folder."""
    (root / "src" / "transformer_from_scratch").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (root / "notebooks").mkdir()
    nb = nbformat.v4.new_notebook()
    for i, (kind, source) in enumerate(cells):
        cell = nbformat.v4.new_markdown_cell(source) if kind == "md" else nbformat.v4.new_code_cell(source)
        cell["id"] = f"cell-{i}"
        nb.cells.append(cell)
    path = root / "notebooks" / "01_demo.ipynb"
    nbformat.write(nb, path)
    return path


DEMO = [
    ("md", "# Demo"),
    ("code", "scratch = 1  # not exported"),
    ("code", "#| export\nimport math"),
    ("code", "print('a cell that only demonstrates')"),
    ("code", "#| export\ndef double(x):\n    return 2 * x"),
]


@pytest.fixture
def demo(tmp_path, monkeypatch):
    monkeypatch.setattr(export, "_ran_cells", {})
    notebook = make_repo(tmp_path, DEMO)
    return notebook, tmp_path / "src" / "transformer_from_scratch" / "demo.py"


def edit_cell(notebook: Path, index: int, source: str) -> None:
    nb = json.loads(notebook.read_text())
    nb["cells"][index]["source"] = source
    notebook.write_text(json.dumps(nb))


def test_module_name_comes_from_the_notebook_name():
    assert module_name(Path("notebooks/08_multihead_attention.ipynb")) == "multihead_attention"
    for bad in ["linear.ipynb", "1_linear.ipynb", "01-linear.ipynb", "01_Linear.ipynb"]:
        with pytest.raises(ExportError, match="two digits"):
            module_name(Path(bad))


def test_export_writes_the_marked_cells_in_order_under_a_header(demo):
    notebook, module = demo
    export_notebook(notebook)
    text = module.read_text()
    assert text.startswith("# Generated from notebooks/01_demo.ipynb")
    assert "#| export" not in text and "scratch" not in text and "demonstrates" not in text
    assert text.index("import math") < text.index("def double")
    namespace = {}
    exec(compile(text, str(module), "exec"), namespace)
    assert namespace["double"](21) == 42


def test_solution_markers_stay_in_the_notebook_not_in_the_module(tmp_path, monkeypatch):
    monkeypatch.setattr(export, "_ran_cells", {})
    body = "#| export\ndef double(x):\n    \"\"\"Twice x.\"\"\"\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"
    notebook = make_repo(tmp_path, [("code", body)])
    export_notebook(notebook, quiet=True)
    text = (tmp_path / "src" / "transformer_from_scratch" / "demo.py").read_text()
    assert "SOLUTION" not in text
    assert '    """Twice x."""\n    return 2 * x\n' in text


def test_a_student_notebook_writes_to_the_learners_package(tmp_path, monkeypatch):
    """Beside a my_transformer/ package (the student edition), the export never goes to src/."""
    monkeypatch.setattr(export, "_ran_cells", {})
    notebook = make_repo(tmp_path, DEMO)
    student = notebook.parent / "student"
    (student / "my_transformer").mkdir(parents=True)
    (student / "my_transformer" / "__init__.py").write_text("")
    (student / notebook.name).write_bytes(notebook.read_bytes())
    export_notebook(student / notebook.name, quiet=True)
    assert not (tmp_path / "src" / "transformer_from_scratch" / "demo.py").exists()
    text = (student / "my_transformer" / "demo.py").read_text()
    assert text.startswith("# Written from your 01_demo.ipynb") and "def double" in text


def test_export_is_idempotent(demo, capsys):
    notebook, module = demo
    export_notebook(notebook)
    first = module.read_bytes()
    export_notebook(notebook)
    assert module.read_bytes() == first
    assert capsys.readouterr().out.splitlines()[-1] == "src/transformer_from_scratch/demo.py: unchanged from 01_demo.ipynb"


def test_export_is_deterministic_across_checkouts(tmp_path, monkeypatch):
    monkeypatch.setattr(export, "_ran_cells", {})
    texts = []
    for name in ("one", "two"):
        notebook = make_repo(tmp_path / name, DEMO)
        export_notebook(notebook, quiet=True)
        texts.append((tmp_path / name / "src" / "transformer_from_scratch" / "demo.py").read_bytes())
    assert texts[0] == texts[1]


def test_check_passes_after_export_and_names_the_module_when_stale(demo):
    notebook, module = demo
    with pytest.raises(ExportError, match=r"demo\.py is missing"):
        check_notebook(notebook)
    export_notebook(notebook, quiet=True)
    check_notebook(notebook)
    edit_cell(notebook, 4, "#| export\ndef double(x):\n    return x + x")
    with pytest.raises(ExportError, match=r"src/transformer_from_scratch/demo\.py is out of date with 01_demo\.ipynb"):
        check_notebook(notebook)


def test_a_hand_edit_is_never_overwritten(demo):
    notebook, module = demo
    export_notebook(notebook, quiet=True)
    edited = module.read_text().replace("return 2 * x", "return 2 * x  # my fix")
    module.write_text(edited)
    edit_cell(notebook, 4, "#| export\ndef double(x):\n    return x + x")

    with pytest.raises(ExportError) as refused:
        export_notebook(notebook)
    message = str(refused.value)
    assert "demo.py was edited by hand" in message
    assert "To keep your edit" in message and "To discard your edit" in message and "--force" in message
    command = re.search(r"python -m ([\w.]+)", message)
    assert command and importlib.util.find_spec(command[1]) is not None, "the message names a module that exists"
    assert module.read_text() == edited
    with pytest.raises(ExportError, match="edited by hand"):
        check_notebook(notebook)


def test_force_replaces_a_hand_edit_and_keeps_a_backup(demo):
    notebook, module = demo
    export_notebook(notebook, quiet=True)
    edited = module.read_text() + "\nEXTRA = 1\n"
    module.write_text(edited)
    export_notebook(notebook, force=True, quiet=True)
    assert "EXTRA" not in module.read_text()
    assert module.with_name("demo.py.bak").read_text() == edited


def test_a_module_without_header_counts_as_hand_written(demo):
    notebook, module = demo
    module.write_text("def double(x):\n    return 2 * x\n")
    with pytest.raises(ExportError, match="edited by hand"):
        export_notebook(notebook)


def test_cells_that_do_not_compile_are_refused(demo):
    notebook, module = demo
    export_notebook(notebook, quiet=True)
    before = module.read_text()
    edit_cell(notebook, 4, "#| export\ndef double(x)\n    return 2 * x")
    with pytest.raises(ExportError, match="do not compile"):
        export_notebook(notebook)
    assert module.read_text() == before


def test_a_step_left_outside_the_export_cells_is_named_before_a_later_notebook_meets_it(demo):
    """The class calls a helper from a cell that is not exported: fine in its notebook, NameError in the next."""
    notebook, module = demo
    export_notebook(notebook, quiet=True)
    before = module.read_text()
    edit_cell(notebook, 1, "def halve(x):\n    return x / 2")
    edit_cell(notebook, 4, "#| export\nclass Twice:\n    def __call__(self, x):\n        return 4 * halve(x) + math.pi * 0")
    with pytest.raises(ExportError, match=r"use halve, defined in no '#\| export' cell") as error:
        export_notebook(notebook)
    assert "Move the definition into an '#| export' cell" in str(error.value)
    assert module.read_text() == before
    edit_cell(notebook, 4, "#| export\ndef halve(x):\n    return x / 2\n\nclass Twice:\n"
                           "    def __call__(self, x):\n        return 4 * halve(x)")
    export_notebook(notebook, quiet=True)
    assert "def halve" in module.read_text()


@pytest.mark.parametrize("source, names", [
    ("import math\nclass A:\n    size = LIMIT\n    def f(self, x: Tensor):\n        return math.sqrt(x) + helper(x)", ["LIMIT", "Tensor", "helper"]),
    ("def f(x):\n    y = [i for i in range(x)]\n    return sum(y), len(y), isinstance(x, int)", []),
    ("def f(x):\n    def g():\n        return x + TOP\n    return g\nTOP = 1", []),
])
def test_undefined_names_are_the_free_globals(source, names):
    assert export.undefined_names(source) == names


def test_a_notebook_without_export_cells_is_an_error(tmp_path):
    notebook = make_repo(tmp_path, [("code", "x = 1")])
    with pytest.raises(ExportError, match="nothing to export"):
        export_notebook(notebook)


def test_cli_check_fails_naming_the_module(demo, capsys):
    notebook, _ = demo
    assert export.main([str(notebook)]) == 0
    edit_cell(notebook, 2, "#| export\nimport math\nimport os")
    assert export.main(["--check", str(notebook)]) == 1
    assert "demo.py is out of date" in capsys.readouterr().err


def test_what_a_kernel_ran_wins_over_the_saved_notebook(demo):
    """Run a cell in a real kernel, as JupyterLab does (with its cell id), and export without saving; the extension
    defines export_notebook (a stub's error tells the learner to call it, wherever it is met)."""
    notebook, module = demo
    kernel_manager, client = start_new_kernel(kernel_name="python3", cwd=str(notebook.parent))
    try:

        def run(code: str, cell_id: str | None = None) -> None:
            content = {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                       "allow_stdin": False, "stop_on_error": True}
            message = client.session.msg("execute_request", content, metadata={"cellId": cell_id} if cell_id else {})
            client.shell_channel.send(message)
            reply = client.get_shell_msg(timeout=60)
            while reply["parent_header"].get("msg_id") != message["header"]["msg_id"]:
                reply = client.get_shell_msg(timeout=60)  # skip stale replies (e.g. start-up kernel_info)
            assert reply["content"]["status"] == "ok", reply["content"]

        run("%load_ext transformer_from_scratch.nbtools.export")
        run("#| export\ndef double(x):\n    return x * 2  # edited, run, not saved", cell_id="cell-4")
        run("export_notebook('01_demo.ipynb')")
    finally:
        client.stop_channels()
        kernel_manager.shutdown_kernel(now=True)
    assert "return x * 2  # edited, run, not saved" in module.read_text()
    assert "return 2 * x" not in module.read_text()


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_package_matches_the_notebooks(notebook):
    """`make test` fails, naming the module, when src/ differs from what the notebooks export."""
    check_notebook(notebook)


def test_the_repository_is_the_folder_that_holds_pyproject_toml(tmp_path):
    assert (REPO / "pyproject.toml").is_file() and (REPO / "src" / "transformer_from_scratch").is_dir()
    assert REPO == Path(__file__).resolve().parents[1]
    assert repo_root(REPO / "src" / "transformer_from_scratch" / "checks" / "_harness.py") == REPO
    notebook = make_repo(tmp_path / "course", DEMO)
    assert repo_root(notebook) == repo_root(notebook.parent) == tmp_path / "course"
    with pytest.raises(FileNotFoundError, match=r"no pyproject\.toml in .*outside.* or any folder above it"):
        repo_root(tmp_path / "outside")


def test_a_notebook_outside_any_repository_cannot_be_exported(tmp_path):
    notebook = make_repo(tmp_path, DEMO)
    (tmp_path / "pyproject.toml").unlink()
    with pytest.raises(ExportError, match="no pyproject.toml"):
        export_notebook(notebook, quiet=True)


@pytest.mark.parametrize("student", [False, True], ids=["make export", "the learner's export cell"])
def test_the_header_the_export_writes_is_the_one_the_checks_read(tmp_path, monkeypatch, student):
    """One format per header (transformer_from_scratch._project): the export writes it, and the checks' stub verdict
    (which asks whether a stub lies in an earlier notebook's module of the learner's) and make student read it."""
    monkeypatch.setattr(export, "_ran_cells", {})
    notebook = make_repo(tmp_path, DEMO)
    if student:
        (notebook.parent / "student" / "my_transformer").mkdir(parents=True)
        (notebook.parent / "student" / "my_transformer" / "__init__.py").write_text("")
        (notebook.parent / "student" / notebook.name).write_bytes(notebook.read_bytes())
        notebook = notebook.parent / "student" / notebook.name
    export_notebook(notebook, quiet=True)
    text = export.module_path(notebook).read_text()
    header = (_project.LEARNER_HEADER if student else _project.GENERATED_HEADER).format(notebook="01_demo.ipynb")
    assert text.splitlines()[0] == header
    assert _project.learner_notebook(text) == ("01_demo.ipynb" if student else None)
    assert _project.generated_from(text) == (None if student else "01_demo.ipynb")


def test_a_stub_in_a_module_the_learners_export_wrote_is_named_by_the_checks(tmp_path, monkeypatch):
    """The other half of the header's round trip: a check that meets a stub in the learner's package (an earlier
    notebook not written yet) names that notebook, from the header the export wrote."""
    monkeypatch.setattr(export, "_ran_cells", {})
    notebook = make_repo(tmp_path, [("code", "#| export\ndef double(x):\n    raise NotImplementedError()")])
    student = notebook.parent / "student"
    (student / "my_transformer").mkdir(parents=True)
    (student / "my_transformer" / "__init__.py").write_text("")
    (student / notebook.name).write_bytes(notebook.read_bytes())
    export_notebook(student / notebook.name, quiet=True)
    module = student / "my_transformer" / "demo.py"
    namespace: dict = {}
    exec(compile(module.read_text(), str(module), "exec"), namespace)
    with pytest.raises(AssertionError) as error:
        _harness.call("quadruple(2)", lambda x: 2 * namespace["double"](x), 2)
    assert str(error.value).startswith("quadruple(2) is not written yet: it uses your double from 01_demo.ipynb, which "
                                       "is still a stub: write it in 01_demo.ipynb and run its export cell"), error.value
