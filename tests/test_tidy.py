"""tidy: saved widget outputs lose their stale model ids, split printed outputs are merged, nothing else moves."""

import json

from transformer_from_scratch.tidy import WIDGET_VIEW, tidy


def test_tidy_blanks_widget_ids_merges_streams_and_is_idempotent(tmp_path):
    widget = {"output_type": "display_data", "metadata": {},
              "data": {WIDGET_VIEW: {"model_id": "0a6b06c4", "version_major": 2, "version_minor": 0},
                       "text/plain": ["[controls: scale]"]}}
    outputs = [
        {"output_type": "stream", "name": "stdout", "text": ["a\n"]},
        {"output_type": "stream", "name": "stdout", "text": ["b\n", "c\n"]},
        {"output_type": "stream", "name": "stderr", "text": ["warning\n"]},
        widget,
        {"output_type": "stream", "name": "stdout", "text": ["d\n"]},
    ]
    notebook = {"cells": [{"cell_type": "code", "outputs": outputs, "source": []},
                          {"cell_type": "markdown", "source": ["# title"]}],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "01_demo.ipynb"
    path.write_text(json.dumps(notebook, indent=1) + "\n")

    assert tidy(path) is True
    tidied = json.loads(path.read_text())["cells"][0]["outputs"]
    assert [(o["output_type"], o.get("name")) for o in tidied] == [
        ("stream", "stdout"), ("stream", "stderr"), ("display_data", None), ("stream", "stdout")]
    assert tidied[0]["text"] == ["a\n", "b\n", "c\n"]
    assert tidied[2]["data"][WIDGET_VIEW]["model_id"] == ""
    assert tidied[2]["data"]["text/plain"] == ["[controls: scale]"]
    assert tidy(path) is False
