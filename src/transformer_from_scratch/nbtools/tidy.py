"""Keep saved notebooks clean: ``python -m transformer_from_scratch.nbtools.tidy NB...`` and JupyterLab's saves.

One function, `clean`, decides what a stored notebook must not hold; two callers apply it:

* `tidy` (the command line), which `make notebooks` runs after nbstripout;
* `pre_save_hook`, which `make lab` installs in Jupyter's server (``jupyter_lab_config.py`` beside this
  module), so that saving from JupyterLab (by hand or autosave) writes the same bytes as the repo holds.

Its inverse for opening, `opened`, gives back what the kernel would write at once: `ContentsManager`, the contents
manager `make lab` installs, serves every notebook with ``metadata.language_info.version`` set to the version
of Python the notebook's kernel runs. JupyterLab copies the kernel's ``language_info`` into the notebook as soon
as the kernel starts, and any difference marks the notebook changed: without the version, every notebook would
open with the unsaved-changes dot on its tab, and closing it would ask to save a notebook nobody changed.

What `clean` removes is what a session adds without anyone changing the notebook:

* ``metadata.language_info.version``, the Python version of whoever ran the kernel last;
* ``metadata.widgets``, the live widgets' state, which ipywidgets stores on save;
* the model id in each saved widget view: it is random on every run and no such model exists when
  the notebook is opened again, so JupyterLab would show "Error displaying widget: model not found"
  above the figure. An empty model id makes JupyterLab hide that output instead; viewers without a
  kernel show the output's text fallback. Running the cell displays the live controls as usual;
* the split between consecutive printed (stream) outputs, which the kernel makes wherever it happened
  to flush: they are merged, so that re-running an unchanged notebook changes nothing.

Nothing else moves: cells, sources, outputs and execution counts stay as they are, so a learner's real
change is saved. Files are written exactly as Jupyter's server writes them (``nbformat.writes``: sorted
keys, one-space indent, UTF-8 kept, a final newline), so `tidy` and a save from JupyterLab agree byte for byte.
"""

import os
import sys
from pathlib import Path
from typing import Any

import nbformat
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _text(text: str | list[str]) -> str:
    """A stream's text, stored as one string (in memory, in a browser's save) or as lines (on disk)."""
    return text if isinstance(text, str) else "".join(text)


def clean(notebook: dict[str, Any]) -> dict[str, Any]:
    """Remove what a session adds to ``notebook`` (a notebook dict, changed in place) and return it."""
    metadata = notebook.get("metadata", {})
    if isinstance(metadata.get("language_info"), dict):
        metadata["language_info"].pop("version", None)
    metadata.pop("widgets", None)
    for cell in notebook.get("cells", []):
        if not isinstance(cell.get("outputs"), list):
            continue
        outputs: list[dict[str, Any]] = []
        for output in cell["outputs"]:
            view = output.get("data", {}).get(WIDGET_VIEW)
            if isinstance(view, dict) and "model_id" in view:
                view["model_id"] = ""
            previous = outputs[-1] if outputs else {}
            if output.get("output_type") == "stream" and previous.get("output_type") == "stream" \
                    and previous.get("name") == output.get("name"):
                previous["text"] = _text(previous["text"]) + _text(output["text"])
            else:
                outputs.append(output)
        cell["outputs"] = outputs
    return notebook


def dumps(notebook: dict[str, Any]) -> str:
    """``notebook`` as the text Jupyter's server writes for it (what ``nbformat.write`` puts in a file)."""
    text = nbformat.writes(nbformat.from_dict(notebook), version=nbformat.NO_CONVERT)
    return text if text.endswith("\n") else text + "\n"


def tidy(path: Path) -> bool:
    """Clean the notebook at ``path`` in place (see `clean`); return whether the file changed."""
    text = path.read_text(encoding="utf-8")
    tidied = dumps(clean(nbformat.reads(text, as_version=nbformat.NO_CONVERT)))
    if tidied != text:
        path.write_text(tidied, encoding="utf-8")
    return tidied != text


def pre_save_hook(model: dict[str, Any], path: str = "", contents_manager: Any = None, **kwargs: Any) -> None:
    """Jupyter server's ``ContentsManager.pre_save_hook``: `clean` every notebook before it is written.

    Jupyter calls it as ``hook(model=model, path=path, contents_manager=manager)`` with the model the
    browser sent (``model["content"]`` is the notebook as a dict); other files pass untouched.
    """
    if model.get("type") == "notebook" and isinstance(model.get("content"), dict):
        clean(model["content"])


# What ipykernel reports as ``language_info.version`` (``sys.version.split()[0]``) for a kernel on this interpreter.
PYTHON_VERSION = sys.version.split()[0]
# Kernel commands that Jupyter runs with the server's own interpreter (jupyter_client replaces these by sys.executable).
SAME_PYTHON = {"python", f"python{sys.version_info[0]}", f"python{sys.version_info[0]}.{sys.version_info[1]}"}


def opened(notebook: dict[str, Any], kernel_version: str | None = PYTHON_VERSION) -> dict[str, Any]:
    """Give ``notebook`` (changed in place) back the ``language_info.version`` that `clean` removed: ``kernel_version``,
    the version of Python its kernel reports, so that the kernel's ``language_info`` equals the stored one.

    Nothing happens without a version or where the notebook holds another language or a version already."""
    info = notebook.get("metadata", {}).get("language_info")
    if kernel_version and isinstance(info, dict) and info.get("name") == "python" and "version" not in info:
        info["version"] = kernel_version
    return notebook


class ContentsManager(AsyncLargeFileManager):
    """Jupyter server's default contents manager, which serves every notebook as `opened` makes it.

    The version is this interpreter's when the notebook's kernel runs on it (the usual ``python3`` kernel of
    ``make lab``: jupyter_client starts ``python`` as the server's own interpreter); for any other kernel it is left
    out, as stored. Saving goes through `pre_save_hook`, which takes it out again, so no file ever holds it.
    Only notebooks change: ``/files/`` (a download) and every other file are served byte for byte.
    """

    def kernel_version(self, notebook: dict[str, Any]) -> str | None:
        """The version of Python the kernel of ``notebook`` runs, when it is this interpreter; else None."""
        name = notebook.get("metadata", {}).get("kernelspec", {}).get("name")
        specs = getattr(self.parent, "kernel_spec_manager", None)
        if not name or specs is None:
            return None
        try:
            command = specs.get_kernel_spec(name).argv[0]
        except Exception:  # noqa: BLE001 (no such kernel: JupyterLab will ask which one, and write its own)
            return None
        same = command in SAME_PYTHON or os.path.realpath(command) == os.path.realpath(sys.executable)
        return PYTHON_VERSION if same else None

    async def get(self, path, content=True, type=None, format=None, **kwargs):  # noqa: A002 (the base class's names)
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if model.get("type") == "notebook" and isinstance(model.get("content"), dict):
            opened(model["content"], self.kernel_version(model["content"]))
        return model


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(f"{name}: {'tidied' if tidy(Path(name)) else 'already tidy'}")
