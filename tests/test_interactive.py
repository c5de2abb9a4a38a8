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

    def fake_display(obj, display_id=False, raw=False):
        events.append(("display", obj))
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
    assert [kind for kind, _ in shown] == ["display", "display"]
    controls = shown[0][1]  # a raw mime bundle: the HBox's widget view, and a readable text fallback
    assert controls["text/plain"] == "[controls: scale, width; run the notebook to move them]"
    assert controls["application/vnd.jupyter.widget-view+json"]["model_id"]
    assert isinstance(shown[1][1], Figure)
    assert scale.continuous_update is False  # redraw on release, not on every pixel of a drag

    scale.value = 1.5
    width.value = 16
    assert calls == [(1.0, 8), (1.5, 8), (1.5, 16)]
    assert [kind for kind, _ in shown] == ["display", "display", "update", "update"]
    assert all(isinstance(obj, Figure) for _, obj in shown[1:])


def test_needs_at_least_one_control(shown):
    with pytest.raises(ValueError, match="at least one control"):
        interactive.interactive_figure(Figure)
