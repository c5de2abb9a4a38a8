"""Transformer LM from scratch: the components built in the course notebooks, and their checks.

Each component module is generated from its notebook (``notebooks/01_linear.ipynb`` -> ``linear.py``);
edit the notebook, not the module. ``checks`` tells a learner precisely what is wrong with their own
version of a component (``from transformer_from_scratch.checks import check_linear``). ``nbtools`` is
the tooling that authors and runs the notebooks (export, student edition, figures), not the model.

Every component checks its arguments' shapes at run time (``shapes.shape_checked``); training runs and
benchmarks turn that off with ``set_shape_checks(False)`` or ``with shape_checks(False): ...``.
"""

from .linear import Linear
from .embedding import Embedding
from .softmax import softmax
from .rmsnorm import RMSNorm
from .attention import scaled_dot_product_attention
from .rope import RotaryPositionalEmbedding
from .swiglu import SwiGLU, silu, swiglu_hidden_size
from .multihead_attention import MultiHeadSelfAttention
from .transformer_block import TransformerBlock
from .shapes import set_shape_checks, shape_checks, shape_checks_enabled, trusted
from .transformer_lm import TransformerLM, count_resources, generate, next_token_distribution
from .training import (AdamW, GPT2StyleLM, cross_entropy, get_batch, gradient_clipping, load_checkpoint,
                       lr_cosine_schedule, save_checkpoint, tokenize_file)
from .kv_cache import KVCache
from .tokenizer import GPT2_PATTERN, Tokenizer, bytes_to_unicode, train_bpe
# Notebook 14's chat() stays in transformer_from_scratch.pretrained: transformer_from_scratch.chat is `make chat`.
from .pretrained import (chat_prompt, chat_turn, default_system, dequantize_q4_1, dequantize_q8_0, load_gguf,
                         model_config, model_from_state, open_gguf, our_name, read_metadata, state_dict_from, tensor_of,
                         tokenizer_from_gguf, with_tied_head)
from .finetune import (LoRALinear, apply_lora, assistant_targets, encode_example, exact_match, held_out, lora_delta,
                       masked_cross_entropy, pad_batch, reverse_task, wilson_interval)
from .fast_decode import (FusedMatmul, FusedSelfAttention, FusedSwiGLU, Int8Linear, attend_at, column_major,
                          copy_bandwidth, decode_bytes, faster_layout, fuse_weights, int8_matmul, prepare_for_decode,
                          quantize_int8, split_qkv, static_step)

__all__ = ["Linear", "Embedding", "softmax", "RMSNorm", "scaled_dot_product_attention", "RotaryPositionalEmbedding", "silu", "SwiGLU", "swiglu_hidden_size", "MultiHeadSelfAttention", "TransformerBlock", "TransformerLM", "count_resources", "next_token_distribution", "generate",
           "cross_entropy", "AdamW", "lr_cosine_schedule", "gradient_clipping", "tokenize_file", "get_batch",
           "save_checkpoint", "load_checkpoint", "GPT2StyleLM", "KVCache",
           "train_bpe", "Tokenizer", "bytes_to_unicode", "GPT2_PATTERN",
           "read_metadata", "model_config", "dequantize_q8_0", "dequantize_q4_1", "tensor_of", "our_name",
           "tokenizer_from_gguf", "default_system", "chat_prompt", "open_gguf", "state_dict_from", "with_tied_head",
           "model_from_state", "load_gguf", "chat_turn",
           "lora_delta", "assistant_targets", "pad_batch", "masked_cross_entropy", "exact_match", "LoRALinear",
           "apply_lora", "held_out", "reverse_task", "encode_example", "wilson_interval",
           "decode_bytes", "column_major", "fuse_weights", "split_qkv", "quantize_int8", "int8_matmul", "Int8Linear",
           "FusedMatmul", "FusedSelfAttention", "FusedSwiGLU", "faster_layout", "prepare_for_decode", "copy_bandwidth",
           "attend_at", "static_step",
           "set_shape_checks", "shape_checks", "shape_checks_enabled", "trusted"]
