"""The step checks of notebook 04 pass the right steps and name each planted mistake on their first line."""

import torch
import torch.nn.functional as F

from transformer_from_scratch.checks.steps.rmsnorm import check_rms, check_rms_norm, check_rms_norm_upcast
from mutants import Catalogue


def rms(x, eps):
    return torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def rms_norm(x, gain, eps=1e-5):
    return x / rms(x, eps) * gain


def rms_norm_upcast(x, gain, eps=1e-5):
    compute = torch.promote_types(x.dtype, torch.float32)
    return rms_norm(x.to(compute), gain.to(compute), eps).to(x.dtype)


def rsqrt_style(x, gain, eps=1e-5):  # the final class's way: x times 1/RMS, in float32, cast back
    compute = torch.promote_types(x.dtype, torch.float32)
    x32 = x.to(compute)
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * gain.to(compute)).to(x.dtype)


def _centred(x):
    return x - x.mean(dim=-1, keepdim=True)


RMS_MUTANTS = [
    (lambda x, eps: torch.sqrt(x.pow(2).mean(dim=0, keepdim=True) + eps), "over dim=0"),
    (lambda x, eps: torch.sqrt(x.pow(2).mean(dim=-1) + eps), "no keepdim=True"),
    (lambda x, eps: torch.sqrt(x.pow(2).mean() + eps), "over every dimension"),
    (lambda x, eps: torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True)) + eps, "outside the square root"),
    (lambda x, eps: torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True)), "eps is ignored"),
    (lambda x, eps: torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + eps), "centred variance"),
    (lambda x, eps: torch.sqrt(x.var(dim=-1, keepdim=True) + eps), "x.var or x.std"),
    (lambda x, eps: torch.sqrt(x.pow(2).sum(dim=-1, keepdim=True) + eps), "summed, not averaged"),
    (lambda x, eps: torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps), "1 / RMS"),
    (lambda x, eps: x.pow(2).mean(dim=-1, keepdim=True) + eps, "square root is missing"),
]
RMS_ALSO = [  # the same mistake written another way
    (lambda x, eps: x.std(dim=-1, keepdim=True) + eps, "x.var or x.std"),
    (lambda x, eps: torch.sqrt(_centred(x).pow(2).mean(dim=-1, keepdim=True) + eps), "centred variance"),
    (lambda x, eps: torch.sqrt(x.pow(2).mean(dim=0) + eps), "over dim=0"),
    (lambda x, eps: torch.linalg.vector_norm(x, dim=-1, keepdim=True) + eps, "summed, not averaged"),
    (lambda x, eps: x.norm(dim=-1, keepdim=True), "summed, not averaged"),
]
NORM_MUTANTS = [
    (lambda x, g, eps=1e-5: x / rms(x, eps), "the gain is not applied"),
    (lambda x, g, eps=1e-5: x / rms(x, eps) + g, "added, not multiplied"),
    (lambda x, g, eps=1e-5: x * g / rms(x * g, eps), "scaled before it is normalised"),
    (lambda x, g, eps=1e-5: x * rms(x, eps) * g, "multiplied by its RMS"),
    (lambda x, g, eps=1e-5: x / rms(x, eps) @ g, "applied with @"),
    (lambda x, g, eps=1e-5: x / rms(x, 1e-5) * g, "not passed on"),
    (lambda x, g, eps=1e-5: F.rms_norm(x, x.shape[-1:], g, eps=eps), "calls PyTorch's own F.rms_norm"),
]


def _upcast(compute=None, back=None):
    """rms_norm_upcast with the compute dtype or the dtype cast back to changed (a mistake)."""
    def wrong(x, gain, eps=1e-5):
        c = compute(x) if compute else torch.promote_types(x.dtype, torch.float32)
        out = rms_norm(x.to(c), gain.to(c), eps)
        return out.to(back(x)) if back else out
    return wrong


UPCAST_MUTANTS = [
    (lambda x, g, eps=1e-5: rms_norm(x, g, eps), "no upcast"),
    (_upcast(compute=lambda x: torch.float32 if x.dtype == torch.float16 else x.dtype, back=lambda x: x.dtype),
     "computed in bfloat16"),
    (_upcast(), "not cast back"),
    (_upcast(back=lambda x: torch.float16), "not back to x's dtype"),
    (_upcast(compute=lambda x: torch.float32, back=lambda x: x.dtype), "computed in float32"),
    (_upcast(compute=lambda x: torch.float32, back=lambda x: x.dtype if x.element_size() < 4 else torch.float32),
     "comes back as float32"),
    (lambda x, g, eps=1e-5: rms_norm(x.float(), g.float()).to(x.dtype) if x.dtype != torch.float64
     else rms_norm(x, g), "not passed on to your rms_norm"),
    (lambda x, g, eps=1e-5: F.rms_norm(x.float(), x.shape[-1:], g.float(), eps=eps).to(x.dtype),
     "calls PyTorch's own F.rms_norm"),
]


def test_the_right_steps_pass_with_one_line(capsys):
    check_rms(rms)
    check_rms_norm(rms_norm)
    check_rms_norm_upcast(rms_norm_upcast)
    check_rms_norm_upcast(rsqrt_style)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * 4, lines


CATALOGUES = [Catalogue(check_rms, RMS_MUTANTS, right=rms),
              Catalogue(check_rms, RMS_ALSO, exclusive=False, distinct="none"),  # the same, written another way
              Catalogue(check_rms_norm, NORM_MUTANTS, right=rms_norm),
              Catalogue(check_rms_norm_upcast, UPCAST_MUTANTS, right=rms_norm_upcast)]
