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
from transformer_from_scratch import checks
from transformer_from_scratch._project import generated_from, repo_root

REPO = repo_root()
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# The H2 headings of every notebook, in order: exactly these (the "Why" one names the component).
SECTIONS = ["## Setup", "## Why ", "## The maths", "## Build it step by step", "## See it", "## The final class",
            "## Verify", "## Pitfalls", "## Exercises", "## Recap and next"]
# A Windows drive letter stands alone before its backslash (C:\Users); the "s:" of "blocks:\n" in a title is not one.
MACHINE_PATH = re.compile(r"/home/|/root/|/tmp/|/work/|/Users/|(?<![A-Za-z])[A-Za-z]:\\\\")
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


# transformer_from_scratch.chat is the terminal chat (`make chat`, python -m transformer_from_scratch.chat): the name
# belongs to that module, so notebook 14's function stays transformer_from_scratch.pretrained.chat.
NOT_REEXPORTED = {("pretrained", "chat")}


def test_package_reexports_every_public_name():
    for module in sorted((REPO / "src" / "transformer_from_scratch").glob("*.py")):
        text = module.read_text()
        if not generated_from(text):
            continue
        public = [node.name for node in ast.parse(text).body
                  if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and not node.name.startswith("_")]
        for name in public:
            if (module.stem, name) in NOT_REEXPORTED:
                continue
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
    assert len(headings) == len(SECTIONS), f"the H2 headings are exactly the template's: {headings}"
    for heading, expected in zip(headings, SECTIONS):
        assert heading == expected or (expected == "## Why " and heading.startswith(expected) and heading.endswith("?")), \
            f"{heading!r} where the template has {expected.strip()!r}"

    code = [_source(cell) for cell in cells if cell["cell_type"] == "code"]
    assert any(src.startswith("#| export") for src in code)
    module = re.sub(r"^\d\d_", "", notebook.stem)
    assert any(f'export_notebook("{notebook.name}")' in src for src in code)
    assert (REPO / "tests" / f"test_{module}.py").exists(), f"tests/test_{module}.py is missing"

    solutions = [src for src in code if "### BEGIN SOLUTION" in src and not src.startswith("#| export")]
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
            # A progress bar saved as a widget shows as an empty box on the web and in the decks: load with
            # nbtools.helpers.quiet_transformers() (or tqdm's disable=True).
            shown = "".join(output.get("data", {}).get("text/plain", ""))
            assert view is None or not re.search(r"\d+%\|", shown), f"cell {cell['id']} saved a progress bar: {shown!r}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_images_exist(notebook):
    for cell in _cells(notebook):
        if cell["cell_type"] != "markdown":
            continue
        text = _source(cell)
        for ref in re.findall(r"!\[[^\]]*\]\(([^)\s]+)", text) + re.findall(r'<img[^>]+src="([^"]+)"', text):
            assert not ref.startswith(("http:", "https:")), f"{ref}: the project draws its own images"
            assert (notebook.parent / ref).exists(), f"{ref} does not exist"


def _section(cells: list[dict], heading: str) -> list[dict]:
    """The cells from the H2 starting with ``heading`` up to the next H2."""
    start = next(i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                 and any(line.startswith(heading) for line in _source(c).splitlines()))
    end = next((i for i in range(start + 1, len(cells)) if cells[i]["cell_type"] == "markdown"
                and any(line.startswith("## ") for line in _source(cells[i]).splitlines())), len(cells))
    return cells[start:end]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_a_workshop(notebook):
    """Objectives up front; the final class is a stub-able solution with hints and its learner check;
    every exercise has a difficulty, a time and hints."""
    cells = _cells(notebook)
    intro = _source(cells[0])
    assert "**By the end of this notebook you can:**" in intro
    objectives = [line for line in intro.split("**By the end of this notebook you can:**")[1].splitlines()
                  if line.startswith(("* ", "- "))]
    assert 2 <= len(objectives) <= 3, "two or three learning objectives"

    final = _section(cells, "## The final class")
    final_md = "\n".join(_source(c) for c in final if c["cell_type"] == "markdown")
    final_code = [_source(c) for c in final if c["cell_type"] == "code"]
    assert "**Your turn**" in final_md and "★" in final_md and "min" in final_md
    assert any(src.startswith("#| export") and "### BEGIN SOLUTION" in src for src in final_code), \
        "the body of the final class sits between solution markers, so the student edition blanks it"
    assert "<details>" in final_md, "hints for the final class"
    calls = [name for src in final_code for name in re.findall(r"^(check_\w+)\(", src, re.MULTILINE)]
    assert calls and all(hasattr(checks, name) for name in calls), "the final class is followed by its check"
    export_at = next(i for i, src in enumerate(final_code) if "export_notebook(" in src)
    check_at = next(i for i, src in enumerate(final_code) if re.search(r"^check_\w+\(", src, re.MULTILINE))
    assert check_at < export_at, "the check gates the export"

    exercises = _section(cells, "## Exercises")
    prompts = [c for c in exercises if c["cell_type"] == "markdown" and re.match(r"\*\*\d\.", _source(c))]
    assert len(prompts) >= 2
    for cell in prompts:
        text = _source(cell)
        assert re.search(r"★[★☆]{2}", text) and re.search(r"\d+ min", text), f"difficulty and time: {text[:60]}"
        assert "<details>" in text, f"hints: {text[:60]}"
    for cell in cells:
        text = _source(cell)
        assert text.count("<details>") == text.count("</details>") == text.count("<summary>")
