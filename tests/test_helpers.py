"""The notebooks' shared helpers: expect_error, entropy_bits and the plotting functions."""

import math

import matplotlib.pyplot as plt
import pytest
import torch

from transformer_from_scratch.nbtools.helpers import entropy_bits, expect_error, quiet_transformers
from transformer_from_scratch.nbtools.plotting import heatmap, histogram_vs_density


def test_expect_error_prints_the_type_and_the_first_lines(capsys):
    with expect_error(ValueError, TypeError):
        raise TypeError("wrong dtype\n  expected float\n  got long")
    with expect_error(ValueError, lines=2):
        raise ValueError("first\n\n   second\nthird")
    assert capsys.readouterr().out == "TypeError: wrong dtype\nValueError: first | second\n"


def test_expect_error_fails_when_nothing_is_raised_and_lets_other_errors_through():
    with pytest.raises(AssertionError, match="expected the block to raise ValueError"):
        with expect_error(ValueError):
            pass
    with pytest.raises(KeyError):
        with expect_error(ValueError):
            raise KeyError("not the expected kind")
    with pytest.raises(ValueError, match="needs the error type"):
        with expect_error():
            pass


def test_entropy_bits_by_hand():
    assert entropy_bits(torch.full((8,), 1 / 8)).item() == pytest.approx(3.0)
    assert entropy_bits(torch.tensor([1.0, 0.0, 0.0])).item() == 0.0  # 0 · log 0 counts as 0
    rows = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    assert entropy_bits(rows).tolist() == pytest.approx([1.0, 2.0])
    assert entropy_bits(rows.T, dim=0).tolist() == pytest.approx([1.0, 2.0])
    p = torch.tensor([0.9, 0.1], dtype=torch.float64)
    expected = -(0.9 * math.log2(0.9) + 0.1 * math.log2(0.1))
    assert entropy_bits(p).item() == pytest.approx(expected)


def test_heatmap_draws_labels_values_and_a_colorbar():
    fig, ax = plt.subplots()
    heatmap(ax, torch.tensor([[0.0, 1.0], [0.25, 0.75]]), title="t", xlabel="key", ylabel="query",
            xticklabels=["a", "b"], yticklabels=["c", "d"], annotate=True, colorbar="weight")
    assert ax.get_title() == "t" and ax.get_xlabel() == "key" and ax.get_ylabel() == "query"
    assert [t.get_text() for t in ax.texts] == ["0", "1.00", "0.25", "0.75"]
    assert len(fig.axes) == 2 and fig.axes[1].get_ylabel() == "weight"
    with pytest.raises(ValueError, match=r"2-D matrix, got shape \(2, 2, 2\)"):
        heatmap(ax, torch.zeros(2, 2, 2), title="", xlabel="", ylabel="")
    plt.close(fig)


def test_histogram_vs_density_draws_both_and_the_cuts():
    fig, ax = plt.subplots()
    grid = torch.linspace(-3, 3, 61)
    histogram_vs_density(ax, torch.randn(1000, generator=torch.Generator().manual_seed(0)),
                         lambda z: torch.exp(-z**2 / 2) / math.sqrt(2 * math.pi), grid=grid, xlabel="value",
                         cuts=(-2.0, 2.0))
    assert len(ax.patches) == 120 and len(ax.lines) == 3  # the bars, the density, two cuts
    assert ax.get_xlabel() == "value" and ax.get_ylabel() == "density"
    plt.close(fig)


def test_quiet_transformers_turns_every_bar_off_and_restores_them():
    """Both of transformers' bars a GGUF load draws (its loader's and its converter's, which calls tqdm with no
    switch) are off inside, and the library's settings are as before after, an error included."""
    from transformers import modeling_gguf_pytorch_utils as gguf_loading
    from transformers.utils import logging as hf_logging

    def converter_bar_off() -> bool:
        bar = gguf_loading.tqdm([1])
        off = bar.disable
        bar.close()  # which sets disable
        return off

    hf_logging.enable_progress_bar()
    before = hf_logging.get_verbosity()
    assert converter_bar_off() is False  # on unless turned off
    with pytest.raises(KeyError), quiet_transformers():
        assert converter_bar_off() is True
        assert hf_logging.is_progress_bar_enabled() is False
        assert hf_logging.get_verbosity() == hf_logging.ERROR
        raise KeyError("inside")
    assert converter_bar_off() is False
    assert hf_logging.is_progress_bar_enabled() is True
    assert hf_logging.get_verbosity() == before
