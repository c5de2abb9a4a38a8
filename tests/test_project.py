"""Project-wide rules: the environment files agree, every notebook follows the template and is saved
clean, and the package re-exports what the notebooks build."""

import ast
import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

import transformer_from_scratch

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SECTIONS = ["## Setup", "## Why", "## The maths", "## Build it", "## See it", "## The final class",
            "## Verify", "## Pitfalls", "## Exercises", "## Recap and next"]
MACHINE_PATH = re.compile(r"/home/|/root/|/tmp/|/work/|/Users/|[A-Za-z]:\\\\")
MAX_CELL_LINES = 50  # about a screen


def _requirement(spec: str) -> tuple[str, str]:
    name, version = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(\S*)", spec.strip()).groups()
    return name.lower().replace("_", "-"), version


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = dict(map(_requirement, project["dependencies"] + project["optional-dependencies"]["dev"]))
    environment = yaml.safe_load((REPO / "environment.yml").read_text())
    conda, pip = [], []
    for entry in environment["dependencies"]:
        if isinstance(entry, dict):
            pip += [spec for spec in entry["pip"] if not spec.startswith("-")]
        elif not re.match(r"(python|pip)\b", entry):
            conda.append(entry)
    assert dict(map(_requirement, conda + pip)) == wanted


def test_package_reexports_every_public_name():
    for module in sorted((REPO / "src" / "transformer_from_scratch").glob("*.py")):
        text = module.read_text()
        if not text.startswith("# Generated from notebooks/"):
            continue
        public = [node.name for node in ast.parse(text).body
                  if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and not node.name.startswith("_")]
        for name in public:
            assert name in transformer_from_scratch.__all__, f"{module.name}: {name} is not re-exported"
            assert getattr(transformer_from_scratch, name) is not None


def test_readme_starts_with_the_two_commands():
    first_block = (REPO / "README.md").read_text().split("```")[1]
    assert "make lab" in first_block and "make test" in first_block


def _cells(notebook: Path) -> list[dict]:
    return json.loads(notebook.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"])


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_follows_the_template(notebook):
    cells = _cells(notebook)
    number = notebook.name[:2]
    assert cells[0]["cell_type"] == "markdown" and _source(cells[0]).startswith(f"# {number} · ")
    headings = [line for cell in cells if cell["cell_type"] == "markdown"
                for line in _source(cell).splitlines() if line.startswith("## ")]
    found = [next((i for i, h in enumerate(headings) if h.startswith(s)), None) for s in SECTIONS]
    assert None not in found, f"missing sections: {[s for s, i in zip(SECTIONS, found) if i is None]}"
    assert found == sorted(found), "sections out of the template's order"

    code = [_source(cell) for cell in cells if cell["cell_type"] == "code"]
    assert any(src.startswith("#| export") for src in code)
    module = re.sub(r"^\d\d_", "", notebook.stem)
    assert any(f'export_notebook("{notebook.name}")' in src for src in code)
    assert (REPO / "tests" / f"test_{module}.py").exists(), f"tests/test_{module}.py is missing"

    solutions = [src for src in code if "### BEGIN SOLUTION" in src]
    assert len(solutions) >= 2, "at least two exercises with solutions"
    for src in code:
        assert src.count("### BEGIN SOLUTION") == src.count("### END SOLUTION")
    for cell in cells:
        assert len(_source(cell).splitlines()) <= MAX_CELL_LINES, f"cell {cell.get('id')} is longer than a screen"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_saved_clean(notebook):
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    assert "version" not in nb["metadata"].get("language_info", {}) and "widgets" not in nb["metadata"]
    assert not MACHINE_PATH.search(notebook.read_text(encoding="utf-8")), "a machine-specific path is stored"
    code = [cell for cell in nb["cells"] if cell["cell_type"] == "code"]
    assert any(cell["outputs"] for cell in code), "saved without outputs: run `make notebooks`"
    # nbval needs execution counts; 1, 2, 3 … in order proves one clean top-to-bottom run.
    counts = [cell["execution_count"] for cell in code]
    assert counts == list(range(1, len(code) + 1)), "not saved from one clean run: run `make notebooks NB=...`"
    for cell in code:
        for output in cell["outputs"]:
            assert output["output_type"] != "error", f"cell {cell['id']} stored an error"
            assert output.get("name") != "stderr", f"cell {cell['id']} wrote to stderr (a warning?)"
            assert output.get("execution_count", cell["execution_count"]) == cell["execution_count"]
            view = output.get("data", {}).get("application/vnd.jupyter.widget-view+json")
            assert view is None or view["model_id"] == "", "a stale widget id: run `make notebooks NB=...`"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_images_exist(notebook):
    for cell in _cells(notebook):
        if cell["cell_type"] != "markdown":
            continue
        text = _source(cell)
        for ref in re.findall(r"!\[[^\]]*\]\(([^)\s]+)", text) + re.findall(r'<img[^>]+src="([^"]+)"', text):
            assert not ref.startswith(("http:", "https:")), f"{ref}: the project draws its own images"
            assert (notebook.parent / ref).exists(), f"{ref} does not exist"
