"""Checks that tell a learner precisely what is wrong with the component they wrote.

One function per component, ``check_<component>(impl)``: ``impl`` is the learner's class (constructed with
the signature the course fixes, see CONTRACT.md) or function.

* Right: it returns ``None`` and prints one line saying what was checked.
* Wrong: it raises ``AssertionError`` whose first line names the most likely mistake and how to fix it;
  the lines after it give the evidence. Each check's docstring lists the mistakes it recognises by name.

Each runs in about a second on a CPU, on inputs drawn from a fixed seed. In a notebook::

    from transformer_from_scratch.checks import check_linear
    check_linear(Linear)
"""

from .attention import check_scaled_dot_product_attention
from .embedding import check_embedding
from .linear import check_linear
from .multihead_attention import check_multihead_self_attention
from .rmsnorm import check_rmsnorm
from .rope import check_rope
from .softmax import check_softmax
from .swiglu import check_silu, check_swiglu
from .transformer_block import check_transformer_block
from .transformer_lm import check_transformer_lm
from .kv_cache import check_kv_cache
from .generate import check_generate
from .training import (check_adamw, check_checkpoint, check_cross_entropy, check_get_batch, check_gradient_clipping,
                       check_lr_cosine_schedule)
from .tokenizer import check_tokenizer, check_train_bpe
from .pretrained import check_chat, check_load_gguf
from .finetune import check_apply_lora, check_lora_linear
from .fast_decode import (check_fused_self_attention, check_fused_swiglu, check_int8_linear, check_prepare_for_decode,
                          check_static_step)

__all__ = [
    "check_linear",
    "check_embedding",
    "check_softmax",
    "check_rmsnorm",
    "check_scaled_dot_product_attention",
    "check_rope",
    "check_silu",
    "check_swiglu",
    "check_multihead_self_attention",
    "check_transformer_block",
    "check_transformer_lm",
    "check_kv_cache",
    "check_generate",
    "check_cross_entropy",
    "check_adamw",
    "check_lr_cosine_schedule",
    "check_gradient_clipping",
    "check_get_batch",
    "check_checkpoint",
    "check_train_bpe",
    "check_tokenizer",
    "check_load_gguf",
    "check_chat",
    "check_lora_linear",
    "check_apply_lora",
    "check_int8_linear",
    "check_fused_self_attention",
    "check_fused_swiglu",
    "check_prepare_for_decode",
    "check_static_step",
]
