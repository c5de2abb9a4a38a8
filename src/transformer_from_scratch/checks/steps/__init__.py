"""Self-checks for the steps of each notebook's *Build it step by step*, one module per notebook.

In the student edition the learner writes each step (a small function: the rotation of one pair, the head split,
the residual step, …) before the final class, and runs its check in the cell right after it::

    from transformer_from_scratch.checks.steps.linear import check_apply_weight
    check_apply_weight(apply_weight)

The contract is the components' checks' (``transformer_from_scratch.checks``): right, it prints one line starting
with ✓; wrong, it raises ``AssertionError`` whose first line names the most likely mistake and how to fix it, and
never prints the answer. Each module's docstrings list the mistakes they recognise; ``tests/test_steps_<module>.py``
plants each one and asserts its own message.
"""
