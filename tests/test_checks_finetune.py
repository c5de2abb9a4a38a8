"""check_lora_linear and check_apply_lora pass the course's LoRALinear and apply_lora (src/transformer_from_scratch/
finetune.py) and name each classic mistake, planted here as a small wrong version of them."""

import copy
import math

import torch
from torch import nn

from transformer_from_scratch.checks import check_apply_lora, check_lora_linear
from transformer_from_scratch.finetune import LoRALinear, apply_lora, lora_delta
from transformer_from_scratch.linear import Linear
from mutants import LEARNERS_LINEAR, Catalogue


def test_the_course_passes_with_one_line(capsys):
    assert check_lora_linear(LoRALinear) is None
    assert check_apply_lora(apply_lora) is None
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["✓ check_lora_linear", "✓ check_apply_lora"], lines


STUDENT_NOTEBOOK = """
import math, torch
from torch import nn

""" + LEARNERS_LINEAR + """
class LoRALinear(nn.Module):
    def __init__(self, base, rank, alpha):
        super().__init__()
        if not isinstance(base, Linear):
            raise TypeError("LoRALinear adapts my Linear")
        self.base, self.scaling, self.merged = base, alpha / rank, False
        base.weight.requires_grad_(False)
        d_out, d_in = base.weight.shape
        std = 1 / math.sqrt(d_in)
        self.lora_A = nn.Parameter(torch.empty(rank, d_in, device=base.weight.device, dtype=base.weight.dtype))
        nn.init.trunc_normal_(self.lora_A, std=std, a=-3 * std, b=3 * std)
        self.lora_B = nn.Parameter(torch.zeros(d_out, rank, device=base.weight.device, dtype=base.weight.dtype))

    def forward(self, x):
        y = self.base(x)
        return y if self.merged else y + self.scaling * (x @ self.lora_A.T) @ self.lora_B.T

    @torch.no_grad()
    def merge(self):
        if self.merged:
            raise RuntimeError("merged")
        self.base.weight += self.scaling * self.lora_B @ self.lora_A
        self.merged = True

    @torch.no_grad()
    def unmerge(self):
        if not self.merged:
            raise RuntimeError("not merged")
        self.base.weight -= self.scaling * self.lora_B @ self.lora_A
        self.merged = False

def apply_lora(model, targets=("q_proj", "v_proj"), rank=8, alpha=16.0):
    found = {p: m for p, m in model.named_modules() if isinstance(m, Linear) and p.rsplit(".", 1)[-1] in targets}
    if set(targets) - {p.rsplit(".", 1)[-1] for p in found}:
        raise ValueError("unknown target")
    model.requires_grad_(False)
    out = {}
    for path, linear in found.items():
        parent, _, name = path.rpartition(".")
        out[path] = LoRALinear(linear, rank, alpha)
        setattr(model.get_submodule(parent), name, out[path])
    return out
"""


def test_the_base_is_the_linear_the_learners_code_sees(capsys):
    """A LoRALinear that adapts only the learner's own Linear (in the student edition, my_transformer's) is checked
    on that Linear, and apply_lora on a model made of it."""
    namespace = {}
    exec(STUDENT_NOTEBOOK, namespace)
    check_lora_linear(namespace["LoRALinear"])
    check_apply_lora(namespace["apply_lora"])
    assert capsys.readouterr().out.count("✓") == 2


# ---------------------------------------------------------------------------------------------------- LoRALinear

class BRandom(LoRALinear):
    def __init__(self, base, rank, alpha):
        super().__init__(base, rank, alpha)
        nn.init.normal_(self.lora_B, std=0.02)  # the model moves before its first step


class AZero(LoRALinear):
    def __init__(self, base, rank, alpha):
        super().__init__(base, rank, alpha)
        nn.init.zeros_(self.lora_A)  # B's gradient, through A x, is zero too


class InitSwapped(LoRALinear):
    def __init__(self, base, rank, alpha):
        super().__init__(base, rank, alpha)
        nn.init.zeros_(self.lora_A)
        nn.init.normal_(self.lora_B, std=0.02)


class UniformA(LoRALinear):
    def __init__(self, base, rank, alpha):
        super().__init__(base, rank, alpha)
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # PEFT's default


class DefaultTruncNormalA(LoRALinear):
    def __init__(self, base, rank, alpha):
        super().__init__(base, rank, alpha)
        nn.init.trunc_normal_(self.lora_A)  # std 1, cut at ±2


class UncutA(LoRALinear):
    def __init__(self, base, rank, alpha):
        super().__init__(base, rank, alpha)
        nn.init.normal_(self.lora_A, std=1 / math.sqrt(self.lora_A.shape[1]))


class RankStdA(LoRALinear):
    def __init__(self, base, rank, alpha):
        super().__init__(base, rank, alpha)
        std = 1 / math.sqrt(rank)
        nn.init.trunc_normal_(self.lora_A, std=std, a=-3 * std, b=3 * std)


class ScalingAlpha(LoRALinear):
    def __init__(self, base, rank, alpha):
        super().__init__(base, rank, alpha)
        self.scaling = alpha


class ScalingRankOverAlpha(LoRALinear):
    def __init__(self, base, rank, alpha):
        super().__init__(base, rank, alpha)
        self.scaling = rank / alpha


class NotScaled(LoRALinear):
    def forward(self, x):
        return self.base(x) + lora_delta(x, self.lora_A, self.lora_B, 1.0)


class UpdateNotAdded(LoRALinear):
    def forward(self, x):
        return self.base(x)


class BaseLeftOut(LoRALinear):
    def forward(self, x):
        return lora_delta(x, self.lora_A, self.lora_B, self.scaling)


class BaseNotFrozen(LoRALinear):
    def __init__(self, base, rank, alpha):
        super().__init__(base, rank, alpha)
        base.weight.requires_grad_(True)


class BaseCopied(LoRALinear):
    def __init__(self, base, rank, alpha):
        super().__init__(copy.deepcopy(base), rank, alpha)


class StoredTransposed(LoRALinear):
    def __init__(self, base, rank, alpha):
        super().__init__(base, rank, alpha)
        self.lora_A = nn.Parameter(self.lora_A.detach().T.clone())
        self.lora_B = nn.Parameter(self.lora_B.detach().T.clone())

    def forward(self, x):
        return self.base(x) + self.scaling * (x @ self.lora_A) @ self.lora_B


class DtypeIgnored(LoRALinear):
    def __init__(self, base, rank, alpha):
        super().__init__(base, rank, alpha)
        self.lora_A = nn.Parameter(self.lora_A.detach().float())
        self.lora_B = nn.Parameter(self.lora_B.detach().float())


class DeviceIgnored(LoRALinear):
    def __init__(self, base, rank, alpha):
        super().__init__(base, rank, alpha)
        if self.lora_A.is_meta:
            self.lora_A = nn.Parameter(torch.zeros(self.lora_A.shape, dtype=self.lora_A.dtype))


class Detached(LoRALinear):
    def forward(self, x):
        return self.base(x) + lora_delta(x, self.lora_A.detach(), self.lora_B, self.scaling)


class MergeWithoutScaling(LoRALinear):
    @torch.no_grad()
    def merge(self):
        self.base.weight += self.lora_B @ self.lora_A
        self.merged = True


class MergeFlagNotSet(LoRALinear):
    @torch.no_grad()
    def merge(self):
        self.base.weight += self.scaling * (self.lora_B @ self.lora_A)


class MergeTwiceAllowed(LoRALinear):
    @torch.no_grad()
    def merge(self):
        self.base.weight += self.scaling * (self.lora_B @ self.lora_A)
        self.merged = True


class CountedTwice(LoRALinear):
    def forward(self, x):
        return self.base(x) + lora_delta(x, self.lora_A, self.lora_B, self.scaling)


class UnmergeWithoutScaling(LoRALinear):
    @torch.no_grad()
    def unmerge(self):
        if not self.merged:
            raise RuntimeError("not merged")
        self.base.weight -= self.lora_B @ self.lora_A
        self.merged = False


class WrongSignature(LoRALinear):
    def __init__(self, base, r, lora_alpha):
        super().__init__(base, r, lora_alpha)


LORA_MUTANTS = {
    "B random at the start": (BRandom, "lora_B does not start at zero"),
    "A zero": (AZero, "lora_A starts at zero as well as lora_B"),
    "initialisations swapped": (InitSwapped, "the initialisations of lora_A and lora_B are swapped"),
    "A uniform (PEFT's default)": (UniformA, "spread evenly"),
    "A with trunc_normal_'s defaults": (DefaultTruncNormalA, "trunc_normal_'s default std"),
    "A not cut": (UncutA, "so nothing was truncated"),
    "A's std 1/sqrt(rank)": (RankStdA, "std is 1 / sqrt(rank)"),
    "scaling alpha": (ScalingAlpha, "the update is scaled by alpha, not alpha / rank"),
    "scaling rank/alpha": (ScalingRankOverAlpha, "the update is scaled by rank / alpha"),
    "not scaled": (NotScaled, "the update is not scaled"),
    "update not added": (UpdateNotAdded, "the update is not added"),
    "base left out": (BaseLeftOut, "the base's output is left out"),
    "base not frozen": (BaseNotFrozen, "it is not frozen"),
    "base copied": (BaseCopied, "copies the base's weight"),
    "A and B stored transposed": (StoredTransposed, "are stored transposed"),
    "dtype not the base's": (DtypeIgnored, "makes lora_A in torch.float32, not its base's torch.float64"),
    "device not the base's": (DeviceIgnored, "makes lora_A on cpu, not its base's meta"),
    "update detached": (Detached, "no gradient reaches LoRALinear.lora_A"),
    "merge without scaling": (MergeWithoutScaling, "merge() adds B A to the weight without the scaling"),
    "merged not set": (MergeFlagNotSet, "after merge(), LoRALinear.merged is False"),
    "merge twice allowed": (MergeTwiceAllowed, "merge() on a merged layer returned normally"),
    "update counted twice after merge": (CountedTwice, "forward still adds the update after merge()"),
    "unmerge without scaling": (UnmergeWithoutScaling, "unmerge() does not restore the base weight"),
    "wrong signature": (WrongSignature, "signature is (base, r, lora_alpha)"),
}


# ---------------------------------------------------------------------------------------------------- apply_lora

def _apply(*, freeze=True, freeze_after=False, match=None, place="parent", returns="dict", strict=True,
           swap_rank_alpha=False):
    """apply_lora with one thing done wrong (each keyword's default is the right way)."""
    def learners(model, targets=("q_proj", "v_proj"), rank=8, alpha=16.0):
        linears = {name: m for name, m in model.named_modules() if isinstance(m, Linear)}
        chosen = match or (lambda path: path.rsplit(".", 1)[-1] in targets)
        found = {path: m for path, m in linears.items() if chosen(path)}
        if strict:
            missing = set(targets) - {path.rsplit(".", 1)[-1] for path in found}
            if missing:
                raise ValueError(f"no Linear is called {sorted(missing)}")
        if freeze and not freeze_after:
            model.requires_grad_(False)
        replaced = {}
        for path, linear in found.items():
            adapter = LoRALinear(linear, int(alpha), rank) if swap_rank_alpha else LoRALinear(linear, rank, alpha)
            if place == "parent":
                parent, _, name = path.rpartition(".")
                setattr(model.get_submodule(parent), name, adapter)
            elif place == "dotted":
                setattr(model, path, adapter)
            else:
                linear = adapter  # noqa: F841 - a new local name: the model keeps its Linear
            replaced[path] = adapter
        if freeze_after:
            model.requires_grad_(False)
        return {"dict": replaced, "none": None, "list": list(replaced.values())}[returns]
    return learners


def _also(*extra):
    def learners(model, targets=("q_proj", "v_proj"), rank=8, alpha=16.0):
        return apply_lora(model, tuple(targets) + extra, rank, alpha)
    return learners


def _substrings(model, targets=("q_proj", "v_proj"), rank=8, alpha=16.0):
    """Targets matched as substrings of the whole path ("proj" then wraps every projection)."""
    linears = {name: m for name, m in model.named_modules() if isinstance(m, Linear)}
    found = {path: m for path, m in linears.items() if any(t in path for t in targets)}
    if not found:
        raise ValueError(f"no Linear matches {targets}")
    model.requires_grad_(False)
    replaced = {}
    for path, linear in found.items():
        parent, _, name = path.rpartition(".")
        replaced[path] = LoRALinear(linear, rank, alpha)
        setattr(model.get_submodule(parent), name, replaced[path])
    return replaced


APPLY_MUTANTS = {
    "substrings of the path": (_substrings, "matches targets as substrings"),
    "the model not frozen": (_apply(freeze=False), "is still trainable"),
    "frozen after wrapping": (_apply(freeze_after=True), "the adapters are frozen too"),
    "not in place": (_apply(place="local"), "does not replace the Linears in place"),
    "setattr with a dotted path": (_apply(place="dotted"), "does not replace the Linears in place"),
    "nothing returned": (_apply(returns="none"), "returns None, not the adapters"),
    "a list returned": (_apply(returns="list"), "returned a list, not a dict"),
    "every Linear wrapped": (_apply(match=lambda path: True, strict=False), "wraps Linears that are not in targets"),
    "lm_head wrapped too": (_also("lm_head"), "wraps Linears that are not in targets"),
    "no error for an unknown target": (_apply(strict=False), "there is no error for an unknown target"),
    "rank and alpha swapped": (_apply(swap_rank_alpha=True), "not rank 2"),
}


CATALOGUES = [
    Catalogue(check_lora_linear, list(LORA_MUTANTS.values()), right=LoRALinear, ids=list(LORA_MUTANTS)),
    Catalogue(check_apply_lora, list(APPLY_MUTANTS.values()), right=apply_lora, ids=list(APPLY_MUTANTS),
              shared=frozenset({"does not replace the Linears in place", "wraps Linears that are not in targets"})),
]
