"""One helper for the notebooks: controls above a figure that redraws when they move.

Why not ``ipywidgets.interact``? ``interact`` draws into an Output widget, so a notebook
executed without a browser (nbval in CI, nbconvert, a notebook rendered on the web) stores
no figure at all. ``interactive_figure`` displays the default figure as an ordinary cell
output and, when a control moves in JupyterLab, replaces that output in place. Where no
kernel runs (a notebook viewed on the web), the controls show as a one-line text instead.
"""

from __future__ import annotations

from typing import Callable

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display
from matplotlib.figure import Figure


def interactive_figure(draw: Callable[..., Figure], **controls: widgets.ValueWidget) -> None:
    """Show ``controls`` and the figure ``draw(**{name: control.value})``; redraw on every change.

    ``draw`` builds and returns a new matplotlib Figure from the controls' values (keyword
    arguments named like the controls). Sliders are set to update on release, so dragging
    does not queue dozens of redraws.

    Example::

        interactive_figure(plot_histogram, scale=widgets.FloatLogSlider(value=1.0, min=-1, max=1))
    """
    if not controls:
        raise ValueError("interactive_figure needs at least one control, e.g. scale=FloatSlider(...)")
    for control in controls.values():
        if hasattr(control, "continuous_update"):
            control.continuous_update = False

    def current_figure() -> Figure:
        figure = draw(**{name: control.value for name, control in controls.items()})
        plt.close(figure)  # the inline backend must not show it a second time
        return figure

    box = widgets.HBox(list(controls.values()))
    bundle = box._repr_mimebundle_()  # the live widget, plus a text fallback for viewers without a kernel
    labels = [getattr(control, "description", "") or name for name, control in controls.items()]
    bundle["text/plain"] = f"[controls: {', '.join(labels)}; run the notebook to move them]"
    display(bundle, raw=True)
    handle = display(current_figure(), display_id=True)

    def redraw(_change) -> None:
        handle.update(current_figure())

    for control in controls.values():
        control.observe(redraw, names="value")
