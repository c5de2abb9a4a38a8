"""One helper for the notebooks: controls above a figure that redraws when they move.

Why not ``ipywidgets.interact``? ``interact`` draws into an Output widget, so a notebook
executed without a browser (nbval in CI, nbconvert, a notebook rendered on the web) stores
no figure at all. ``interactive_figure`` displays the default figure as an ordinary cell
output and, when a control moves in JupyterLab, replaces that output in place. Where no
kernel runs (a notebook viewed on the web), the controls show as a one-line text instead.

``states`` are a few settings of the controls worth seeing, each with the sentence that says what
changed. They are drawn once, when the cell runs, into one folded block under the figure
(``<details>``: the notebook and its web page keep it closed). A deck has no kernel to move a
control: it steps through these states instead, one key press each, with their sentences
(``nbtools.slides``).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.core.pylabtools import print_figure
from IPython.display import display
from matplotlib.figure import Figure

STATES = "states"  # output.metadata["course"]["states"]: each preset state's values and sentence, in order
STATES_SUMMARY = "The figure at {n} other settings (a deck steps through them)"

State = tuple[Mapping[str, object], str]


def _allowed(name: str, control: widgets.ValueWidget, value: object) -> None:
    """Raise a ValueError naming the control when ``value`` is not one it can take."""
    options = getattr(control, "_options_values", None)
    if options is not None:
        if value not in options:
            raise ValueError(f"state {name}={value!r}: not one of the control's options {list(options)}")
        return
    low, high = getattr(control, "min", None), getattr(control, "max", None)
    if low is None or high is None:
        return
    if isinstance(control, widgets.FloatLogSlider):
        low, high = control.base**low, control.base**high
    if not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"state {name}={value!r}: outside the control's range [{low:g}, {high:g}]")


def _check_states(states: Sequence[State], controls: Mapping[str, widgets.ValueWidget]) -> None:
    for state in states:
        if not (isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], Mapping)
                and isinstance(state[1], str) and state[1].strip()):
            raise ValueError(f"each state is (values, sentence), e.g. ({{'scale': 2.0}}, 'Twice as wide: ...'); "
                             f"got {state!r}")
        values, _ = state
        unknown = sorted(set(values) - set(controls))
        if unknown:
            raise ValueError(f"state {dict(values)!r} names {unknown}, which are not controls ({sorted(controls)})")
        for name, value in values.items():
            _allowed(name, controls[name], value)


def states_bundle(figures: Sequence[Figure], states: Sequence[State]) -> tuple[dict, dict]:
    """The folded block of the preset states: (mime bundle, metadata). The PNGs sit in the HTML, in order; the
    metadata holds each state's values and sentence (nbval compares neither PNGs nor metadata)."""
    parts = []
    for figure, (values, sentence) in zip(figures, states):
        png = print_figure(figure, "png", base64=True)
        text = html.escape(sentence)
        parts.append(f'<figure class="course-state"><img src="data:image/png;base64,{png}" alt="{text}">'
                     f"<figcaption>{text}</figcaption></figure>")
    summary = STATES_SUMMARY.format(n=len(states))
    markup = f'<details class="course-states"><summary>{summary}</summary>\n' + "\n".join(parts) + "\n</details>"
    plain = f"[{summary}: " + " | ".join(sentence for _, sentence in states) + "]"
    metadata = {"course": {STATES: [{"values": dict(values), "sentence": sentence} for values, sentence in states]}}
    return {"text/html": markup, "text/plain": plain}, metadata


def interactive_figure(draw: Callable[..., Figure], states: Sequence[State] = (),
                       **controls: widgets.ValueWidget) -> None:
    """Show ``controls`` and the figure ``draw(**{name: control.value})``; redraw on every change.

    ``draw`` builds and returns a new matplotlib Figure from the controls' values (keyword
    arguments named like the controls). Sliders are set to update on release, so dragging
    does not queue dozens of redraws.

    ``states``: ``[(values, sentence), ...]``, settings worth seeing (the controls a state leaves out keep
    their default), each with the sentence that says what changed; drawn once into a folded block
    under the figure, which a deck steps through.

    Example::

        interactive_figure(plot_histogram, scale=widgets.FloatLogSlider(value=1.0, min=-1, max=1),
                           states=[({"scale": 10.0}, "Ten times the scale: the histogram is ten times as wide.")])
    """
    if not controls:
        raise ValueError("interactive_figure needs at least one control, e.g. scale=FloatSlider(...)")
    _check_states(states, controls)
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
    if states:
        defaults = {name: control.value for name, control in controls.items()}
        figures = []
        for values, _ in states:
            figure = draw(**{**defaults, **values})
            plt.close(figure)
            figures.append(figure)
        bundle, metadata = states_bundle(figures, states)
        display(bundle, raw=True, metadata=metadata)

    def redraw(_change) -> None:
        handle.update(current_figure())

    for control in controls.values():
        control.observe(redraw, names="value")
