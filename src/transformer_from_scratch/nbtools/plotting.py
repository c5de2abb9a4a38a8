"""The figures the notebooks draw again and again, so a "See it" cell holds only what is new."""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from matplotlib.axes import Axes


def heatmap(
    ax: Axes,
    matrix: torch.Tensor,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    xticklabels: Sequence[str] | None = None,
    yticklabels: Sequence[str] | None = None,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
    annotate: bool = False,
    colorbar: str | None = None,
) -> None:
    """Draw a 2-D matrix (rows on the y axis) with an optional colorbar labelled ``colorbar``.

    ``annotate`` writes each value in its cell (for matrices of up to about 12 × 12).
    """
    if matrix.ndim != 2:
        raise ValueError(f"heatmap draws a 2-D matrix, got shape {tuple(matrix.shape)}")
    values = matrix.detach().float().cpu()
    image = ax.imshow(values.numpy(), cmap=cmap, vmin=vmin, vmax=vmax)
    if xticklabels is not None:  # words stand upright in their columns rather than run into each other
        upright = max((len(str(label)) for label in xticklabels), default=0) > 2
        ax.set_xticks(range(len(xticklabels)), xticklabels, rotation=90 if upright else 0)
    if yticklabels is not None:
        ax.set_yticks(range(len(yticklabels)), yticklabels)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if annotate:
        low, high = image.get_clim()
        middle = (low + high) / 2
        for i in range(values.shape[0]):
            for j in range(values.shape[1]):
                value = values[i, j].item()
                text = "0" if value == 0 else f"{value:.2f}"
                ax.text(j, i, text, ha="center", va="center", color="black" if value > middle else "white")
    if colorbar is not None:
        ax.figure.colorbar(image, ax=ax, label=colorbar, fraction=0.046, pad=0.04)


def histogram_vs_density(
    ax: Axes,
    values: torch.Tensor,
    density: Callable[[torch.Tensor], torch.Tensor],
    *,
    grid: torch.Tensor,
    xlabel: str,
    label: str = "samples",
    theory_label: str = "theory",
    cuts: Sequence[float] = (),
    bins: int = 120,
) -> None:
    """A normalised histogram of ``values`` against the curve ``density(grid)``, with dashed red lines at ``cuts``."""
    ax.hist(values.detach().flatten().float().cpu().numpy(), bins=bins, density=True,
            color="tab:blue", alpha=0.6, label=label)
    ax.plot(grid.numpy(), density(grid).numpy(), color="black", lw=1.5, label=theory_label)
    for cut in cuts:
        ax.axvline(cut, color="tab:red", ls="--", lw=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("density")
    ax.legend(loc="upper right")
