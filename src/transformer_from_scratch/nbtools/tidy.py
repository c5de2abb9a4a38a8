"""Tidy executed notebooks before they are committed: ``python -m transformer_from_scratch.tidy NB...``.

`make notebooks` runs it after nbstripout. A saved output that shows a widget refers to the widget's
model by a random id, which changes on every run (noise in every diff) and does not exist when the
notebook is opened again, so JupyterLab would show "Error displaying widget: model not found" above
the figure. An empty model id makes JupyterLab hide that output instead; viewers without a kernel
show the output's text fallback. Running the cell displays the live controls as usual.

It also merges consecutive printed (stream) outputs, which the kernel splits wherever it happened to
flush, so that re-running an unchanged notebook changes nothing.
"""

import json
import sys
from pathlib import Path

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def tidy(path: Path) -> bool:
    """Blank widget model ids and merge split stream outputs in ``path``; return whether it changed."""
    text = path.read_text(encoding="utf-8")
    notebook = json.loads(text)
    for cell in notebook["cells"]:
        outputs = []
        for output in cell.get("outputs", []):
            view = output.get("data", {}).get(WIDGET_VIEW)
            if view is not None:
                view["model_id"] = ""
            previous = outputs[-1] if outputs else {}
            if output["output_type"] == "stream" and previous.get("output_type") == "stream" \
                    and previous["name"] == output["name"]:
                previous["text"] = "".join(previous["text"] + output["text"]).splitlines(keepends=True)
            else:
                outputs.append(output)
        if "outputs" in cell:
            cell["outputs"] = outputs
    tidied = json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"
    if tidied != text:
        path.write_text(tidied, encoding="utf-8")
    return tidied != text


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(f"{name}: {'tidied' if tidy(Path(name)) else 'already tidy'}")
