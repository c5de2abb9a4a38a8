"""interactive_figure: the default figure is a normal output (so it exists headless), and moving a
control redraws it in place with the new values."""

import ipywidgets as widgets
import pytest
from matplotlib.figure import Figure

from transformer_from_scratch.nbtools import interactive


@pytest.fixture
def shown(monkeypatch):
    """Record what interactive_figure displays and updates, instead of sending it to a notebook."""
    events = []

    class Handle:
        def update(self, obj):
            events.append(("update", obj))

    def fake_display(obj, display_id=False, raw=False, metadata=None):
        events.append(("display", obj) if metadata is None else ("display", obj, metadata))
        return Handle() if display_id else None

    monkeypatch.setattr(interactive, "display", fake_display)
    return events


def test_default_is_drawn_then_redrawn_when_a_control_moves(shown):
    calls = []

    def draw(scale, width):
        calls.append((scale, width))
        return Figure()

    scale = widgets.FloatSlider(value=1.0, min=0.0, max=2.0)
    width = widgets.Dropdown(options=[8, 16], value=8)
    interactive.interactive_figure(draw, scale=scale, width=width)

    assert calls == [(1.0, 8)]
    assert [event[0] for event in shown] == ["display", "display"]
    controls = shown[0][1]  # a raw mime bundle: the HBox's widget view, and a readable text fallback
    assert controls["text/plain"] == "[controls: scale, width; run the notebook to move them]"
    assert controls["application/vnd.jupyter.widget-view+json"]["model_id"]
    assert isinstance(shown[1][1], Figure)
    assert scale.continuous_update is False  # redraw on release, not on every pixel of a drag

    scale.value = 1.5
    width.value = 16
    assert calls == [(1.0, 8), (1.5, 8), (1.5, 16)]
    assert [event[0] for event in shown] == ["display", "display", "update", "update"]
    assert all(isinstance(obj, Figure) for _, obj in shown[1:])


def test_needs_at_least_one_control(shown):
    with pytest.raises(ValueError, match="at least one control"):
        interactive.interactive_figure(Figure)


def _drawn(calls):
    def draw(scale, width):
        calls.append((scale, width))
        figure = Figure(figsize=(2, 1))
        figure.add_subplot().set_title(f"scale {scale}, width {width}")
        return figure
    return draw


def test_preset_states_are_drawn_once_into_a_folded_block(shown):
    """A deck has no kernel: the states are drawn when the cell runs, each with its sentence, the controls a state
    leaves out at their default."""
    calls = []
    scale = widgets.FloatSlider(value=1.0, min=0.0, max=2.0)
    width = widgets.Dropdown(options=[("narrow", 8), ("wide", 16)], value=8)
    states = [({"scale": 2.0}, "Twice the scale: <twice> as wide."), ({"width": 16, "scale": 0.0}, "Flat & wide.")]
    interactive.interactive_figure(_drawn(calls), states=states, scale=scale, width=width)

    assert calls == [(1.0, 8), (2.0, 8), (0.0, 16)]
    assert len(shown) == 3 and shown[2][0] == "display"
    bundle, metadata = shown[2][1], shown[2][2]
    markup = bundle["text/html"]
    assert markup.startswith('<details class="course-states"><summary>The figure at 2 other settings')
    assert markup.count('<img src="data:image/png;base64,iVBOR') == 2, "one PNG a state"
    assert "<figcaption>Twice the scale: &lt;twice&gt; as wide.</figcaption>" in markup, "sentences are escaped"
    assert "<figcaption>Flat &amp; wide.</figcaption>" in markup
    assert bundle["text/plain"] == "[The figure at 2 other settings (a deck steps through them): " \
                                   "Twice the scale: <twice> as wide. | Flat & wide.]"
    assert metadata == {"course": {"states": [{"values": {"scale": 2.0}, "sentence": states[0][1]},
                                              {"values": {"width": 16, "scale": 0.0}, "sentence": states[1][1]}]}}
    assert scale.value == 1.0 and width.value == 8, "drawing the states leaves the controls where they were"


@pytest.mark.parametrize("states, message", [
    ([({"depth": 3}, "Deeper.")], r"names \['depth'\], which are not controls \(\['scale', 'width'\]\)"),
    ([({"width": 12}, "Wider.")], r"width=12: not one of the control's options \[8, 16\]"),
    ([({"scale": 2.5}, "Larger.")], r"scale=2.5: outside the control's range \[0, 2\]"),
    ([({"scale": 1.5}, "")], r"each state is \(values, sentence\)"),
    ([{"scale": 1.5}], r"each state is \(values, sentence\)"),
])
def test_preset_states_must_be_settings_the_controls_can_take(shown, states, message):
    calls = []
    with pytest.raises(ValueError, match=message):
        interactive.interactive_figure(_drawn(calls), states=states, scale=widgets.FloatSlider(value=1.0, max=2.0),
                                       width=widgets.Dropdown(options=[8, 16], value=8))
    assert calls == [], "checked before anything is drawn"


def test_a_log_slider_state_is_checked_against_its_values_not_its_exponents(shown):
    rate = widgets.FloatLogSlider(value=1e-3, base=10, min=-4, max=-1)
    interactive.interactive_figure(lambda rate: Figure(), states=[({"rate": 1e-2}, "Ten times the rate.")], rate=rate)
    with pytest.raises(ValueError, match=r"rate=0.5: outside the control's range \[0.0001, 0.1\]"):
        interactive.interactive_figure(lambda rate: Figure(), states=[({"rate": 0.5}, "Too high.")], rate=rate)
