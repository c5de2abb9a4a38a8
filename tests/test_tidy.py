"""tidy: saved widget outputs lose their stale model ids, split printed outputs are merged, a session's
metadata goes; nothing else moves. The command line and JupyterLab's pre-save hook write the same bytes."""

import copy
import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from transformer_from_scratch._project import repo_root
from transformer_from_scratch.nbtools.tidy import WIDGET_VIEW, clean, dumps, pre_save_hook, tidy

NOTEBOOKS = sorted((repo_root() / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _session_notebook() -> dict:
    """A notebook as a session leaves it: split streams, a live widget id, the kernel's version, widget state."""
    widget = new_output("display_data", data={
        WIDGET_VIEW: {"model_id": "0a6b06c4", "version_major": 2, "version_minor": 0},
        "text/plain": "[controls: scale]"})
    outputs = [
        new_output("stream", name="stdout", text="a\n"),
        new_output("stream", name="stdout", text="b\nc\n"),
        new_output("stream", name="stderr", text="warning\n"),
        widget,
        new_output("stream", name="stdout", text="d\n"),
    ]
    notebook = new_notebook(cells=[new_code_cell("print('a')", id="c1", execution_count=1, outputs=outputs),
                                   new_markdown_cell("# title", id="m1")])
    notebook.metadata.language_info = {"name": "python", "version": "3.11.7"}
    notebook.metadata.widgets = {"application/vnd.jupyter.widget-state+json": {"state": {"0a6b06c4": {}}}}
    return json.loads(json.dumps(notebook))  # a plain dict, as a browser's save arrives


def test_tidy_blanks_widget_ids_merges_streams_and_is_idempotent(tmp_path):
    path = tmp_path / "01_demo.ipynb"
    path.write_text(nbformat.writes(nbformat.from_dict(_session_notebook())) + "\n")

    assert tidy(path) is True
    notebook = json.loads(path.read_text())
    tidied = notebook["cells"][0]["outputs"]
    assert [(o["output_type"], o.get("name")) for o in tidied] == [
        ("stream", "stdout"), ("stream", "stderr"), ("display_data", None), ("stream", "stdout")]
    assert tidied[0]["text"] == ["a\n", "b\n", "c\n"]
    assert tidied[2]["data"][WIDGET_VIEW]["model_id"] == ""
    assert tidied[2]["data"]["text/plain"] == ["[controls: scale]"]
    assert notebook["metadata"] == {"language_info": {"name": "python"}}
    assert notebook["cells"][0]["source"] == ["print('a')"] and notebook["cells"][0]["execution_count"] == 1
    assert tidy(path) is False


def test_pre_save_hook_writes_what_tidy_writes(tmp_path):
    """A browser's save (sources and texts as strings) ends as the same bytes as `tidy` on the same notebook."""
    path = tmp_path / "01_demo.ipynb"
    path.write_text(nbformat.writes(nbformat.from_dict(_session_notebook())) + "\n")
    tidy(path)
    model = {"type": "notebook", "format": "json", "content": _session_notebook()}
    pre_save_hook(model=model, path="notebooks/01_demo.ipynb", contents_manager=None)
    assert dumps(model["content"]) == path.read_text()


def test_pre_save_hook_keeps_a_learners_change_and_leaves_other_files_alone():
    notebook = _session_notebook()
    notebook["cells"][0]["source"] = "print('my own change')"
    notebook["cells"][0]["execution_count"] = 7
    model = {"type": "notebook", "format": "json", "content": notebook}
    pre_save_hook(model=model, path="notebooks/01_demo.ipynb", contents_manager=None)
    cell = model["content"]["cells"][0]
    assert cell["source"] == "print('my own change')" and cell["execution_count"] == 7
    assert len(cell["outputs"]) == 4 and model["content"]["cells"][1]["source"] == "# title"

    other = {"type": "file", "format": "text", "content": json.dumps(_session_notebook())}
    untouched = copy.deepcopy(other)
    pre_save_hook(model=other, path="notes/saved.json", contents_manager=None)
    assert other == untouched


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_as_a_lab_save_writes_it(notebook):
    """Byte for byte what Jupyter's server writes after the hook, so a save from JupyterLab changes nothing."""
    text = notebook.read_text(encoding="utf-8")
    assert dumps(clean(nbformat.reads(text, as_version=nbformat.NO_CONVERT))) == text, \
        f"run `make notebooks NB={notebook.relative_to(notebook.parents[1])}`"
