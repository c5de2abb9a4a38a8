"""A failing learner check reads in a few lines (nbtools.failures, installed by the setup cell's %load_ext): its
verdict, then the learner's own code, never the checker's frames or source; every other error shows as IPython shows
it. One small notebook, run in a real kernel as a learner would run it, plays every case."""

import re

import nbformat
import pytest
from nbclient import NotebookClient

LINEAR = '''class Linear(nn.Module):
    def __init__(self, in_features, out_features, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        std = math.sqrt(2 / (in_features + out_features))
        nn.init.trunc_normal_(self.weight, std=std, a=-3 * std, b=3 * std)

    def forward(self, x):
        return x @ self.weight  # the classic mistake: no transpose'''

# w2 applied before the product: the check recognises the crash and replaces the harness's verdict with its own.
SWIGLU = '''from transformer_from_scratch import Linear as CourseLinear

class SwiGLU(nn.Module):
    def __init__(self, d_model, d_ff, device=None, dtype=None):
        super().__init__()
        self.w1, self.w3 = CourseLinear(d_model, d_ff, device, dtype), CourseLinear(d_model, d_ff, device, dtype)
        self.w2 = CourseLinear(d_ff, d_model, device, dtype)

    def forward(self, x):
        return self.w2(torch.sigmoid(self.w1(x)) * self.w1(x)) * self.w3(x)'''

# An AssertionError of the learner's own, not a check's: it reaches the handler, which leaves it to IPython.
PLAIN_ERROR = "def first(items):\n    assert items, 'no items'\n    return items[0]\n\nfirst([])"

CELLS = {
    "setup": "%load_ext transformer_from_scratch.nbtools.export\nimport math\n\nimport torch\nfrom torch import nn",
    "linear": LINEAR,
    "check-linear": "from transformer_from_scratch.checks import check_linear\n\ncheck_linear(Linear)",
    "full-traceback": "%tb",
    "rms": "def rms(x, eps):\n    return torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True)) + eps",
    "check-rms": "from transformer_from_scratch.checks.steps.rmsnorm import check_rms\n\ncheck_rms(rms)",
    "crashing-linear": 'class Linear(Linear):\n    def forward(self, x):\n        return x @ self.weight.T + "one"',
    "check-crash": "check_linear(Linear)",
    # What `make student` makes of a method (nbgrader's ClearSolutions, then nbtools.student naming the stub).
    "stub-linear": ("class Linear(Linear):\n    def forward(self, x):\n        # YOUR CODE HERE\n"
                    "        raise NotImplementedError('Linear.forward is not written yet: write it in 01_linear.ipynb')"),
    "check-stub": "check_linear(Linear)",
    "swiglu": SWIGLU,
    "check-swiglu": "from transformer_from_scratch.checks import check_swiglu\n\ncheck_swiglu(SwiGLU)",
    "plain-error": PLAIN_ERROR,
    "unload": "%unload_ext transformer_from_scratch.nbtools.export",
    "plain-error-unloaded": PLAIN_ERROR,
    "check-unloaded": "check_linear(Linear)",
}


@pytest.fixture(scope="module")
def errors(tmp_path_factory):
    """Each cell's error output (ename, evalue, the traceback as plain text), by cell id."""
    cells = [nbformat.v4.new_code_cell(source, id=key) for key, source in CELLS.items()]
    nb = nbformat.v4.new_notebook(cells=cells)
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path_factory.mktemp("notebook"))}}).execute()
    found = {}
    for cell in nb.cells:
        for output in cell.outputs:
            if output.output_type == "error":
                text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(output.traceback))  # without IPython's colours
                found[cell.id] = (output.ename, output.evalue, text)
    return found


def _assert_nothing_of_the_checker(text: str) -> None:
    assert "transformer_from_scratch" not in text and "_harness" not in text, text  # no frame of the package
    assert "site-packages" not in text and "Traceback" not in text, text  # nor of a library (torch), nor a header
    assert "expected = " not in text and "fail(" not in text, text  # nor the checker's source


@pytest.mark.parametrize("cell, mistake", [("check-linear", "applies the weight without the transpose"),
                                           ("check-rms", "eps is added outside the square root")])
def test_a_check_failure_shows_its_verdict_alone(errors, cell, mistake):
    ename, evalue, text = errors[cell]
    assert ename == "AssertionError" and mistake in evalue.splitlines()[0], evalue  # tools still see it as such
    lines = text.splitlines()
    assert lines[0] == f"AssertionError: {evalue.splitlines()[0]}", text  # the first line is the mistake and its fix
    assert len(lines) <= 8, text
    _assert_nothing_of_the_checker(text)


def test_an_error_in_the_learners_code_shows_their_line_under_the_verdict(errors):
    ename, evalue, text = errors["check-crash"]
    lines = text.splitlines()
    assert ename == "AssertionError" and lines[0] == f"AssertionError: {evalue}", text
    assert "raised TypeError" in lines[0] and "read the error below" in lines[0], text
    assert re.search(r"^Cell In\[\d+\], line 3, in Linear\.forward$", text, re.MULTILINE), text
    assert 'return x @ self.weight.T + "one"' in text, text
    assert lines[-1].startswith("TypeError: unsupported operand type(s) for +"), text
    assert len(lines) <= 8, text
    _assert_nothing_of_the_checker(text)  # nor torch's Module.__call__ frames between the check and forward


def test_a_checks_own_diagnosis_of_a_crash_shows_the_crash_once(errors):
    _, _, text = errors["check-swiglu"]
    lines = text.splitlines()
    assert lines[0].startswith("AssertionError: forward multiplies a (..., d_model) tensor by a (..., d_ff) one"), text
    assert "read the error below" not in text, text  # the harness's verdict, which the check replaced, is left out
    assert re.search(r"^Cell In\[\d+\], line 10, in SwiGLU\.forward$", text, re.MULTILINE), text
    assert lines[-1].startswith("RuntimeError: The size of tensor a"), text
    _assert_nothing_of_the_checker(text)


def test_a_stub_met_by_a_check_shows_the_stub_and_its_message(errors):
    ename, evalue, text = errors["check-stub"]
    lines = text.splitlines()
    assert ename == "AssertionError" and "is not written yet" in lines[0], text
    assert "raise NotImplementedError('Linear.forward is not written yet" in text, text
    assert lines[-1] == "NotImplementedError: Linear.forward is not written yet: write it in 01_linear.ipynb", text
    _assert_nothing_of_the_checker(text)


def test_the_full_traceback_is_one_percent_tb_away(errors):
    _, _, text = errors["full-traceback"]
    assert "transformer_from_scratch/checks/linear.py" in text and "applies the weight without the transpose" in text


def test_an_error_that_is_not_a_checks_shows_as_ipython_shows_it(errors):
    with_extension, without = errors["plain-error"], errors["plain-error-unloaded"]
    assert with_extension[:2] == ("AssertionError", "no items"), with_extension
    assert "Traceback (most recent call last)" in with_extension[2] and "assert items, 'no items'" in with_extension[2]
    assert re.sub(r"In\[\d+\]", "In[n]", with_extension[2]) == re.sub(r"In\[\d+\]", "In[n]", without[2])


def test_unloading_the_extension_gives_the_check_failures_back_to_ipython(errors):
    _, _, text = errors["check-unloaded"]
    assert "Traceback (most recent call last)" in text and "transformer_from_scratch/checks/" in text
