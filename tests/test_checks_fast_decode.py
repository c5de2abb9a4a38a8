"""check_int8_linear, check_fused_swiglu, check_fused_self_attention and check_prepare_for_decode pass the course's
Int8Linear, FusedSwiGLU, FusedSelfAttention and prepare_for_decode (src/transformer_from_scratch/fast_decode.py) and
name each classic mistake, planted here as a small wrong version of them."""

import copy

import torch
import torch.nn.functional as F
from torch import nn

from transformer_from_scratch.checks import (check_fused_self_attention, check_fused_swiglu, check_int8_linear,
                                             check_prepare_for_decode, check_static_step)
from transformer_from_scratch.fast_decode import (KERNEL_ROWS, FusedMatmul, FusedSelfAttention, FusedSwiGLU,
                                                  Int8Linear, _has_int8_kernel, column_major, fuse_weights,
                                                  attend_at, int8_matmul, prepare_for_decode, quantize_int8,
                                                  split_qkv, static_step)
from transformer_from_scratch.linear import Linear
from transformer_from_scratch.multihead_attention import _check_input
from mutants import LEARNERS_LINEAR, Catalogue


def test_the_course_passes_with_one_line(capsys):
    assert check_int8_linear(Int8Linear) is None
    assert check_fused_swiglu(FusedSwiGLU) is None
    assert check_fused_self_attention(FusedSelfAttention) is None
    assert check_prepare_for_decode(prepare_for_decode) is None
    assert check_static_step(static_step) is None
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["✓ check_int8_linear", "✓ check_fused_swiglu",
                                                      "✓ check_fused_self_attention", "✓ check_prepare_for_decode",
                                                      "✓ check_static_step"]


def test_the_threads_are_given_back():
    threads = torch.get_num_threads()
    check_prepare_for_decode(prepare_for_decode)
    assert torch.get_num_threads() == threads


STUDENT_NOTEBOOK = """
import torch
from torch import nn
from transformer_from_scratch.fast_decode import FusedSelfAttention, FusedSwiGLU, Int8Linear, fuse_weights

""" + LEARNERS_LINEAR + """
def _quantize(module):
    for name, child in list(module.named_children()):
        if isinstance(child, (FusedSelfAttention, FusedSwiGLU)):
            for unread in ("q_proj", "k_proj", "v_proj", "output_proj", "w1", "w2", "w3"):
                if hasattr(child, unread):
                    setattr(child, unread, None)
            for fused in ("qkv", "out", "w13", "down"):
                if hasattr(child, fused) and not isinstance(getattr(child, fused), Int8Linear):
                    setattr(child, fused, Int8Linear(getattr(child, fused).weight))
        elif isinstance(child, Linear):
            setattr(module, name, Int8Linear(child.weight))
        else:
            _quantize(child)

def prepare_for_decode(model, *, fuse=True, layout="auto", int8=False, threads=None):
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError("threads")
    if threads is not None:
        torch.set_num_threads(threads)
    if fuse:
        for block in model.layers:
            if not isinstance(block.attn, FusedSelfAttention):
                block.attn = FusedSelfAttention(block.attn, by_columns=layout != "rows")
            if not isinstance(block.ffn, FusedSwiGLU):
                block.ffn = FusedSwiGLU(block.ffn, by_columns=layout != "rows")
        if layout != "rows" and isinstance(model.lm_head, Linear) and not model.lm_head.weight.T.is_contiguous():
            tied = model.lm_head.weight is model.token_embeddings.weight
            fuse_weights(model.lm_head)
            if tied:
                model.token_embeddings.weight = model.lm_head.weight
    if int8:
        _quantize(model)
    return model
"""


def test_the_model_is_made_of_the_linear_the_learners_code_sees(capsys):
    """A prepare_for_decode that knows only the learner's own Linear (in the student edition, my_transformer's) is
    checked on a model made of that Linear."""
    namespace = {}
    exec(STUDENT_NOTEBOOK, namespace)
    check_prepare_for_decode(namespace["prepare_for_decode"])
    assert capsys.readouterr().out.startswith("✓ check_prepare_for_decode")


# ---------------------------------------------------------------------------------------------------- Int8Linear

class FloatKept(Int8Linear):
    def __init__(self, weight):
        super().__init__(weight)
        del self.weight
        self.weight = nn.Parameter(weight.detach().clone())  # the float weight, as it was

    def forward(self, x):
        return x @ self.weight.T.to(x.dtype)


class Int8Parameter(Int8Linear):
    def __init__(self, weight):
        super().__init__(weight)
        q = self.weight
        del self.weight
        self.weight = nn.Parameter(q, requires_grad=False)


class FloatBuffer(Int8Linear):
    def __init__(self, weight):
        super().__init__(weight)
        q, scale = quantize_int8(weight)
        self.weight = q.float() * scale[:, None]  # dequantized, kept in float32

    def forward(self, x):
        return x @ self.weight.T.to(x.dtype)


class Transposed(Int8Linear):
    def __init__(self, weight):
        super().__init__(weight)
        self.weight = self.weight.T.contiguous()

    def forward(self, x):
        return int8_matmul(x, self.weight.T, self.scale)


class ScaleFloat64(Int8Linear):
    def __init__(self, weight):
        super().__init__(weight)
        self.scale = self.scale.double()


class NotPersistent(nn.Module):
    def __init__(self, weight):
        super().__init__()
        q, scale = quantize_int8(weight)
        self.register_buffer("weight", q, persistent=False)
        self.register_buffer("scale", scale, persistent=False)

    def forward(self, x):
        return int8_matmul(x, self.weight, self.scale)


class PerTensor(Int8Linear):
    def __init__(self, weight):
        super().__init__(weight)
        w = weight.detach().float()
        scale = w.abs().max() / 127
        self.weight = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
        self.scale = scale.expand(w.shape[0]).clone()


class ScaleForgotten(Int8Linear):
    def forward(self, x):
        return int8_matmul(x, self.weight, torch.ones_like(self.scale))


class FloatProduct(Int8Linear):
    def __init__(self, weight):
        super().__init__(weight)
        self.float_weight = weight.detach().clone()  # a plain attribute: no Parameter, no buffer

    def forward(self, x):
        return x @ self.float_weight.T.to(x.dtype)


class NoFallback(Int8Linear):
    def forward(self, x):
        rows = x.reshape(-1, x.shape[-1])
        return torch._weight_int8pack_mm(rows, self.weight, self.scale.to(x.dtype)).unflatten(0, x.shape[:-1])


class NotContiguous(Int8Linear):
    def __init__(self, weight):
        super().__init__(weight)
        w = weight.detach().float()  # keeps a column-major weight's layout, and q takes it
        self.weight = torch.round(w / self.scale[:, None]).clamp(-127, 127).to(torch.int8)


class ScalesNotCast(Int8Linear):
    def forward(self, x):
        if _has_int8_kernel(x) and x.numel() <= KERNEL_ROWS * x.shape[-1]:
            rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
            out = torch._weight_int8pack_mm(rows, self.weight, self.scale)
            return out.to(x.dtype).reshape(*x.shape[:-1], -1)
        return super().forward(x)


class Float32Rows(Int8Linear):
    def forward(self, x):  # the kernel on x's own dtype: right to float32's precision, on the kernel's slow path
        if _has_int8_kernel(x) and x.numel() <= KERNEL_ROWS * x.shape[-1]:
            rows = x.reshape(-1, x.shape[-1])
            out = torch._weight_int8pack_mm(rows, self.weight, self.scale.to(x.dtype))
            return out.reshape(*x.shape[:-1], -1)
        return super().forward(x)


class StepSixOnly(Int8Linear):
    def forward(self, x):
        return int8_matmul(x, self.weight, self.scale)


class Bfloat16Out(Int8Linear):
    def forward(self, x):  # the kernel's bfloat16 result not brought back to x's dtype
        if _has_int8_kernel(x) and x.numel() <= KERNEL_ROWS * x.shape[-1]:
            rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
            out = torch._weight_int8pack_mm(rows, self.weight, self.scale.to(torch.bfloat16))
            return out.reshape(*x.shape[:-1], -1)
        return super().forward(x)


class Float32Out(Int8Linear):
    def forward(self, x):
        return super().forward(x).float()


INT8_MUTANTS = {
    "the float weight kept": (FloatKept, "keeps a float Parameter"),
    "an int8 Parameter": (Int8Parameter, "stores weight as a Parameter, not a buffer"),
    "a float buffer": (FloatBuffer, "Int8Linear(weight of shape (5, 16), float32).weight is torch.float32"),
    "stored transposed": (Transposed, "it is stored transposed"),
    "scale float64": (ScaleFloat64, "expected float32 of shape (5,)"),
    "not persistent": (NotPersistent, "state dict holds [], not weight and scale"),
    "per-tensor": (PerTensor, "uses one scale for the whole matrix"),
    "scale forgotten": (ScaleForgotten, "the scale is forgotten in the forward"),
    "the float weight's product": (FloatProduct, "computes with the float weight"),
    "no float64 fallback": (NoFallback, "crashes on a float64 input"),
    "q not contiguous": (NotContiguous, "q is not contiguous"),
    "scales not cast": (ScalesNotCast, "the kernel's scales are not in its rows' dtype"),
    "float32 rows": (Float32Rows, "the kernel did not get it rounded to bfloat16"),
    "Step 6 only": (StepSixOnly, "the kernel did not get it rounded to bfloat16"),
    "bfloat16 out": (Bfloat16Out, "returned torch.bfloat16 for a torch.float32 input"),
    "float32 out": (Float32Out, "returned torch.float32 for a torch.float64 input"),
}


# ---------------------------------------------------------------------------------------------------- FusedSwiGLU

class SwiGLUDropsLinears(FusedSwiGLU):
    def __init__(self, ffn, *, by_columns=True):
        super().__init__(ffn, by_columns=by_columns)
        self.w1 = self.w3 = None  # the forward does not read them, but the state dict loses their names


class SwiGLUSavesFused(FusedSwiGLU):
    def __init__(self, ffn, *, by_columns=True):
        super().__init__(ffn, by_columns=by_columns)
        self.w13._non_persistent_buffers_set.discard("weight")  # saved under a new name


class SwiGLUCopies(FusedSwiGLU):
    def __init__(self, ffn, *, by_columns=True):  # by_columns ignored: copies, column-major
        nn.Module.__init__(self)
        self.d_model, self.d_ff = ffn.d_model, ffn.d_ff
        self.w1, self.w2, self.w3 = ffn.w1, ffn.w2, ffn.w3
        self.w13 = FusedMatmul(column_major(torch.cat([ffn.w1.weight.detach(), ffn.w3.weight.detach()])))
        self.down = FusedMatmul(ffn.w2.weight.detach())


def _fuse_row_major(*linears):
    fused = torch.cat([linear.weight.detach() for linear in linears])
    start = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight = nn.Parameter(fused[start:start + rows], requires_grad=False)
        start += rows
    return fused


class SwiGLURowMajor(FusedSwiGLU):
    def __init__(self, ffn, *, by_columns=True):  # by_columns ignored: always row by row
        nn.Module.__init__(self)
        self.d_model, self.d_ff = ffn.d_model, ffn.d_ff
        self.w1, self.w2, self.w3 = ffn.w1, ffn.w2, ffn.w3
        self.w13 = FusedMatmul(_fuse_row_major(self.w1, self.w3))
        self.down = FusedMatmul(_fuse_row_major(self.w2))


class SwiGLUSwapped(FusedSwiGLU):
    def forward(self, x):
        up, gate = self.w13(x).split(self.d_ff, dim=-1)
        return self.down(F.silu(gate) * up)


class SwiGLUNoSilu(FusedSwiGLU):
    def forward(self, x):
        gate, up = self.w13(x).split(self.d_ff, dim=-1)
        return self.down(gate * up)


class SwiGLUReadsCopy(FusedSwiGLU):
    def __init__(self, ffn, *, by_columns=True):
        super().__init__(ffn, by_columns=by_columns)
        self.w13 = FusedMatmul(torch.empty_like(self.w13.weight).copy_(self.w13.weight))


class SwiGLUFloat32(FusedSwiGLU):
    def forward(self, x):
        return super().forward(x).float()


class SwiGLUAlwaysColumns(FusedSwiGLU):
    def __init__(self, ffn, *, by_columns=True):
        super().__init__(ffn)  # by_columns not passed on


SWIGLU_MUTANTS = {
    "the Linears dropped": (SwiGLUDropsLinears, "drops ['w1.weight', 'w3.weight'] from the state dict"),
    "the fused matrix saved": (SwiGLUSavesFused, "adds ['w13.weight'] to the state dict"),
    "copies": (SwiGLUCopies, "w1.weight and w3.weight keep their own copies"),
    "row-major": (SwiGLURowMajor, "fused matrix is stored row by row"),
    "halves swapped": (SwiGLUSwapped, "the halves are swapped"),
    "silu left out": (SwiGLUNoSilu, "silu is left out"),
    "the forward reads a copy": (SwiGLUReadsCopy, "the forward reads its own copy of the weights"),
    "by_columns ignored": (SwiGLUAlwaysColumns, "by_columns=False is ignored"),
    "float32 out": (SwiGLUFloat32, "returned torch.float32 for a torch.float64 input"),
}


# ---------------------------------------------------------------------------------------------- FusedSelfAttention

def _thirds(qkv, num_heads, num_kv_heads):
    q, k, v = qkv.chunk(3, dim=-1)
    return (q.unflatten(-1, (num_heads, -1)).transpose(-3, -2), k.unflatten(-1, (num_kv_heads, -1)).transpose(-3, -2),
            v.unflatten(-1, (num_kv_heads, -1)).transpose(-3, -2))


def _strided(qkv, num_heads, num_kv_heads):
    d_k = qkv.shape[-1] // (num_heads + 2 * num_kv_heads)
    parts = qkv.split([num_heads * d_k, num_kv_heads * d_k, num_kv_heads * d_k], dim=-1)
    return tuple(t.unflatten(-1, (-1, n)).movedim(-1, -3) for t, n in zip(parts, (num_heads, num_kv_heads,
                                                                                  num_kv_heads)))


def _attention_class(*, split=split_qkv, causal=True, rope=True, positions=True, swap=False, use_cache=True,
                     past_from_cache=True):
    """FusedSelfAttention with one thing done wrong in its forward (each keyword's default is the right way)."""
    class FusedSelfAttention(FusedSelfAttentionBase):
        def forward(self, x, token_positions=None, *, cache=None):
            past = 0 if cache is None or not past_from_cache else cache.length
            _check_input(self, x, token_positions, past)
            q, k, v = split(self.qkv(x), self.num_heads, self.num_kv_heads)
            if swap:
                k, v = v, k
            if rope:
                where = range(past, past + x.shape[-2]) if token_positions is None or not positions \
                    else token_positions.unsqueeze(-2)
                q, k = self.rope(q, where), self.rope(k, where)
            if cache is not None and use_cache:
                k, v = cache.update(k, v)
            new, total = q.shape[-2], k.shape[-2]
            mask = torch.ones(new, total, dtype=torch.bool).tril(total - new) if causal else None
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[-3] != q.shape[-3])
            return self.out(out.transpose(-3, -2).flatten(-2))
    return FusedSelfAttention


FusedSelfAttentionBase = FusedSelfAttention


class AttentionDropsLinears(FusedSelfAttention):
    def __init__(self, attn, *, by_columns=True):
        super().__init__(attn, by_columns=by_columns)
        self.q_proj = self.k_proj = self.v_proj = None


class AttentionCopies(FusedSelfAttention):
    def __init__(self, attn, *, by_columns=True):  # by_columns ignored: copies, column-major
        nn.Module.__init__(self)
        for name in ("d_model", "num_heads", "num_kv_heads", "d_k", "max_seq_len", "theta"):
            setattr(self, name, getattr(attn, name))
        self.q_proj, self.k_proj, self.v_proj, self.output_proj = attn.q_proj, attn.k_proj, attn.v_proj, \
            attn.output_proj
        self.rope = attn.rope
        self.qkv = FusedMatmul(column_major(torch.cat([p.weight.detach() for p in (self.q_proj, self.k_proj,
                                                                                   self.v_proj)])))
        self.out = FusedMatmul(fuse_weights(self.output_proj))


class AttentionRowMajor(FusedSelfAttention):
    def __init__(self, attn, *, by_columns=True):  # by_columns ignored: always row by row
        nn.Module.__init__(self)
        for name in ("d_model", "num_heads", "num_kv_heads", "d_k", "max_seq_len", "theta"):
            setattr(self, name, getattr(attn, name))
        self.q_proj, self.k_proj, self.v_proj, self.output_proj = attn.q_proj, attn.k_proj, attn.v_proj, \
            attn.output_proj
        self.rope = attn.rope
        self.qkv = FusedMatmul(_fuse_row_major(self.q_proj, self.k_proj, self.v_proj))
        self.out = FusedMatmul(_fuse_row_major(self.output_proj))


class AttentionReadsCopy(FusedSelfAttention):
    def __init__(self, attn, *, by_columns=True):
        super().__init__(attn, by_columns=by_columns)
        self.qkv = FusedMatmul(torch.empty_like(self.qkv.weight).copy_(self.qkv.weight))


class AttentionFloat32(FusedSelfAttention):
    def forward(self, x, token_positions=None, *, cache=None):
        return super().forward(x, token_positions, cache=cache).float()


class AttentionAlwaysColumns(FusedSelfAttention):
    def __init__(self, attn, *, by_columns=True):
        super().__init__(attn)  # by_columns not passed on


ATTENTION_MUTANTS = {
    "the Linears dropped": (AttentionDropsLinears, "drops ['q_proj.weight', 'k_proj.weight', 'v_proj.weight']"),
    "copies": (AttentionCopies, "keep their own copies"),
    "row-major": (AttentionRowMajor, "fused matrix is stored row by row"),
    "equal thirds": (_attention_class(split=_thirds), "the split is probably into equal thirds"),
    "not causal": (_attention_class(causal=False), "the attention is not causal"),
    "no RoPE": (_attention_class(rope=False), "RoPE is not applied to q and k"),
    "token_positions ignored": (_attention_class(positions=False), "token_positions are ignored"),
    "k and v swapped": (_attention_class(swap=True), "k and v are swapped after the split"),
    "strided heads": (_attention_class(split=_strided), "each head takes every num_heads-th feature"),
    "the cache not used": (_attention_class(use_cache=False), "the cache is not used"),
    "positions restart with a cache": (_attention_class(past_from_cache=False), "RoPE's positions restart at 0"),
    "the forward reads a copy": (AttentionReadsCopy, "the forward reads its own copy of the weights"),
    "by_columns ignored": (AttentionAlwaysColumns, "by_columns=False is ignored"),
    "float32 out": (AttentionFloat32, "returned torch.float32 for a torch.float64 input"),
}


# ---------------------------------------------------------------------------------------------- prepare_for_decode

def _quantize_children(module, *, head=True, drop="drop", layer=Int8Linear):
    for name, child in list(module.named_children()):
        if isinstance(child, (FusedSelfAttention, FusedSwiGLU)) and drop == "keep float":
            for fused in ("qkv", "out", "w13", "down"):  # the fused matrices only: the Linears stay in float
                if hasattr(child, fused):
                    setattr(child, fused, layer(getattr(child, fused).weight))
            continue
        if isinstance(child, (FusedSelfAttention, FusedSwiGLU)) and drop == "drop":
            for unread in ("q_proj", "k_proj", "v_proj", "output_proj", "w1", "w2", "w3"):
                if hasattr(child, unread):
                    setattr(child, unread, None)
        if isinstance(child, (Linear, FusedMatmul)) and (head or name != "lm_head"):
            setattr(module, name, layer(child.weight))
        else:
            _quantize_children(child, head=head, drop=drop, layer=layer)


def _prepare(*, assign=True, retie=True, fuse_head=True, set_threads=True, validate=True, guard=True,
             returns="model", head=True, drop="drop", layer=Int8Linear, attention=FusedSelfAttention,
             in_place=True, persistent=False, blocks="follow"):
    """prepare_for_decode with one thing done wrong (each keyword's default is the right way)."""
    def prepare_for_decode(model, *, fuse=True, layout="auto", int8=False, threads=None):
        if validate and threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        if threads is not None and set_threads:
            torch.set_num_threads(threads)
        if not in_place:
            model = copy.deepcopy(model)
        columns = layout != "rows"
        by_columns = {"follow": columns, "always": True, "never": False}[blocks]
        if fuse:
            for block in model.layers:
                if not guard or not isinstance(block.attn, FusedSelfAttention):
                    fused = attention(block.attn, by_columns=by_columns)
                    if assign:
                        block.attn = fused
                if not guard or not isinstance(block.ffn, FusedSwiGLU):
                    fused = FusedSwiGLU(block.ffn, by_columns=by_columns)
                    if assign:
                        block.ffn = fused
            head_columns = columns or blocks == "always"
            if fuse_head and head_columns and isinstance(model.lm_head, Linear) \
                    and not model.lm_head.weight.T.is_contiguous():
                tied = model.lm_head.weight is model.token_embeddings.weight
                fuse_weights(model.lm_head)
                if tied and retie:
                    model.token_embeddings.weight = model.lm_head.weight
            if persistent:
                for module in model.modules():
                    if isinstance(module, FusedMatmul):
                        module._non_persistent_buffers_set.discard("weight")
        if int8:
            _quantize_children(model, head=head, drop=drop, layer=layer)
        return model if returns == "model" else None
    return prepare_for_decode


PREPARE_MUTANTS = {
    "modules built, not assigned": (_prepare(assign=False), "does not replace the blocks' modules"),
    "a copy returned": (_prepare(in_place=False), "it does not work in place"),
    "nothing returned": (_prepare(returns=None), "returns None, not the model"),
    "threads ignored": (_prepare(set_threads=False), "threads is ignored"),
    "the fused matrices saved": (_prepare(persistent=True), "adds ['layers.0.attn.qkv.weight'"),
    "the tie broken": (_prepare(retie=False), "breaks the tie"),
    "lm_head row-major": (_prepare(fuse_head=False), "leaves lm_head's matrix row-major"),
    "the blocks row-major": (_prepare(blocks="never"), "leaves the blocks' fused matrices row-major"),
    "layout rows ignored": (_prepare(blocks="always"), "layout='rows' is ignored"),
    "the logits change": (_prepare(attention=_attention_class(swap=True)), "the logits change after"),
    "the cache path wrong": (_prepare(attention=_attention_class(past_from_cache=False)),
                             "the logits read with a KV cache change"),
    "wrapped again": (_prepare(guard=False), "wraps the fused modules again"),
    "lm_head not quantized": (_prepare(head=False), "leaves lm_head in float"),
    "float Linears kept": (_prepare(drop="keep float"), "keeps the fused modules' float Linears"),
    "quantized twice": (_prepare(drop="quantize too"), "quantizes matrices twice"),
    "int8 logits far": (_prepare(layer=ScaleForgotten), "are far from the float model's"),
    # torch.set_num_threads(0) raises RuntimeError: the check wants prepare_for_decode's own ValueError
    "threads=0 not refused": (_prepare(validate=False), "raised RuntimeError (set_num_threads expects a positive"),
}


# --- static_step: a learner's step with one mistake each -----------------------------------------------------------

def _step(rope=True, residual=True, parallel=False, final_norm=True, one_buffer=False, squeeze=True):
    """static_step as a learner writes it, with the blocks' loop spelled out, and one mistake switched on."""
    def step(model, token, position, keys, values):
        x = model.token_embeddings(token.view(1, 1))
        for i, block in enumerate(model.layers):
            attn = block.attn
            h = block.ln1(x)
            q, k, v = split_qkv(attn.qkv(h), attn.num_heads, attn.num_kv_heads)
            if rope:
                q, k = attn.rope(q, position), attn.rope(k, position)
            j = 0 if one_buffer else i
            out = attn.out(attend_at(q, k, v, keys[j], values[j], position).transpose(-3, -2).flatten(-2))
            y = x + out if residual else out
            x = y + block.ffn(block.ln2(x if parallel else y))
        logits = model.lm_head(model.ln_final(x) if final_norm else x)
        return logits[0] if squeeze else logits
    return step


STEP_MUTANTS = {
    "no RoPE": (_step(rope=False), "RoPE is not applied"),
    "no attention residual": (_step(residual=False), "the attention's residual is forgotten"),
    "parallel block": (_step(parallel=True), "the feed-forward reads the block's input"),
    "no ln_final": (_step(final_norm=False), "ln_final is skipped"),
    "one buffer": (_step(one_buffer=True), "every block writes into block 0's buffers"),
    "(1, 1, vocab)": (_step(squeeze=False), "returned shape (1, 1, 11), expected (1, 11)"),
}


def test_a_written_out_static_step_passes(capsys):
    check_static_step(_step())
    assert capsys.readouterr().out.startswith("✓ check_static_step")


CATALOGUES = [
    Catalogue(check_int8_linear, list(INT8_MUTANTS.values()), right=Int8Linear, ids=list(INT8_MUTANTS),
              shared=frozenset({"the kernel did not get it rounded to bfloat16"})),  # float32 rows, or no kernel
    Catalogue(check_fused_swiglu, list(SWIGLU_MUTANTS.values()), right=FusedSwiGLU, ids=list(SWIGLU_MUTANTS)),
    Catalogue(check_fused_self_attention, list(ATTENTION_MUTANTS.values()), right=FusedSelfAttention,
              ids=list(ATTENTION_MUTANTS)),
    Catalogue(check_prepare_for_decode, list(PREPARE_MUTANTS.values()), right=prepare_for_decode,
              ids=list(PREPARE_MUTANTS)),
    Catalogue(check_static_step, list(STEP_MUTANTS.values()), right=static_step, ids=list(STEP_MUTANTS)),
]
