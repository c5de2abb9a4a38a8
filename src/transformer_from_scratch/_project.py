"""Where the project is and what its exported modules say of themselves: shared by the tooling and the checks.

Standard library only, and nothing of the model imports it: ``nbtools`` (the export, the student edition, the site)
and ``benchmark`` find the repository with ``repo_root()``; the export writes a module's first line from the header
formats below, and the learner checks read it back (``learner_notebook``) to tell a stub in an earlier notebook's
module from one in the cell being checked.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = "transformer_from_scratch"
PACKAGE_DIR = Path(__file__).resolve().parent

# The first line of a module the export writes, one format per kind of module ({notebook}: e.g. 01_linear.ipynb).
GENERATED_HEADER = "# Generated from notebooks/{notebook} by `make export`: edit the notebook, not this file."
LEARNER_HEADER = "# Written from your {notebook} by its export cell: edit the notebook, not this file."
REFERENCE_HEADER = ("# The course's reference, not your code: chosen with export_notebook(\"{notebook}\", reference=True) "
                    "in {notebook}; once yours is written, run export_notebook(\"{notebook}\") there to use it.")
# What every header starts with, before the notebook's name: how a module of each kind is recognised.
GENERATED_PREFIX = GENERATED_HEADER.partition("{notebook}")[0]
LEARNER_PREFIX = LEARNER_HEADER.partition("{notebook}")[0]
REFERENCE_PREFIX = REFERENCE_HEADER.partition(":")[0]


def _parser(header: str) -> re.Pattern[str]:
    """The header format as a regular expression that captures the notebook's name."""
    before, _, after = header.partition("{notebook}")
    return re.compile(re.escape(before) + r"(?P<notebook>\S+\.ipynb)" + re.escape(after))


_GENERATED = _parser(GENERATED_HEADER)
_LEARNER = _parser(LEARNER_HEADER)


def generated_from(text: str) -> str | None:
    """The notebook that ``make export`` generated this module text from (``01_linear.ipynb``), or None."""
    match = _GENERATED.match(text)
    return match["notebook"] if match else None


def learner_notebook(text: str) -> str | None:
    """The learner's notebook whose export cell wrote this module text (``01_linear.ipynb``), or None."""
    match = _LEARNER.match(text)
    return match["notebook"] if match else None


def repo_root(start: str | Path | None = None) -> Path:
    """The repository: the nearest folder at or above ``start`` (default: this package) that holds pyproject.toml.

    Works from a checkout and from an editable install of it (the package stays in the checkout's ``src/``). Raises
    ``FileNotFoundError`` naming where it looked when there is none, as for a package installed without its
    repository.
    """
    here = Path(PACKAGE_DIR if start is None else start).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file():
            return folder
    raise FileNotFoundError(
        f"no pyproject.toml in {here} or any folder above it: this needs the course's repository (a git clone, "
        f"installed with pip install -e .), not a copy of the {PACKAGE} package on its own")
