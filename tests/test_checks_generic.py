"""The generic verdicts of every learner check, once, parametrised over all of them (checks/_harness.py writes them).

Each check in ``checks/`` and ``checks/steps/`` is handed its right implementation with one generic mistake planted
in it: a stub that still raises ``NotImplementedError``, a crash, something that is not a tensor where a tensor
belongs, a tensor on another device (the meta device, so no GPU is needed) and one in another dtype. Its verdict must
be the harness's: "<the stub> is not written yet", "<what> raised RuntimeError (boom)", "... not a tensor",
"... on meta", "... float32 ...". The mistakes of each component are planted in ``tests/test_checks_<module>.py`` and
``tests/test_steps_<module>.py``; a check added to the package must be added to ``LEARNERS`` below
(``test_every_check_is_here`` says which).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
import types
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch

import test_steps_attention as attention_steps
import test_steps_embedding as embedding_steps
import test_steps_kv_cache as kv_cache_steps
import test_steps_linear as linear_steps
import test_steps_multihead_attention as multihead_steps
import test_steps_pretrained as pretrained_steps
import test_steps_rmsnorm as rmsnorm_steps
import test_steps_rope as rope_steps
import test_steps_softmax as softmax_steps
import test_steps_swiglu as swiglu_steps
import test_steps_tokenizer as tokenizer_steps
import test_steps_training as training_steps
import test_steps_transformer_block as block_steps
import test_steps_transformer_lm as lm_steps
import test_kv_cache_exercises as kv_exercise_tests
import test_training_exercises as training_exercise_tests
import transformer_from_scratch as tfs
from transformer_from_scratch import checks
from transformer_from_scratch.checks import _harness
from transformer_from_scratch.checks.steps import (attention, embedding, kv_cache, kv_cache_exercises as kv_exercises,
                                                   linear, multihead_attention, rmsnorm, rope, softmax, swiglu,
                                                   tokenizer, tokenizer_exercises as tokenizer_answers, pretrained_exercises, training,
                                                   training_exercises as training_answers, transformer_block,
                                                   transformer_lm)
from transformer_from_scratch import pretrained
from transformer_from_scratch.checks.steps import pretrained as pretrained_checks
from transformer_from_scratch import finetune as ft
from transformer_from_scratch.checks.steps import finetune as finetune_checks
from transformer_from_scratch import fast_decode as fd
from transformer_from_scratch.checks.steps import fast_decode as fast_decode_checks
from transformer_from_scratch.kv_cache import KVCache
from transformer_from_scratch.transformer_lm import generate


def repeat_kv(t: torch.Tensor, group: int) -> torch.Tensor:
    """Notebook 08's grouped-query step, right (its mistakes: tests/test_grouped_query_attention.py)."""
    return t.repeat_interleave(group, dim=-3)


@dataclass(frozen=True)
class Learner:
    """What a check is handed, right, and where the generic mistakes are planted: in argument ``slot`` (the function
    itself, or its ``method`` for a class); ``tensor``: what it returns is a tensor (or a tuple of tensors)."""

    check: Callable[..., None]
    right: tuple[Any, ...]
    method: str | None = None
    tensor: bool = True
    slot: int = 0
    dtype: bool = True  # it returns floating-point tensors, whose dtype follows the inputs'

    @property
    def id(self) -> str:
        module = self.check.__module__.removeprefix("transformer_from_scratch.checks.")
        return f"{module}.{self.check.__name__}"


def component(check: Callable[..., None], cls: type, method: str = "forward", tensor: bool = True,
              dtype: bool = True) -> Learner:
    return Learner(check, (cls,), method, tensor, dtype=dtype)


def function(check: Callable[..., None], fn: Callable[..., Any], tensor: bool = True, dtype: bool = True) -> Learner:
    return Learner(check, (fn,), None, tensor, dtype=dtype)


LEARNERS = [
    # the components (checks/<module>.py), on the package's own
    component(checks.check_linear, tfs.Linear),
    component(checks.check_embedding, tfs.Embedding),
    function(checks.check_softmax, tfs.softmax),
    component(checks.check_rmsnorm, tfs.RMSNorm),
    function(checks.check_scaled_dot_product_attention, tfs.scaled_dot_product_attention),
    component(checks.check_rope, tfs.RotaryPositionalEmbedding),
    function(checks.check_silu, tfs.silu),
    component(checks.check_swiglu, tfs.SwiGLU),
    component(checks.check_multihead_self_attention, tfs.MultiHeadSelfAttention),
    component(checks.check_transformer_block, tfs.TransformerBlock),
    component(checks.check_transformer_lm, tfs.TransformerLM),
    component(checks.check_kv_cache, KVCache, "update", dtype=False),  # views of its buffers, not new tensors
    function(checks.check_generate, generate, dtype=False),  # ids
    function(checks.check_cross_entropy, tfs.cross_entropy),
    component(checks.check_adamw, tfs.AdamW, "step", tensor=False),
    function(checks.check_lr_cosine_schedule, tfs.lr_cosine_schedule, tensor=False),
    function(checks.check_gradient_clipping, tfs.gradient_clipping, tensor=False),
    function(checks.check_get_batch, tfs.get_batch, dtype=False),  # ids
    Learner(checks.check_checkpoint, (tfs.save_checkpoint, tfs.load_checkpoint), tensor=False),
    # the steps (checks/steps/<module>.py), on the right steps of tests/test_steps_<module>.py
    function(linear.check_apply_weight, linear_steps.apply_weight),
    function(linear.check_recipe_std, linear_steps.recipe_std, tensor=False),
    function(linear.check_init_weight, linear_steps.init_weight, dtype=False),  # no dtype argument
    function(embedding.check_lookup, embedding_steps.lookup),
    function(embedding.check_one_hot_lookup, embedding_steps.one_hot_lookup),
    function(embedding.check_refuse_out_of_range, embedding_steps.refuse_out_of_range, tensor=False),
    function(embedding.check_init_table, embedding_steps.init_table, dtype=False),  # no dtype argument
    function(softmax.check_naive_softmax, softmax_steps.naive_softmax),
    function(softmax.check_stable_softmax, softmax_steps.stable_softmax),
    function(softmax.check_softmax_backward, softmax_steps.softmax_backward),
    component(softmax.check_softmax_by_hand, softmax_steps.by_hand()),
    function(rmsnorm.check_rms, rmsnorm_steps.rms),
    function(rmsnorm.check_rms_norm, rmsnorm_steps.rms_norm),
    function(rmsnorm.check_rms_norm_upcast, rmsnorm_steps.rms_norm_upcast),
    function(attention.check_attention_scores, attention_steps.attention_scores),
    function(attention.check_attend, attention_steps.attend),
    function(attention.check_masked_scores, attention_steps.masked_scores),
    function(attention.check_attend_masked, attention_steps.attend_masked),
    function(rope.check_rotate_pair, rope_steps.rotate_pair, tensor=False),
    function(rope.check_inverse_frequencies, rope_steps.inverse_frequencies),
    function(rope.check_angle_table, rope_steps.angle_table),
    function(rope.check_rotate_pairs, rope_steps.rotate_pairs),
    function(rope.check_rotate_pairs_complex, rope_steps.rotate_pairs_complex),
    function(swiglu.check_silu_draft, swiglu_steps.silu_draft),
    function(swiglu.check_gated, swiglu_steps.gated),
    function(swiglu.check_swiglu_draft, swiglu_steps.swiglu_draft),
    function(swiglu.check_hidden_width, swiglu_steps.hidden_width, tensor=False),
    function(multihead_attention.check_split_heads, multihead_steps.split_heads),
    function(multihead_attention.check_merge_heads, multihead_steps.merge_heads),
    function(multihead_attention.check_causal_mask, multihead_steps.causal_mask, dtype=False),  # bool
    function(multihead_attention.check_rotate_heads, multihead_steps.rotate_heads),
    function(multihead_attention.check_multihead_draft, multihead_steps.multihead_draft),
    function(multihead_attention.check_repeat_kv, repeat_kv),
    function(transformer_block.check_make_parts, block_steps.make_parts, tensor=False),
    function(transformer_block.check_pre_norm_residual, block_steps.pre_norm_residual),
    function(transformer_block.check_post_norm_residual, block_steps.post_norm_residual),
    function(transformer_block.check_block_forward, block_steps.block_forward),
    function(transformer_lm.check_make_parts, lm_steps.make_parts, tensor=False),
    function(transformer_lm.check_lm_forward, lm_steps.lm_forward),
    function(transformer_lm.check_forward_flops, lm_steps.forward_flops, tensor=False),
    function(transformer_lm.check_temperature_probs, lm_steps.temperature_probs),
    function(transformer_lm.check_top_k_filter, lm_steps.top_k_filter),
    function(transformer_lm.check_top_p_filter, lm_steps.top_p_filter),
    function(transformer_lm.check_generation_loop, lm_steps.generation_loop, dtype=False),  # ids
    function(training.check_log_sum_exp, training_steps.log_sum_exp),
    function(training.check_mean_cross_entropy, training_steps.mean_cross_entropy),
    function(training.check_adamw_update, training_steps.adamw_update),
    function(training.check_warmup_cosine, training_steps.warmup_cosine, tensor=False),
    function(training.check_clip_grads, training_steps.clip_grads, tensor=False),
    function(training.check_sample_windows, training_steps.sample_windows, tensor=False),  # numpy arrays will do
    function(training_answers.check_state_bytes, training_exercise_tests.state_bytes, tensor=False),
    function(kv_cache.check_append_to_cache, kv_cache_steps.append_to_cache, dtype=False),  # views
    function(kv_cache.check_causal_mask_with_cache, kv_cache_steps.causal_mask_with_cache, dtype=False),  # bool
    function(kv_cache.check_attention_step, kv_cache_steps.attention_step),
    function(kv_cache.check_lm_step, kv_cache_steps.lm_step),
    function(kv_cache.check_greedy_with_cache, kv_cache_steps.greedy_with_cache, dtype=False),  # ids
    function(kv_exercises.check_gqa_attention, kv_exercise_tests.gqa_attention),
    # notebook 13: text in, ids out (not tensors)
    function(checks.check_train_bpe, tfs.train_bpe, tensor=False),
    component(checks.check_tokenizer, tfs.Tokenizer, "encode", tensor=False),
    function(tokenizer.check_split_on_special, tokenizer_steps.split_on_special, tensor=False),
    function(tokenizer.check_count_pretokens, tokenizer_steps.count_pretokens, tensor=False),
    function(tokenizer.check_merge_word, tokenizer_steps.merge_word, tensor=False),
    function(tokenizer.check_naive_merges, tokenizer_steps.naive_merges, tensor=False),
    function(tokenizer.check_encode_pretoken, tokenizer_steps.encode_pretoken, tensor=False),
    # notebook 14: a real model from a GGUF file
    function(checks.check_load_gguf, pretrained.load_gguf, tensor=False),
    function(checks.check_chat, pretrained.chat, tensor=False),
    function(pretrained_checks.check_model_config, pretrained_steps.model_config, tensor=False),
    function(pretrained_checks.check_dequantize_q8_0, pretrained_steps.dequantize_q8_0),
    function(pretrained_checks.check_dequantize_q4_1, pretrained_steps.dequantize_q4_1),
    function(pretrained_checks.check_our_name, pretrained_steps.our_name, tensor=False),
    function(pretrained_checks.check_tokenizer_from_gguf, pretrained_steps.tokenizer_from_gguf, tensor=False),
    function(pretrained_checks.check_chat_prompt, pretrained_steps.chat_prompt, tensor=False),
    function(pretrained_checks.check_state_dict_from, pretrained.state_dict_from, tensor=False),
    function(pretrained_checks.check_with_tied_head, pretrained.with_tied_head, tensor=False),
    function(pretrained_checks.check_model_from_state, pretrained.model_from_state, tensor=False),
    # notebook 15: LoRA fine-tuning
    component(checks.check_lora_linear, ft.LoRALinear),
    function(checks.check_apply_lora, ft.apply_lora, tensor=False),
    function(finetune_checks.check_lora_delta, ft.lora_delta),
    function(finetune_checks.check_assistant_targets, ft.assistant_targets, tensor=False),
    function(finetune_checks.check_pad_batch, ft.pad_batch, dtype=False),  # ids
    function(finetune_checks.check_masked_cross_entropy, ft.masked_cross_entropy),
    function(finetune_checks.check_exact_match, ft.exact_match, dtype=False),  # bool
    # notebook 16: decoding fast
    component(checks.check_int8_linear, fd.Int8Linear),
    component(checks.check_fused_self_attention, fd.FusedSelfAttention),
    component(checks.check_fused_swiglu, fd.FusedSwiGLU),
    function(checks.check_prepare_for_decode, fd.prepare_for_decode, tensor=False),
    function(checks.check_static_step, fd.static_step),
    function(fast_decode_checks.check_decode_bytes, fd.decode_bytes, tensor=False),
    function(fast_decode_checks.check_column_major, fd.column_major),
    function(fast_decode_checks.check_fuse_weights, fd.fuse_weights),
    function(fast_decode_checks.check_split_qkv, fd.split_qkv),
    function(fast_decode_checks.check_quantize_int8, fd.quantize_int8),
    function(fast_decode_checks.check_int8_matmul, fd.int8_matmul),
    function(fast_decode_checks.check_attend_at, fd.attend_at),
]
# Checks of an answer (a number the learner computed), not of code: there is no call to plant a mistake in.
ANSWERS = [kv_exercises.check_kv_cache_gib, kv_exercises.check_t_attention, training_answers.check_unigram_loss,
           tokenizer_answers.check_first_merges, tokenizer_answers.check_digits3_pattern,
           tokenizer_answers.check_context_bytes, pretrained_exercises.check_bits_per_weight,
           pretrained_exercises.check_unpermute, pretrained_exercises.check_kv_cache_bytes,
           pretrained_checks.check_times_smaller]
TENSORS = [learner for learner in LEARNERS if learner.tensor]
FLOATS = [learner for learner in TENSORS if learner.dtype]
CLASSES = [learner for learner in LEARNERS if inspect.isclass(learner.right[learner.slot])
           and not issubclass(learner.right[learner.slot], torch.autograd.Function)]  # built, so __init__ runs


def every_check() -> set[Callable[..., None]]:
    """Every ``check_*`` function that a module of ``checks`` (and of ``checks.steps``) defines."""
    found = set()
    for info in pkgutil.walk_packages(checks.__path__, f"{checks.__name__}."):
        module = importlib.import_module(info.name)
        found |= {fn for name, fn in vars(module).items()
                  if name.startswith("check_") and inspect.isfunction(fn) and fn.__module__ == module.__name__
                  and module is not _harness}
    return found


def test_every_check_is_here():
    listed = [learner.check for learner in LEARNERS] + ANSWERS
    assert len(set(listed)) == len(listed), "a check is listed twice"
    missing = every_check() - set(listed)
    assert not missing, f"add {sorted(f'{c.__module__}.{c.__name__}' for c in missing)} to LEARNERS (or ANSWERS)"
    assert set(listed) <= every_check()


# ---------------------------------------------------------------------------------------------- planting a mistake

def _untensor(out: Any) -> Any:
    """The same values as Python lists (a tuple or list of tensors, element by element)."""
    if isinstance(out, torch.Tensor):
        return out.tolist()
    return type(out)(_untensor(t) for t in out) if isinstance(out, (tuple, list)) else out


def _to_meta(out: Any) -> Any:
    """The same tensors on the meta device (where no CPU input of a check lies)."""
    if isinstance(out, torch.Tensor):
        return out.to("meta")
    return type(out)(_to_meta(t) for t in out) if isinstance(out, (tuple, list)) else out


@dataclass(frozen=True)
class Mistake:
    """What the learner's function does instead of the right thing: raise ``raises()``, or ``change`` the right result."""

    raises: Callable[[], Exception] | None = None
    change: Callable[[Any], Any] | None = None


def _other_dtype(out: Any) -> Any:
    """The same floating-point tensors in another dtype (float64 as float32, any other as float64)."""
    if isinstance(out, torch.Tensor):
        return out.to(torch.float32 if out.dtype == torch.float64 else torch.float64) if out.is_floating_point() else out
    return type(out)(_other_dtype(t) for t in out) if isinstance(out, (tuple, list)) else out


MISTAKES = {"stub": Mistake(raises=NotImplementedError), "crash": Mistake(raises=lambda: RuntimeError("boom")),
            "not a tensor": Mistake(change=_untensor), "on another device": Mistake(change=_to_meta),
            "in another dtype": Mistake(change=_other_dtype)}


def _named(fn: Callable[..., Any], qualname: str) -> Callable[..., Any]:
    """``fn`` under the learner's name, as its frames show it (a stub's verdict names the function that raised)."""
    fn.__code__ = fn.__code__.replace(co_name=qualname.rsplit(".", 1)[-1], co_qualname=qualname)
    return fn


def planted(right: Any, method: str | None, mistake: Mistake) -> Any:
    """``right`` with ``mistake`` in the function itself, or in ``method`` of a subclass under the class's name."""
    original = right if method is None else inspect.getattr_static(right, method)
    static = isinstance(original, staticmethod)
    inner = original.__func__ if static else original

    def learners(*args: Any, **kwargs: Any) -> Any:
        if mistake.raises is not None:
            raise mistake.raises()
        return mistake.change(inner(*args, **kwargs))
    replaced = functools.wraps(inner)(_named(learners, right.__qualname__ if method is None else
                                              f"{right.__name__}.{method}"))
    if method is None:
        return replaced
    return types.new_class(right.__name__, (right,), exec_body=lambda namespace: namespace.update(
        {method: staticmethod(replaced) if static else replaced}))


def verdict(learner: Learner, mistake: str, method: str | None = None) -> str:
    """The first line of the check's verdict on the right arguments with ``mistake`` planted in the learner's slot."""
    args = list(learner.right)
    args[learner.slot] = planted(args[learner.slot], method or learner.method, MISTAKES[mistake])
    with pytest.raises(AssertionError) as error:
        learner.check(*args)
    return str(error.value).splitlines()[0]


def _stub_name(learner: Learner, method: str | None = None) -> str:
    right = learner.right[learner.slot]
    return f"{right.__name__}.{method or learner.method}" if learner.method else right.__qualname__


# ---------------------------------------------------------------------------------------------- the generic tests

@pytest.mark.parametrize("learner", LEARNERS, ids=lambda learner: learner.id)
def test_a_stub_is_not_written_yet(learner):
    first = verdict(learner, "stub")
    assert first == f"{_stub_name(learner)} is not written yet (it raises NotImplementedError): {_harness.STUB_FIX}.", first


@pytest.mark.parametrize("learner", CLASSES, ids=lambda learner: learner.id)
def test_a_stub_of_init_is_not_written_yet(learner):
    first = verdict(learner, "stub", "__init__")
    assert first.startswith(f"{_stub_name(learner, '__init__')} is not written yet"), first


@pytest.mark.parametrize("learner", LEARNERS, ids=lambda learner: learner.id)
def test_a_crash_names_what_raised_it(learner):
    first = verdict(learner, "crash")
    assert first.endswith(f" raised RuntimeError (boom): {_harness.CRASH_FIX}."), first


@pytest.mark.parametrize("learner", TENSORS, ids=lambda learner: learner.id)
def test_what_is_not_a_tensor_is_named(learner):
    first = verdict(learner, "not a tensor")
    assert "not a tensor" in first and "returned" in first, first


@pytest.mark.parametrize("learner", TENSORS, ids=lambda learner: learner.id)
def test_a_tensor_on_another_device_is_named(learner):
    first = verdict(learner, "on another device")
    assert " on meta" in first, first  # "... a tensor on meta, not on cpu like its inputs", or the device argument's


# ------------------------------------------------------------------------------- which stub the verdict names

class EmbeddingWithHelper(tfs.Embedding):
    def forward(self, token_ids):
        return self.weight[checked_ids(token_ids, self.num_embeddings)]


def checked_ids(token_ids, num_embeddings):
    raise NotImplementedError()


class ResetParametersStub(tfs.RMSNorm):
    def reset_parameters(self):
        raise NotImplementedError()


@pytest.mark.parametrize("check, impl, named", [
    (checks.check_embedding, EmbeddingWithHelper, "checked_ids"),  # the helper, not the forward that called it
    (checks.check_rmsnorm, ResetParametersStub, "ResetParametersStub.reset_parameters"),
    (checks.check_embedding, planted(tfs.Embedding, "reset_parameters", MISTAKES["stub"]), "Embedding.reset_parameters"),
    (softmax.check_softmax_by_hand, planted(softmax_steps.by_hand(), "backward", MISTAKES["stub"]),
     "SoftmaxByHand.backward"),
])
def test_the_stub_named_is_the_function_that_raised(check, impl, named):
    with pytest.raises(AssertionError) as error:
        check(impl)
    assert str(error.value).startswith(f"{named} is not written yet (it raises NotImplementedError)"), str(error.value)


def test_a_stub_in_pytorch_names_what_was_called():
    """nn.Module's forward when none is written raises NotImplementedError inside PyTorch: the call is named."""
    class NoForward(torch.nn.Module):
        def __init__(self, in_features, out_features, device=None, dtype=None):
            super().__init__()
            self.weight = tfs.Linear(in_features, out_features, device=device, dtype=dtype).weight

    with pytest.raises(AssertionError, match=r"^Linear\(6, 6\)\(x of shape \(2, 5, 6\), torch.float32\) is not written"):
        checks.check_linear(NoForward)


def test_the_learners_own_assert_is_a_crash_not_a_verdict():
    """An ``assert`` in the learner's code fails there, not in the check: it is reported as what raised it."""
    class Asserts(tfs.Linear):
        def forward(self, x):
            assert x.shape[-1] > 100, "only wide inputs"
            return super().forward(x)

    with pytest.raises(AssertionError, match=r"raised AssertionError \(only wide inputs\)") as error:
        checks.check_linear(Asserts)
    assert isinstance(error.value.__cause__, AssertionError)


@pytest.mark.parametrize("learner", FLOATS, ids=lambda learner: learner.id)
def test_a_tensor_in_another_dtype_is_named(learner):
    first = verdict(learner, "in another dtype")
    assert "float32" in first or "float64" in first, first


def _raise(error):
    raise error


@pytest.mark.parametrize("run, verdict", [
    (lambda: [1, 2], r"^f\(x\) returned a list: x is accepted: refuse it\.$"),
    (lambda: _raise(KeyError("x")), r"^f\(x\) raised KeyError \('x'\), not ValueError: refuse it\.$"),
    (lambda: _raise(TypeError()), r"^f\(x\) raised TypeError, not ValueError: refuse it\.$"),
    (lambda: _raise(NotImplementedError("write it")), r"^_raise is not written yet"),  # the function that raised it
], ids=["returns", "another error", "another error without a message", "a stub"])
def test_a_refusal_names_what_happened_instead(run, verdict):
    """The harness's one refusal check: returning, another error (its first line), a stub, each its own verdict."""
    with pytest.raises(AssertionError, match=verdict):
        _harness.refuses("f(x)", run, ValueError, "x is accepted", "refuse it")


def test_a_refusal_returns_the_error_for_its_message():
    error = ValueError("x is not llama")
    assert _harness.refuses("f(x)", lambda: _raise(error), ValueError, "x is accepted", "refuse it") is error
    assert "returned 'ok'" in str(pytest.raises(AssertionError, _harness.refuses, "f(x)", lambda: "ok", ValueError,
                                                "accepted", "refuse it", shown=repr).value)
