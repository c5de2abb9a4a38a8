"""The step checks of notebook 15 pass the right steps and name each planted mistake on their first line."""

import torch
import torch.nn.functional as F
from einops import einsum

from transformer_from_scratch import finetune
from transformer_from_scratch.checks.steps.finetune import (check_assistant_targets, check_exact_match,
                                                            check_lora_delta, check_masked_cross_entropy,
                                                            check_pad_batch)
from mutants import Catalogue

IGNORE = finetune.IGNORE

# --- the right steps: the course's (src/transformer_from_scratch/finetune.py) --------------------------------------

lora_delta = finetune.lora_delta
assistant_targets = finetune.assistant_targets
pad_batch = finetune.pad_batch
masked_cross_entropy = finetune.masked_cross_entropy
exact_match = finetune.exact_match


def test_the_right_steps_pass_with_one_line(capsys):
    check_lora_delta(lora_delta)
    check_assistant_targets(assistant_targets)
    check_pad_batch(pad_batch)
    check_masked_cross_entropy(masked_cross_entropy)
    check_exact_match(exact_match)
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines] == ["✓ "] * 5, lines


def test_forming_the_full_matrix_first_passes(capsys):
    """scaling · x (B A)ᵀ is the same update, only slower: it passes."""
    check_lora_delta(lambda x, A, B, scaling: x @ (scaling * (B @ A)).T)
    assert capsys.readouterr().out.startswith("✓ lora_delta")


def test_the_cross_entropy_built_in_passes(capsys):
    """F.cross_entropy with ignore_index=-100 (its default) is the same loss: it passes."""
    check_masked_cross_entropy(lambda logits, targets: F.cross_entropy(logits.flatten(0, 1), targets.flatten()))
    assert capsys.readouterr().out.startswith("✓ masked_cross_entropy")


# --- lora_delta ---------------------------------------------------------------------------------------------------

DELTA_MUTANTS = [
    (lambda x, A, B, s: (x @ A.T) @ B.T, "the scaling is left out"),
    (lambda x, A, B, s: (x @ A.T) @ B.T / s, "the update is divided by scaling"),
    (lambda x, A, B, s: s * (x @ A) @ B, "A or B is applied without its transpose"),
    (lambda x, A, B, s: s * (x @ B.T) @ A.T, "A and B are applied in the wrong order"),
    (lambda x, A, B, s: torch.zeros(*x.shape[:-1], B.shape[0], dtype=x.dtype), "lora_delta returns zeros"),
    (lambda x, A, B, s: s * x @ A.T, "B is left out"),
    (lambda x, A, B, s: s * (x.reshape(-1, x.shape[-1]) @ A.T) @ B.T, "the leading dimensions are lost"),
    (lambda x, A, B, s: s * einsum(x, A, B, "b t i, r i, o r -> b t o"), "accept any number of leading dimensions"),
    (lambda x, A, B, s: s * (x @ A.T) @ B.T.reshape(B.shape), "A and B do not fit x"),  # right only when square
]


# --- assistant_targets --------------------------------------------------------------------------------------------

def _targets(change):
    def learners(prompt_ids, reply_ids):
        return change(list(prompt_ids), list(reply_ids))
    return learners


def _extends_in_place(prompt_ids, reply_ids):
    targets = [IGNORE] * (len(prompt_ids) - 1) + reply_ids
    ids = prompt_ids
    ids += reply_ids  # the caller's list grows
    return ids[:-1], targets


TARGETS_MUTANTS = [
    (_targets(lambda p, r: ((p + r)[:-1], [IGNORE] * len(p) + r[1:])), "the prompt's last position is masked"),
    (_targets(lambda p, r: ((p + r)[:-1], [IGNORE] * (len(p) - 2) + p[-1:] + r)), "a prompt token is a target"),
    (_targets(lambda p, r: ((p + r)[:-1], [IGNORE] * len(p) + r[:-1])), "the reply's targets are shifted: each target"),
    (_targets(lambda p, r: ((p + r)[:-1], [IGNORE] * (len(p) - 2) + r + [IGNORE])),
     "the reply's targets are shifted: they start"),
    (_targets(lambda p, r: (p + r, [IGNORE] * (len(p) - 1) + r + [IGNORE])), "ids keeps the reply's last id"),
    (_targets(lambda p, r: ((p + r)[:-1], (p + r)[1:])), "the prompt's targets are not masked"),
    (_targets(lambda p, r: ((p + r)[:-1], [-1] * (len(p) - 1) + r)), "masked with -1, not IGNORE"),
    (_extends_in_place, "changes the caller's lists"),
]


# --- pad_batch ----------------------------------------------------------------------------------------------------

def _pad(*, left=False, target_pad=IGNORE, id_pad=None, dtype=torch.long, length=max):
    def learners(examples, pad_id):
        size = length(len(ids) for ids, _ in examples)
        fill = pad_id if id_pad is None else id_pad
        rows_ids, rows_targets = [], []
        for ids, targets in examples:
            ids, targets = ids[:size], targets[:size]
            gap = size - len(ids)
            rows_ids.append([fill] * gap + ids if left else ids + [fill] * gap)
            rows_targets.append([target_pad] * gap + targets if left else targets + [target_pad] * gap)
        return torch.tensor(rows_ids, dtype=dtype), torch.tensor(rows_targets, dtype=dtype)
    return learners


PAD_MUTANTS = [
    (_pad(left=True), "padded on the left"),
    (lambda examples, pad_id: _pad(target_pad=pad_id)(examples, pad_id), "the targets are padded with pad_id"),
    (_pad(id_pad=IGNORE), "the ids are padded with IGNORE"),
    (_pad(id_pad=0), "pad_id is ignored"),
    (_pad(dtype=torch.int32), "as torch.int32, not torch.int64"),
    (_pad(dtype=torch.float32), "as torch.float32, not torch.int64"),
    (_pad(length=min), "to the length of the shortest example"),
    (lambda examples, pad_id: tuple(t.tolist() for t in pad_batch(examples, pad_id)), "not a tensor"),
]


# --- masked_cross_entropy -----------------------------------------------------------------------------------------

def _per_position(logits, targets):
    keep = targets != IGNORE
    losses = torch.logsumexp(logits, -1) - logits.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return losses * keep, keep


def _mean_over_every_position(logits, targets):
    losses, _ = _per_position(logits, targets)
    return losses.mean()


def _mean_per_example(logits, targets):
    losses, keep = _per_position(logits, targets)
    return (losses.sum(-1) / keep.sum(-1)).mean()


def _ignore_not_removed(logits, targets):
    return finetune.cross_entropy(logits.flatten(0, 1), targets.flatten())  # indexes with -100: IndexError


def _ignore_clamped(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten().clamp(min=0))


def _sum(logits, targets):
    losses, _ = _per_position(logits, targets)
    return losses.sum()


def _per_example(logits, targets):
    losses, keep = _per_position(logits, targets)
    return losses.sum(-1) / keep.sum(-1)


LOSS_MUTANTS = [
    (_mean_over_every_position, "the mean over every position"),
    (_mean_per_example, "averages each example first"),
    (_ignore_not_removed, "the IGNORE (-100) positions are not removed"),
    (_ignore_clamped, "the IGNORE (-100) positions are not removed"),
    (_sum, "the sum over the counted tokens"),
    (_per_example, "one loss per example"),
]


# --- exact_match --------------------------------------------------------------------------------------------------

MATCH_MUTANTS = [
    (lambda logits, targets: ((logits.argmax(-1) == targets) & (targets != IGNORE)).any(-1), "when any position"),
    (lambda logits, targets: (logits.argmax(-1) == targets).all(-1), "the masked positions are compared too"),
    (lambda logits, targets: ((logits.argmax(1) == targets) | (targets == IGNORE)).all(-1), "the wrong dimension"),
    (lambda logits, targets: ((logits.argmax(-1) == targets) | (targets == IGNORE)).all(), "for the whole batch"),
    (lambda logits, targets: ((logits.argmax(-1) == targets) | (targets == IGNORE)).float().mean(-1),
     "not torch.bool"),
]


CATALOGUES = [
    Catalogue(check_lora_delta, DELTA_MUTANTS, right=lora_delta),
    Catalogue(check_assistant_targets, TARGETS_MUTANTS, right=assistant_targets),
    Catalogue(check_pad_batch, PAD_MUTANTS, right=pad_batch),
    Catalogue(check_masked_cross_entropy, LOSS_MUTANTS, right=masked_cross_entropy,
              shared=frozenset({"the IGNORE (-100) positions are not removed"}),
              ids=[phrase + (" (clamped)" if i == 3 else "") for i, (_, phrase) in enumerate(LOSS_MUTANTS)]),
    Catalogue(check_exact_match, MATCH_MUTANTS, right=exact_match),
]
