"""Self-checks for the steps of notebook 15 (LoRA fine-tuning): the low-rank update, one chat example as ids and
targets, a padded batch, the loss on the assistant's tokens only, and the exact-match grade.

Each compares the learner's function with an answer computed here independently (the update from its formula, the
targets written out position by position, the loss from ``F.cross_entropy(..., ignore_index=-100)``) on small inputs
of several shapes; when they differ, it computes the classic mistakes one by one and names the first the learner's
result matches.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from .._harness import attempt, call, crashed, describe, diagnose, expect_tensor, fail, first_line, generator, passed

IGNORE = -100  # the target that the loss and the grade skip (the course's finetune.IGNORE)

# ---------------------------------------------------------------------------------------------------------
# Step 1 · the low-rank update scaling · B A x
# ---------------------------------------------------------------------------------------------------------

_DELTA_FIX = ("the update is scaling · B (A x) for every vector x along the last dimension: A maps d_in to the rank, "
              "B maps the rank to d_out")
_SHAPES = ("A is (rank, d_in) and B is (d_out, rank), stored like a Linear's weight: a row vector x meets each of them "
           "transposed, x Aᵀ (…, rank), then Bᵀ (…, d_out)")


def _delta_case(gen: torch.Generator, leading: tuple[int, ...], d_in: int, d_out: int, rank: int,
                dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(*leading, d_in, generator=gen, dtype=torch.float64).to(dtype)
    A = torch.randn(rank, d_in, generator=gen, dtype=torch.float64).to(dtype)
    B = torch.randn(d_out, rank, generator=gen, dtype=torch.float64).to(dtype)
    return x, A, B


def check_lora_delta(lora_delta: Callable[..., torch.Tensor]) -> None:
    """Check ``lora_delta(x, A, B, scaling)``: scaling · B A x for every vector along x's last dimension, (..., d_in)
    -> (..., d_out), with A (rank, d_in) and B (d_out, rank), both random (a zero B would hide every mistake).

    Forming the d_out × d_in matrix B A first gives the same numbers and passes (it is only slower). Mistakes it
    recognises: the scaling left out, or divided by (rank / alpha in place of alpha / rank); A and B applied without
    their transposes or in the wrong order (a wrong shape); zeros returned (B is zero only at the start of training);
    B left out; the leading dimensions lost (flattened), or only a fixed number of them accepted.
    """
    gen = generator(0)
    scaling = 2.5  # alpha / rank = 5 / 2: neither 1 nor its own inverse
    # Square sizes first (d_in = d_out = rank): a missing transpose or a swap computes something there, with a name.
    cases = [((2, 3), 4, 4, 4), ((4,), 4, 4, 4), ((2, 1, 3), 4, 4, 4), ((2, 3), 6, 5, 2), ((7,), 3, 8, 2),
             ((), 6, 5, 3)]
    first = cases[0][0]
    for leading, d_in, d_out, rank in cases:
        x, A, B = _delta_case(gen, leading, d_in, d_out, rank)
        _check_delta_case(lora_delta, x, A, B, scaling, first, square=d_in == d_out == rank)
    x, A, B = _delta_case(gen, (2, 3), 6, 5, 2, torch.float32)
    _check_delta_case(lora_delta, x, A, B, scaling, first, square=False)
    passed("lora_delta: scaling · B A x through the rank, for any leading dimensions, square and not, float64 and "
           "float32")


def _check_delta_case(lora_delta: Callable[..., torch.Tensor], x: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                      scaling: float, first: tuple[int, ...], square: bool) -> None:
    what = (f"lora_delta(x of shape {tuple(x.shape)}, A of shape {tuple(A.shape)}, B of shape {tuple(B.shape)}, "
            f"scaling={scaling:g})")
    out, error = attempt(what, lora_delta, x, A, B, scaling)
    if error is not None:
        if isinstance(error, RuntimeError) and not square and x.shape[:-1] == first:
            raise AssertionError(
                f"A and B do not fit x: {what} raised {type(error).__name__} ({first_line(error)}), though square "
                f"sizes work: {_SHAPES}.") from error
        if isinstance(error, (RuntimeError, ValueError)) and x.shape[:-1] != first and square:
            raise AssertionError(
                f"{what} crashes ({type(error).__name__}), though x of shape {(*first, x.shape[-1])} works: accept any "
                "number of leading dimensions: the products run over the last one only.") from error
        crashed(what, error)
    expected = scaling * (x.double() @ A.double().T) @ B.double().T
    if isinstance(out, torch.Tensor) and out.shape != expected.shape and out.numel() == expected.numel() \
            and out.shape[-1:] == expected.shape[-1:]:
        fail(f"{what} returned shape {tuple(out.shape)}, expected {tuple(expected.shape)}: the leading dimensions are "
             "lost", "keep every leading dimension of x: the update acts on each vector along the last one")
    out = expect_tensor(what, out, expected.shape, _SHAPES, returns="return the update as a tensor")
    if out.dtype != x.dtype:
        fail(f"{what} returned {out.dtype}, expected {x.dtype} (the inputs' dtype)",
             "compute in the inputs' dtype: no .float() or .double() inside")
    expected = expected.to(x.dtype)
    tolerance = dict(rtol=1e-5, atol=1e-5) if x.dtype == torch.float32 else dict(rtol=1e-9, atol=1e-9)
    xd, Ad, Bd = x.double(), A.double(), B.double()
    diagnose(what, out, expected, [
        (lambda: torch.zeros_like(expected), "lora_delta returns zeros: the update is zero only at the start of "
         "training, while B is still zero", "compute it from the A and B given: B trains away from zero, and the "
         "update is what it learns"),
        (lambda: ((xd @ Ad.T) @ Bd.T).to(x.dtype), "the scaling is left out",
         "multiply the update by scaling (alpha / rank), so that the rank does not change its size"),
        (lambda: ((xd @ Ad.T) @ Bd.T / scaling).to(x.dtype), "the update is divided by scaling (rank / alpha in place "
         "of alpha / rank)", "multiply by scaling = alpha / rank: a larger alpha makes a larger update"),
        (lambda: (scaling * xd @ Ad.T).to(x.dtype), "B is left out: the update stops at the rank",
         "apply B after A: it maps the rank back to d_out"),
        (lambda: (scaling * (xd @ Ad) @ Bd).to(x.dtype), "A or B is applied without its transpose", _SHAPES),
        (lambda: (scaling * (xd @ Ad.T) @ Bd).to(x.dtype), "A or B is applied without its transpose", _SHAPES),
        (lambda: (scaling * (xd @ Ad) @ Bd.T).to(x.dtype), "A or B is applied without its transpose", _SHAPES),
        (lambda: (scaling * (xd @ Bd.T) @ Ad.T).to(x.dtype), "A and B are applied in the wrong order (B first)",
         "A comes first: it reads x (d_in) and gives the rank; B maps the rank to d_out"),
        (lambda: (scaling * (xd @ Bd) @ Ad).to(x.dtype), "A and B are applied in the wrong order (B first)",
         "A comes first: it reads x (d_in) and gives the rank; B maps the rank to d_out"),
    ], _DELTA_FIX, **tolerance)


# ---------------------------------------------------------------------------------------------------------
# Step 2 · one training example: ids and targets
# ---------------------------------------------------------------------------------------------------------

def reference_targets(prompt: Sequence[int], reply: Sequence[int]) -> tuple[list[int], list[int]]:
    """The right (ids, targets), written out position by position: ids[t] predicts ids[t + 1]; the target at t is
    that next id, IGNORE while the next id is still the prompt's."""
    tokens = list(prompt) + list(reply)
    ids = tokens[:-1]
    targets = [tokens[t + 1] if t + 1 >= len(prompt) else IGNORE for t in range(len(ids))]
    return ids, targets


_TARGETS_CASES = [([5, 9, 2, 7], [11, 3, 12]), ([4], [8, 12]), ([6, 1, 10], [12]), ([3, 14, 2, 9, 5, 7], [13, 4, 12])]


def _as_ints(seq: Any) -> list[int] | None:
    if isinstance(seq, torch.Tensor):
        return [int(v) for v in seq.flatten()] if seq.dim() == 1 else None
    if isinstance(seq, (list, tuple)):
        try:
            return [int(v) for v in seq]
        except (TypeError, ValueError):
            return None
    return None


def check_assistant_targets(assistant_targets: Callable[[list[int], list[int]], Any]) -> None:
    """Check ``assistant_targets(prompt_ids, reply_ids)`` -> (ids, targets): ids = the prompt and the reply without its
    last id; targets[t] = the id after position t, IGNORE (-100) while that id is the prompt's. Four cases, among
    them a one-token prompt and a one-token reply.

    Mistakes it recognises: the prompt's last position masked (so the reply's first token is never a target); a
    prompt token kept as a target; the reply's targets shifted (the ids at the same positions, or one position
    early); ids that keep the reply's last id (one too many); the prompt not masked at all; another mask value than
    IGNORE; the caller's prompt list changed in place.
    """
    for prompt, reply in _TARGETS_CASES:
        what = f"assistant_targets({prompt}, {reply})"
        given_prompt, given_reply = list(prompt), list(reply)
        out = call(what, assistant_targets, given_prompt, given_reply)
        if given_prompt != prompt or given_reply != reply:
            fail(f"{what} changes the caller's lists (prompt_ids became {given_prompt})",
                 "build new lists (prompt_ids + reply_ids makes one): the caller still needs its own")
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            fail(f"{what} returned {describe(out)}, not a pair (ids, targets)", "return two lists: ids, targets")
        ids, targets = _as_ints(out[0]), _as_ints(out[1])
        if ids is None or targets is None:
            fail(f"{what} returned ({describe(out[0])}, {describe(out[1])}), not two lists of ints",
                 "return two lists of ints: ids, targets")
        right_ids, right_targets = reference_targets(prompt, reply)
        tokens = prompt + reply
        if ids == tokens:
            fail(f"{what}: ids keeps the reply's last id, so it has len(prompt) + len(reply) = {len(ids)} entries",
                 "the last id is only ever a target: no position reads it to predict a next one, so ids ends one "
                 "before it", f"ids {ids}, expected {right_ids}")
        if ids != right_ids:
            fail(f"{what}: ids is {ids}, expected {right_ids}", "ids is the prompt followed by the reply without its "
                 "last id: what the model reads")
        if targets == right_targets:
            continue
        _name_targets_mistake(what, prompt, reply, targets, right_targets, tokens)
    passed("assistant_targets: ids without the last token, targets the next ids, IGNORE exactly where the next id is "
           "the prompt's (one-token prompts and replies too)")


def _name_targets_mistake(what: str, prompt: list[int], reply: list[int], targets: list[int],
                          right_targets: list[int], tokens: list[int]) -> None:
    P = len(prompt)
    evidence = f"targets {targets}, expected {right_targets}"
    if len(targets) != len(right_targets):
        fail(f"{what}: targets has {len(targets)} entries, ids {len(right_targets)}",
             "one target per position of ids: the id that follows it, or IGNORE", evidence)
    variants = [
        ([IGNORE] * P + reply[1:], "the prompt's last position is masked, so the reply's first token is never a target",
         "the prompt's last position is the one that predicts the reply's first token: keep exactly len(reply) "
         "targets, the first at position len(prompt) - 1"),
        ([IGNORE] * (P - 2) + tokens[P - 1:] if P >= 2 else None, "a prompt token is a target: the loss would train "
         "the model to write the user's prompt", "mask every position whose next id is still the prompt's: the "
         "first target is the reply's first id, at position len(prompt) - 1"),
        ([IGNORE] * P + reply[:-1], "the reply's targets are shifted: each target is the id at its own position, "
         "not the next one", "a position predicts the next token: targets[t] is the id at t + 1"),
        ([IGNORE] * (P - 2) + reply + [IGNORE] if P >= 2 else None, "the reply's targets are shifted: they start one "
         "position early", "targets[t] is the id at t + 1: the reply's first id is the target of the prompt's last "
         "position, len(prompt) - 1"),
        (tokens[1:], "the prompt's targets are not masked: the loss would train the model to write the prompt too",
         "use IGNORE as the target of every position whose next id is still the prompt's"),
    ]
    for wrong, mistake, fix in variants:
        if wrong is not None and targets == wrong:
            fail(mistake, fix, f"on {what}: {evidence}")
    kept = [t for t, r in zip(targets, right_targets) if r == IGNORE and t != IGNORE]
    if [t for t, r in zip(targets, right_targets) if r != IGNORE] == [r for r in right_targets if r != IGNORE] and \
            len(set(kept)) == 1:
        fail(f"the prompt's positions are masked with {kept[0]}, not IGNORE = {IGNORE}",
             "the loss skips exactly the targets equal to IGNORE (-100, cross-entropy's ignore_index)",
             f"on {what}: {evidence}")
    fail(f"{what}: the targets differ from the expected ones", "targets[t] is the id at position t + 1 of prompt + "
         "reply, IGNORE while that id is still the prompt's", evidence)


# ---------------------------------------------------------------------------------------------------------
# Step 3 · a padded batch
# ---------------------------------------------------------------------------------------------------------

def reference_batch(examples: list[tuple[list[int], list[int]]], pad_id: int, *, left: bool = False,
                    target_pad: int = IGNORE, id_pad: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The right padded batch (or, with ``left``, ``target_pad``, ``id_pad``, a classic wrong one)."""
    longest = max(len(ids) for ids, _ in examples)
    id_pad = pad_id if id_pad is None else id_pad
    rows_ids, rows_targets = [], []
    for ids, targets in examples:
        gap = longest - len(ids)
        rows_ids.append([id_pad] * gap + ids if left else ids + [id_pad] * gap)
        rows_targets.append([target_pad] * gap + targets if left else targets + [target_pad] * gap)
    return torch.tensor(rows_ids, dtype=torch.int64), torch.tensor(rows_targets, dtype=torch.int64)


_PAD_ID = 1  # neither 0 nor IGNORE, so that padding with either shows


def check_pad_batch(pad_batch: Callable[[list, int], Any]) -> None:
    """Check ``pad_batch(examples, pad_id)`` -> (ids, targets): two int64 tensors (batch, longest), ids padded on the
    right with pad_id, targets with IGNORE. The longest example is not the first.

    Mistakes it recognises: padding on the left; the targets padded with pad_id (the padding would count in the
    loss); the ids padded with IGNORE (not a token: the embedding fails on it); pad_id ignored (0 used); another
    dtype than int64; truncated to the shortest example (or cut to the first one's length); not a pair of tensors.
    """
    batches = [[(4, 2), (6, 3), (2, 1)], [(3, 1), (3, 2)], [(5, 4)]]  # (length, targets kept) of each example
    tokens = iter(range(20, 100))
    for shape in batches:
        examples = []
        for length, kept in shape:
            prompt = [next(tokens) for _ in range(length + 1 - kept)]
            reply = [next(tokens) for _ in range(kept)]
            examples.append(reference_targets(prompt, reply))
        _check_batch(pad_batch, examples)
    passed("pad_batch: (batch, longest) int64 tensors, ids padded on the right with pad_id, targets with IGNORE")


def _check_batch(pad_batch: Callable[[list, int], Any], examples: list[tuple[list[int], list[int]]]) -> None:
    lengths = [len(ids) for ids, _ in examples]
    what = f"pad_batch(examples of lengths {lengths}, pad_id={_PAD_ID})"
    given = [(list(ids), list(targets)) for ids, targets in examples]
    out = call(what, pad_batch, given, _PAD_ID)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        fail(f"{what} returned {describe(out)}, not a pair (ids, targets)", "return two tensors: ids, targets")
    want_ids, want_targets = reference_batch(examples, _PAD_ID)
    shape = tuple(want_ids.shape)
    for name, t in zip(("ids", "targets"), out):
        if isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[0] == len(examples) and t.shape[1] < shape[1]:
            short = "the shortest example" if t.shape[1] == min(lengths) else "the first example"
            fail(f"{what} returned {name} of shape {tuple(t.shape)}, expected {shape}: it cuts every example to the "
                 f"length of {short}", "pad to the longest example: cutting loses tokens of the reply, and its "
                 "targets with them")
        if not isinstance(t, torch.Tensor):
            fail(f"{what} returned its {name} as {describe(t)}, not a tensor", "return two tensors, ids and targets, "
                 "that the model and the loss take as they are")
        t = expect_tensor(f"{what} ({name})", t, shape, "one row per example, as long as the longest one")
        if t.dtype != torch.int64:
            fail(f"{what} returned {name} as {t.dtype}, not torch.int64", "make them int64 (torch.long): the "
                 "embedding and the loss index with int64 ids and targets")
    ids, targets = out
    if torch.equal(ids, want_ids) and torch.equal(targets, want_targets):
        return
    left_ids, left_targets = reference_batch(examples, _PAD_ID, left=True)
    evidence = f"ids {ids.tolist()}, targets {targets.tolist()}"
    if torch.equal(ids, left_ids):
        fail("the examples are padded on the left", "pad on the right: with causal attention a padding token "
             "after the real ones changes none of them, and positions then start at 0 for every example", evidence)
    if torch.equal(ids, want_ids) and torch.equal(targets, reference_batch(examples, _PAD_ID, target_pad=_PAD_ID)[1]):
        fail("the targets are padded with pad_id, so the padding would count in the loss", "pad the targets with "
             "IGNORE: the loss skips exactly those positions", evidence)
    if torch.equal(ids, reference_batch(examples, _PAD_ID, id_pad=IGNORE)[0]):
        fail("the ids are padded with IGNORE, which is no token (the embedding fails on -100)", "pad the ids with "
             "pad_id, a real token; IGNORE belongs in the targets only", evidence)
    if torch.equal(ids, reference_batch(examples, _PAD_ID, id_pad=0)[0]):
        fail("pad_id is ignored: the ids are padded with 0", "pad the ids with the pad_id given (the tokenizer's own "
             "padding token)", evidence)
    fail(f"{what} differs from the expected batch", "each row holds one example from position 0 on, then ids pad_id "
         "and targets IGNORE up to the longest length", f"{evidence}; expected ids {want_ids.tolist()}, targets "
         f"{want_targets.tolist()}")


# ---------------------------------------------------------------------------------------------------------
# Step 4 · the loss on the assistant's tokens only
# ---------------------------------------------------------------------------------------------------------

def _masked_targets(gen: torch.Generator, rows: list[list[bool]], vocab: int) -> torch.Tensor:
    keep = torch.tensor(rows)
    targets = torch.randint(0, vocab, keep.shape, generator=gen)
    return torch.where(keep, targets, torch.full_like(targets, IGNORE))


def check_masked_cross_entropy(masked_cross_entropy: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Check ``masked_cross_entropy(logits, targets)``: logits (batch, seq, vocab), targets (batch, seq) with IGNORE
    (-100) where no loss counts -> the mean cross-entropy over the other positions, a 0-d tensor. First a batch
    without IGNORE, then examples with 5, 1 and 3 counted positions (prompt and padding masked), float64 and float32.

    Mistakes it recognises: the mean over every position (masked ones counted as zero); the mean of each example
    first, then over the batch (a long reply would weigh less per token); the IGNORE targets not removed (a crash
    indexing with -100, or the loss computed there anyway); the sum instead of the mean; one loss per example or per
    position returned.
    """
    gen = generator(4)
    logits = 2 * torch.randn(2, 4, 7, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, 7, (2, 4), generator=gen)
    _check_loss(masked_cross_entropy, logits, targets, "a batch (2, 4, 7) with no IGNORE target", masked=False)
    keep = [[False, True, True, True, True, True], [False, False, False, False, False, True],
            [False, True, True, True, False, False]]
    logits = 2 * torch.randn(3, 6, 7, generator=gen, dtype=torch.float64)
    targets = _masked_targets(gen, keep, 7)
    _check_loss(masked_cross_entropy, logits, targets, "a batch (3, 6, 7) whose examples count 5, 1 and 3 positions",
                masked=True)
    _check_loss(masked_cross_entropy, logits.float(), targets, "the same batch in float32", masked=True)
    passed("masked_cross_entropy: the mean over the positions whose target is not IGNORE, every token weighing the "
           "same whatever its example's length")


def _check_loss(masked_cross_entropy: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], logits: torch.Tensor,
                targets: torch.Tensor, name: str, masked: bool) -> None:
    what = f"masked_cross_entropy({name})"
    out, error = attempt(what, masked_cross_entropy, logits.clone(), targets.clone())
    if error is not None:
        if masked:
            raise AssertionError(
                f"the IGNORE (-100) positions are not removed before the loss: {what} raised {type(error).__name__} "
                f"({first_line(error)}), though a batch without IGNORE works: keep only the positions whose target is "
                "not IGNORE (a boolean mask), then take the cross-entropy of those.") from error
        crashed(what, error)
    batch, seq, vocab = logits.shape
    if isinstance(out, torch.Tensor) and tuple(out.shape) in ((batch,), (batch, seq)):
        fail(f"{what} returned one loss per {'example' if out.dim() == 1 else 'position'} (shape {tuple(out.shape)}), "
             "not their mean", "the loss is one number, a 0-d tensor: the mean over every counted token")
    out = expect_tensor(what, out, (), "return one number, a 0-d tensor: the mean over the counted tokens")
    flat, flat_targets = logits.double().reshape(-1, vocab), targets.reshape(-1)
    expected = F.cross_entropy(flat, flat_targets, ignore_index=IGNORE).to(logits.dtype)
    keep = targets != IGNORE
    losses = F.cross_entropy(flat, flat_targets, ignore_index=IGNORE, reduction="none").reshape(batch, seq)
    counted = keep.sum(-1)
    tolerance = dict(rtol=1e-5, atol=1e-6) if logits.dtype == torch.float32 else dict(rtol=1e-9, atol=1e-9)
    diagnose(what, out, expected, [
        (lambda: (losses.sum() / losses.numel()).to(logits.dtype), "it takes the mean over every position, the masked "
         "ones counted as zero", "divide by the number of counted positions (targets != IGNORE), not by batch × seq: "
         "the padding and the prompt must not dilute the loss"),
        (lambda: (losses.sum(-1) / counted.clamp(min=1)).mean().to(logits.dtype), "it averages each example first, "
         "then the examples: the tokens of a long reply weigh less than those of a short one", "take one mean over "
         "all counted tokens of the batch together, so that every token weighs the same"),
        (lambda: F.cross_entropy(flat, flat_targets.clamp(min=0)).to(logits.dtype), "the IGNORE (-100) positions are "
         "not removed before the loss", "keep only the positions whose target is not IGNORE (a boolean mask), then "
         "take the cross-entropy of those"),
        (lambda: losses.sum().to(logits.dtype), "it returns the sum over the counted tokens, not their mean",
         "divide by the number of counted tokens: the loss's size must not depend on the batch"),
    ], "the mean cross-entropy over the positions whose target is not IGNORE", **tolerance)


# ---------------------------------------------------------------------------------------------------------
# Step 5 · the exact-match grade
# ---------------------------------------------------------------------------------------------------------

def _grade_case(gen: torch.Generator, batch: int, seq: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits whose argmax is known, and targets: row 0 right with a masked prompt, row 1 right but for one position,
    row 2 wrong everywhere, row 3 right and unmasked, further rows random."""
    preds = torch.randint(0, vocab, (batch, seq), generator=gen)
    logits = torch.randn(batch, seq, vocab, generator=gen, dtype=torch.float64) + 6 * F.one_hot(preds, vocab)
    targets = preds.clone()
    targets[0, :2] = IGNORE
    targets[1, 0] = IGNORE
    targets[1, -1] = (preds[1, -1] + 1) % vocab
    targets[2] = (preds[2] + 1) % vocab
    targets[2, 0] = IGNORE
    for row in range(4, batch):
        targets[row] = torch.where(torch.rand(seq, generator=gen) < 0.3, (preds[row] + 1) % vocab, preds[row])
        targets[row, 0] = IGNORE
    return logits, targets


def check_exact_match(exact_match: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Check ``exact_match(logits, targets)`` -> a bool tensor (batch,): True where the argmax over the vocabulary
    equals the target at every position whose target is not IGNORE. A square case first (batch = seq = vocab, so
    that an argmax over the wrong dimension computes something), then (6, 4, 9).

    Mistakes it recognises: any position right instead of all of them; the masked positions compared too (a
    prompt's IGNORE never equals a token, so every masked example fails); the argmax over the wrong dimension; one
    answer for the whole batch; another dtype than bool.
    """
    gen = generator(5)
    for batch, seq, vocab in [(5, 5, 5), (6, 4, 9)]:
        logits, targets = _grade_case(gen, batch, seq, vocab)
        what = f"exact_match(logits of shape {tuple(logits.shape)}, targets with IGNORE)"
        out = call(what, exact_match, logits.clone(), targets.clone())
        if isinstance(out, torch.Tensor) and out.dim() == 0:
            fail(f"{what} returned one answer for the whole batch (a 0-d tensor)", "grade each example: reduce over "
                 "the positions only (dim=-1), one True or False per example")
        out = expect_tensor(what, out, (batch,), "one True or False per example: reduce over the positions (the last "
                            "dimension of targets)", returns="return a bool tensor, one entry per example")
        if out.dtype != torch.bool:
            fail(f"{what} returned {out.dtype}, not torch.bool", "one True or False per example: an exact match "
                 "is all or nothing, not a share of the positions")
        keep = targets != IGNORE
        expected = ((logits.argmax(-1) == targets) | ~keep).all(-1)
        if torch.equal(out, expected):
            continue
        variants = [
            (lambda: ((logits.argmax(-1) == targets) & keep).any(-1), "it counts an example as right when any "
             "position is right", "an exact match needs every counted position right: all, not any"),
            (lambda: ((logits.argmax(-1) == targets) | ~keep).any(-1), "it counts an example as right when any "
             "position is right", "an exact match needs every counted position right: all, not any"),
            (lambda: (logits.argmax(-1) == targets).all(-1), "the masked positions are compared too, and IGNORE never "
             "equals a token", "skip the positions whose target is IGNORE: count them as matching"),
            (lambda: ((logits.argmax(1) == targets) | ~keep).all(-1), "the argmax runs over the wrong dimension",
             "the prediction at each position is the argmax over the vocabulary, the last dimension of the logits"),
            (lambda: ((logits.argmax(0) == targets) | ~keep).all(-1), "the argmax runs over the wrong dimension",
             "the prediction at each position is the argmax over the vocabulary, the last dimension of the logits"),
        ]
        for wrong, mistake, fix in variants:
            try:
                wrong = wrong()
            except RuntimeError:  # that mistake cannot run on these shapes
                continue
            if not torch.equal(wrong, expected) and torch.equal(out, wrong):
                fail(mistake, fix, f"on {what}: {out.tolist()}, expected {expected.tolist()}")
        fail(f"{what} returned {out.tolist()}, expected {expected.tolist()}", "True exactly when the argmax over the "
             "vocabulary equals the target at every position whose target is not IGNORE")
    passed("exact_match: one bool per example, True when every counted position's argmax is its target")
