# Generated from notebooks/15_finetune.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: bf160d93c6f6db90817e764086a96ef6e394f9296055cfd14322c6d0648948c3

import math
import random
import zlib

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from transformer_from_scratch.pretrained import chat_prompt
from transformer_from_scratch.shapes import shape_checked
from transformer_from_scratch.training import cross_entropy

IGNORE = -100  # the target of a position that no loss and no grade counts: the prompt's and the padding's


def _check_same_rows(logits: Tensor, targets: Tensor, name: str) -> None:
    """ValueError unless logits is (batch, seq, vocab) and targets (batch, seq) of integers, the same batch and seq."""
    if not isinstance(logits, Tensor) or not isinstance(targets, Tensor) or logits.ndim != 3 or \
            targets.shape != logits.shape[:2] or targets.dtype.is_floating_point or targets.dtype == torch.bool:
        got = [f"{type(t).__name__} {tuple(t.shape) if isinstance(t, Tensor) else ''}" for t in (logits, targets)]
        raise ValueError(f"{name}: logits (batch, seq, vocab) and integer targets (batch, seq) of the same batch and "
                         f"seq, got logits {got[0]} and targets {got[1]}")


@shape_checked
def lora_delta(x: Float[Tensor, "... d_in"], A: Float[Tensor, "rank d_in"], B: Float[Tensor, "d_out rank"],
               scaling: float) -> Float[Tensor, "... d_out"]:
    """Step 1: scaling · B A x for every vector along x's last dimension, through the rank (x Aᵀ, then Bᵀ): never the
    d_out x d_in matrix B A. ValueError when x's last dimension is not A's d_in, or B's rank not A's."""
    if x.shape[-1:] != A.shape[1:] or B.ndim != 2 or B.shape[1] != A.shape[0]:
        raise ValueError(f"lora_delta: x (..., d_in), A (rank, d_in), B (d_out, rank), got x {tuple(x.shape)}, "
                         f"A {tuple(A.shape)}, B {tuple(B.shape)}")
    return scaling * ((x @ A.T) @ B.T)


def assistant_targets(prompt_ids: list[int], reply_ids: list[int]) -> tuple[list[int], list[int]]:
    """Step 2: one training example from a prompt and the assistant's reply (its ids end with <|im_end|>): the ids
    (prompt + reply without its last id) and the targets (the id after each position, IGNORE while it is the
    prompt's), both len(prompt) + len(reply) - 1 long, exactly len(reply) targets not IGNORE."""
    if not prompt_ids or not reply_ids:
        raise ValueError(f"assistant_targets: the prompt and the reply need at least one id each, got "
                         f"{len(prompt_ids)} and {len(reply_ids)}")
    sequence = list(prompt_ids) + list(reply_ids)
    return sequence[:-1], [IGNORE] * (len(prompt_ids) - 1) + list(reply_ids)


def pad_batch(examples: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[Int[Tensor, "batch seq"],
                                                                                 Int[Tensor, "batch seq"]]:
    """Step 3: (ids, targets) examples of unequal lengths as two torch.long tensors (batch, longest): the ids padded
    on the right with pad_id, the targets with IGNORE, so that a padded position changes no real one (causal
    attention) and counts in no loss. ValueError for no examples, or an example whose two lists differ in length."""
    if not examples:
        raise ValueError("pad_batch: no examples (give at least one (ids, targets) pair)")
    for row, pair in enumerate(examples):
        if len(pair[0]) != len(pair[1]) or not pair[0]:
            raise ValueError(f"pad_batch: example {row} has {len(pair[0])} ids and {len(pair[1])} targets (the same "
                             f"number, at least one, is needed)")
    longest = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), longest), pad_id, dtype=torch.long)
    targets = torch.full((len(examples), longest), IGNORE, dtype=torch.long)
    for row, (example_ids, example_targets) in enumerate(examples):
        ids[row, :len(example_ids)] = torch.tensor(example_ids, dtype=torch.long)
        targets[row, :len(example_targets)] = torch.tensor(example_targets, dtype=torch.long)
    return ids, targets


def masked_cross_entropy(logits: Float[Tensor, "batch seq vocab"], targets: Int[Tensor, "batch seq"]
                         ) -> Float[Tensor, ""]:
    """Step 4: the mean cross-entropy over the positions whose target is not IGNORE (the replies), with notebook 11's
    cross_entropy: every counted token weighs the same, however long its example. ValueError when nothing counts."""
    _check_same_rows(logits, targets, "masked_cross_entropy")
    if not (targets != IGNORE).any():
        raise ValueError("masked_cross_entropy: every target is IGNORE, so there is no token to average over")
    counted = targets != IGNORE
    return cross_entropy(logits[counted], targets[counted])


def exact_match(logits: Float[Tensor, "batch seq vocab"], targets: Int[Tensor, "batch seq"]) -> Bool[Tensor, " batch"]:
    """Step 5: for each example, True when the most likely next token equals the target at every position that is
    not IGNORE. Teacher-forced on the right reply, it is True exactly when greedy decoding writes that reply, its
    <|im_end|> included: one forward pass grades a whole batch."""
    _check_same_rows(logits, targets, "exact_match")
    right = (logits.argmax(dim=-1) == targets) | (targets == IGNORE)
    return right.all(dim=-1)


def _is_linear(module: nn.Module) -> bool:
    """A Linear of the course (the reference's, or yours in my_transformer: a class called Linear) or PyTorch's."""
    return isinstance(module, nn.Module) and any(kind.__name__ == "Linear" for kind in type(module).__mro__)


def _check_lora(base: nn.Module, rank: int, alpha: float) -> tuple[int, int]:
    """(d_out, d_in) of `base`, after checking that LoRALinear can adapt it with this rank and alpha."""
    if not _is_linear(base) or getattr(base, "bias", None) is not None or getattr(base, "weight", None) is None \
            or base.weight.ndim != 2:
        raise TypeError(f"LoRALinear: base must be a Linear without bias (the course's, or nn.Linear(..., "
                        f"bias=False)), got {type(base).__name__}")
    d_out, d_in = base.weight.shape
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= min(d_in, d_out):
        raise ValueError(f"LoRALinear: rank must be an int in [1, min(d_in, d_out)] = [1, {min(d_in, d_out)}], "
                         f"got {rank!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < math.inf:
        raise ValueError(f"LoRALinear: alpha must be a number > 0, got {alpha!r}")
    return d_out, d_in


class LoRALinear(nn.Module):
    """A frozen Linear plus a trainable low-rank update: y = base(x) + (alpha / rank) · B A x (Hu et al., 2021).

    `base` (no bias) is frozen in place, not copied. `lora_A` (rank, d_in) starts N(0, 1/d_in) cut at ±3σ, `lora_B`
    (d_out, rank) at zero, on base's device and dtype: the layer starts exactly as `base`; `scaling` is alpha / rank.
    merge() folds the update into base.weight, unmerge() takes it out, `merged` says which. TypeError for a base that
    is not a Linear without bias, ValueError for a rank or alpha out of range."""

    def __init__(self, base: nn.Module, rank: int, alpha: float) -> None:
        super().__init__()
        d_out, d_in = _check_lora(base, rank, alpha)
        self.base, self.rank, self.alpha, self.scaling = base, rank, float(alpha), alpha / rank
        base.weight.requires_grad_(False)
        factory = dict(device=base.weight.device, dtype=base.weight.dtype)
        self.lora_A = nn.Parameter(torch.empty(rank, d_in, **factory))
        self.lora_B = nn.Parameter(torch.zeros(d_out, rank, **factory))
        std = 1 / math.sqrt(d_in)
        nn.init.trunc_normal_(self.lora_A, std=std, a=-3 * std, b=3 * std)
        self.merged = False

    @shape_checked
    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        y = self.base(x)  # the frozen layer checks x
        return y if self.merged else y + lora_delta(x, self.lora_A, self.lora_B, self.scaling)

    @torch.no_grad()
    def merge(self) -> None:
        """base.weight += scaling · B A: the same outputs, within rounding, from one matrix product."""
        if self.merged:
            raise RuntimeError("LoRALinear.merge: already merged (a second merge would add B A twice): unmerge() first")
        self.base.weight += self.scaling * (self.lora_B @ self.lora_A)
        self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """base.weight -= scaling · B A: the pretrained weight back, within rounding."""
        if not self.merged:
            raise RuntimeError("LoRALinear.unmerge: not merged, so there is nothing to take out")
        self.base.weight -= self.scaling * (self.lora_B @ self.lora_A)
        self.merged = False


def apply_lora(model: nn.Module, targets: tuple[str, ...] = ("q_proj", "v_proj"), rank: int = 8,
               alpha: float = 16.0) -> dict[str, LoRALinear]:
    """Freeze every parameter of `model`, then replace, in place, each Linear whose name (the last part of its path:
    q_proj, k_proj, v_proj, output_proj, w1, w2, w3, lm_head) is in `targets` by a LoRALinear(linear, rank, alpha).
    Returns {path: LoRALinear} in the model's order. ValueError, the model left as it was, for a target that names
    no Linear, a Linear whose weight another module shares (a tied lm_head), or a model that has adapters already."""
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    if any(isinstance(module, LoRALinear) for module in model.modules()):
        raise ValueError("apply_lora: the model has LoRA adapters already (merge them into a fresh model, or load one)")
    linears = {path: module for path, module in model.named_modules() if _is_linear(module)}
    chosen = {path: linear for path, linear in linears.items() if path.rsplit(".", 1)[-1] in targets}
    missing = sorted(set(targets) - {path.rsplit(".", 1)[-1] for path in chosen})
    if missing:
        names = sorted({path.rsplit(".", 1)[-1] for path in linears})
        raise ValueError(f"apply_lora: no Linear is called {', '.join(missing)} (this model's are {', '.join(names)})")
    uses = {}
    for _, parameter in model.named_parameters(remove_duplicate=False):
        uses[id(parameter)] = uses.get(id(parameter), 0) + 1
    for path, linear in chosen.items():
        if uses[id(linear.weight)] > 1:
            raise ValueError(f"apply_lora: {path}.weight is shared with another module (tied embeddings): adapt the "
                             f"other layers")
        _check_lora(linear, rank, alpha)  # every one checked before the model changes
    model.requires_grad_(False)
    adapters = {}
    for path in chosen:
        parent, _, name = path.rpartition(".")
        adapters[path] = LoRALinear(chosen[path], rank, alpha)
        setattr(model.get_submodule(parent), name, adapters[path])
    return adapters


WORDS = tuple("apple bread chair cloud dream field glass horse light money night ocean paper queen river stone table "
              "tiger voice water".split())


def held_out(words: tuple[str, ...]) -> bool:
    """True for one list in five, by a hash of the list: the test lists, which no training example uses."""
    if isinstance(words, str) or not all(isinstance(word, str) for word in words):
        raise TypeError(f"held_out takes the list's words, a tuple of str, got {words!r}")
    return zlib.crc32(", ".join(words).encode()) % 5 == 0


def reverse_task(rng: random.Random, *, split: str = "train") -> tuple[str, str]:
    """One (question, answer) of the task: 3 to 6 distinct words of WORDS, to be written in the reverse order. split
    "train" draws only lists for which held_out is False, "test" only the others, so the two never share a list."""
    if split not in ("train", "test"):
        raise ValueError(f"reverse_task: split is 'train' or 'test', got {split!r}")
    while True:
        words = tuple(rng.sample(WORDS, rng.randint(3, 6)))
        if held_out(words) == (split == "test"):
            return (f"Reverse the order of this list: {', '.join(words)}. Reply with the list only.",
                    ", ".join(reversed(words)))


def encode_example(tokenizer, question: str, answer: str, system: str | None) -> tuple[list[int], list[int]]:
    """A (question, answer) as (ids, targets) for training: the ChatML prompt of the question (with the system message
    `system`, None for none), then the answer and <|im_end|>; the loss on the answer and <|im_end|> only."""
    if not isinstance(question, str) or not isinstance(answer, str):
        raise TypeError(f"encode_example: the question and the answer are str, got {type(question).__name__} and "
                        f"{type(answer).__name__}")
    prompt = tokenizer.encode(chat_prompt([{"role": "user", "content": question}], system))
    return assistant_targets(prompt, tokenizer.encode(answer) + [tokenizer.special_ids["<|im_end|>"]])


def wilson_interval(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of an accuracy correct / n, 95 % for z = 1.96 (right at 0 and at n, where the normal
    approximation's is not). ValueError unless 0 <= correct <= n and n >= 1."""
    if isinstance(correct, bool) or isinstance(n, bool) or not isinstance(correct, int) or not isinstance(n, int) \
            or n < 1 or not 0 <= correct <= n:
        raise ValueError(f"wilson_interval: need ints 0 <= correct <= n and n >= 1, got correct={correct!r}, n={n!r}")
    p, z2 = correct / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)
