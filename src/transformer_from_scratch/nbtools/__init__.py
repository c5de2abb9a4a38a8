"""The tooling that authors and runs the course notebooks (not part of the model).

* ``export``: a notebook's ``#| export`` cells -> its module (reference package or the learner's own).
* ``failures``: a failing learner check shown in a few lines, its verdict and the learner's own frames (installed
  by ``export``'s extension).
* ``student``: ``make student``, the exercise edition of every notebook (nbgrader's ClearSolutions).
* ``interactive``: ``interactive_figure``, controls above a figure that redraws in place.
* ``plotting``: the figures the notebooks repeat (heatmap with a colorbar, histogram against a density).
* ``helpers``: ``expect_error`` (the one way a notebook shows a caught error) and ``entropy_bits``.
* ``tidy``: clean saved notebooks; also the JupyterLab pre-save hook that keeps saves clean.
* ``slides``, ``site`` (and ``web``, what they share): ``make slides``, a reveal.js deck per notebook, and
  ``make site``, the course as a static website; both offline, from the saved notebooks.
"""
