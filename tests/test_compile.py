"""torch.compile and the shape-check switch.

`torch.compile(model, fullgraph=True, backend="aot_eager")` of a tiny TransformerLM: one graph, no break, with the
logits and every weight's gradient equal to eager's (same weights), with the run-time shape checks on and off, with
fused=True, and with tie_embeddings=True (one Parameter read twice). aot_eager traces forward and backward as inductor
does but runs them without generating code, so the test stays quick on a CPU; what is checked is that the model traces
as one graph and that the traced graph computes what eager does. Then the switch: `set_shape_checks(False)` really
bypasses jaxtyping, `shape_checks` restores the previous setting even when its block raises, and the switch takes
only True or False.
"""

import pytest
import torch
from jaxtyping import TypeCheckError, config

from transformer_from_scratch import Linear, TransformerLM, set_shape_checks, shape_checks, shape_checks_enabled

TINY_LM = dict(vocab_size=50, context_length=16, d_model=32, num_layers=1, num_heads=4, d_ff=64, rope_theta=10_000.0)


@pytest.fixture(autouse=True)
def restore_the_switch():
    """Whatever a test does to the switch, the next test starts with the setting this one found."""
    before = shape_checks_enabled()
    yield
    set_shape_checks(before)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()  # no cached graph, guard or recompile count from an earlier test
    yield
    torch._dynamo.reset()


def gradients(model):
    grads = [p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize(
    "fused, checks, tie",
    [(False, True, False), (False, False, False), (True, True, False), (False, True, True)],
    ids=["from-scratch-checks-on", "from-scratch-checks-off", "fused-checks-on", "tied-embeddings-checks-on"],
)
def test_compiled_model_matches_eager_forward_and_backward(fresh_dynamo, fused, checks, tie):
    torch.manual_seed(0)
    model = TransformerLM(**TINY_LM, fused=fused, tie_embeddings=tie)
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    upstream = torch.randn(2, 12, 50, generator=torch.Generator().manual_seed(2))  # a random dL/d(logits)
    with shape_checks(checks):
        eager = model(ids)
        eager.backward(upstream)
        eager_grads = gradients(model)

        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # fullgraph: a graph break raises
        logits = compiled(ids)
        logits.backward(upstream)
        compiled_grads = gradients(model)
    assert logits.shape == (2, 12, 50) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, eager, rtol=1e-5, atol=1e-5)  # same ops in the same order: ~float32 roundoff
    assert len(compiled_grads) == len(eager_grads) == len(list(model.parameters()))
    for name, got, expected in zip([n for n, _ in model.named_parameters()], compiled_grads, eager_grads):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


# ---- the switch -----------------------------------------------------------------------------------------------

def error_of_a_0d_input_to_linear():
    with pytest.raises(Exception) as caught:
        Linear(4, 3)(torch.tensor(1.0))
    return caught


def test_switching_the_checks_off_bypasses_jaxtyping():
    set_shape_checks(True)
    assert shape_checks_enabled() and not config.jaxtyping_disable
    assert error_of_a_0d_input_to_linear().type is TypeCheckError  # jaxtyping's, before the explicit check

    set_shape_checks(False)
    assert not shape_checks_enabled() and config.jaxtyping_disable  # jaxtyping's own switch follows
    caught = error_of_a_0d_input_to_linear()
    assert caught.type is ValueError, caught.type  # the explicit check's: jaxtyping never ran
    assert "got shape ()" in str(caught.value)

    set_shape_checks(True)
    assert error_of_a_0d_input_to_linear().type is TypeCheckError  # and on again


@pytest.mark.parametrize("outer", [True, False], ids=["outer-on", "outer-off"])
def test_shape_checks_restores_the_previous_setting_even_after_an_exception(outer):
    set_shape_checks(outer)
    with pytest.raises(ValueError, match="got shape"), shape_checks(not outer):
        assert shape_checks_enabled() is (not outer)
        with shape_checks(outer):  # nested: restores the inner block's setting, not the outermost
            assert shape_checks_enabled() is outer
        assert shape_checks_enabled() is (not outer)
        Linear(4, 3)(torch.randn(2, 5))  # raises inside the block
    assert shape_checks_enabled() is outer and config.jaxtyping_disable is (not outer)


@pytest.mark.parametrize("bad", ["yes", 1, 0, None, "False"], ids=repr)
def test_the_switch_takes_only_true_or_false(bad):
    set_shape_checks(True)
    with pytest.raises(TypeError, match="True or False"):
        set_shape_checks(bad)
    with pytest.raises(TypeError, match="True or False"), shape_checks(bad):
        pass  # never reached
    assert shape_checks_enabled() is True  # a refused value changes nothing
