"""The benchmark's yardstick, ReferenceLM, computes the same function as TransformerLM (an independent check of the
whole model: it is built from PyTorch's built-ins, with RoPE as a complex multiplication)."""

import pytest
import torch

from conftest import DEVICES
from transformer_from_scratch import TransformerLM
from transformer_from_scratch.benchmark.reference import ReferenceLM


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused", [False, True], ids=["from-scratch", "fused"])
def test_reference_lm_matches_transformer_lm(device, fused):
    torch.manual_seed(0)
    model = TransformerLM(97, 24, 32, 2, 4, 64, 10000.0, device=device, dtype=torch.float64, fused=fused)
    reference = ReferenceLM(model)
    ids = torch.randint(0, 97, (3, 24), device=device)
    expected = reference(ids)
    torch.testing.assert_close(model(ids), expected, rtol=1e-6, atol=1e-6)  # RoPE's tables are float32
    assert expected.shape == (3, 24, 97)


def test_reference_lm_holds_a_copy_of_the_weights():
    model = TransformerLM(50, 8, 16, 1, 2, 32, 10000.0)
    reference = ReferenceLM(model)
    assert reference.weights.state_dict().keys() == model.state_dict().keys()
    with torch.no_grad():
        model.lm_head.weight.zero_()
    assert reference.weights.lm_head.weight.abs().sum() > 0  # training one does not move the other
