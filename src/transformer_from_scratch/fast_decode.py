# Generated from notebooks/16_fast_decode.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: ff4787a4a42c55506bda5a2f0d94185fc39863c52c02372c136f43e502e84705

import time
import types

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int, Int8
from torch import Tensor, nn

from transformer_from_scratch.linear import Linear
from transformer_from_scratch.multihead_attention import _attend, _check_input
from transformer_from_scratch.shapes import checking, shape_checked


def _check_last(who: str, x: Tensor, d_in: int) -> None:
    """ValueError unless x is (..., d_in): a product must not meet a vector of another size."""
    if x.ndim == 0 or x.shape[-1] != d_in:
        raise ValueError(f"{who}: expected x of shape (..., {d_in}), got shape {tuple(x.shape)}")


def copy_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5, device=None) -> float:
    """The machine's memory bandwidth in bytes per second: the fastest of `repeats` copies of a float32 tensor of
    `nbytes` into another, each counted as nbytes read and nbytes written."""
    if nbytes < 4 or repeats < 1:
        raise ValueError(f"copy_bandwidth: nbytes >= 4 and repeats >= 1, got nbytes={nbytes}, repeats={repeats}")
    source = torch.ones(nbytes // 4, device=device)
    target = torch.empty_like(source)
    synchronize = torch.cuda.synchronize if source.device.type == "cuda" else (lambda: None)
    best = float("inf")
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        target.copy_(source)
        synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * source.nbytes / best


def decode_bytes(model: nn.Module, cache_length: int = 0) -> int:
    """Step 1: the bytes one decode step reads from memory. Every weight once: the state dict's tensors, a tensor
    shared by two names (a tied matrix) counted once, except the embedding table, of which a step reads the one row
    of its token (all of it when lm_head reads it too: tied). Then the cache: the keys and the values of cache_length
    positions in every layer, num_kv_heads · d_k numbers each, in the dtype of the embedding table."""
    if not isinstance(cache_length, int) or cache_length < 0:
        raise ValueError(f"decode_bytes: cache_length must be an int >= 0, got {cache_length!r}")
    table, head = model.token_embeddings.weight, model.lm_head.weight
    seen, total = set(), 0
    for tensor in model.state_dict(keep_vars=True).values():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        untied_table = tensor is table and head.data_ptr() != table.data_ptr()
        total += table[0].nbytes if untied_table else tensor.nbytes
    per_position = sum(2 * block.attn.num_kv_heads * block.attn.d_k for block in model.layers)
    return total + cache_length * per_position * table.element_size()


def column_major(weight: Float[Tensor, "d_out d_in"]) -> Float[Tensor, "d_out d_in"]:
    """Step 2: the same matrix, the same shape (d_out, d_in), its numbers stored column by column: weight.T is
    contiguous, so x @ weight.T reads memory in order, one input feature's d_out weights after another."""
    if weight.ndim != 2:
        raise ValueError(f"column_major: a (d_out, d_in) matrix, got shape {tuple(weight.shape)}")
    return weight.detach().T.contiguous().T


def fuse_weights(*linears: nn.Module, by_columns: bool = True) -> Float[Tensor, "d_out_total d_in"]:
    """Step 3: one matrix, the linears' weights stacked by rows in the order given (stored column-major, Step 2,
    unless by_columns is False), so that one product x @ Wᵀ gives every linear's output side by side; each linear's
    weight then becomes a view of its rows (a Parameter that shares the fused matrix's memory, no gradient): no second
    copy, and the state dict keeps its names and values."""
    if not linears or any(linear.weight.shape[1:] != linears[0].weight.shape[1:] for linear in linears):
        raise ValueError(f"fuse_weights: one or more linears with the same d_in, got weights of shapes "
                         f"{[tuple(linear.weight.shape) for linear in linears]}")
    fused = torch.cat([linear.weight.detach() for linear in linears])
    if by_columns:
        fused = column_major(fused)
    start = 0
    for linear in linears:
        rows = len(linear.weight)
        linear.weight = nn.Parameter(fused[start:start + rows], requires_grad=False)
        start += rows
    return fused


def split_qkv(qkv: Float[Tensor, "*batch seq qkv"], num_heads: int, num_kv_heads: int
              ) -> tuple[Float[Tensor, "*batch heads seq d_k"], Float[Tensor, "*batch kv_heads seq d_k"],
                         Float[Tensor, "*batch kv_heads seq d_k"]]:
    """Step 4: the fused projection's output (..., seq, (num_heads + 2·num_kv_heads)·d_k), queries first, then keys,
    then values, as q (..., num_heads, seq, d_k), k and v (..., num_kv_heads, seq, d_k): head h of q gets features
    h·d_k … (h+1)·d_k - 1 of the queries, as notebook 08 splits them. Views where the layout allows, no copy."""
    d_k, rest = divmod(qkv.shape[-1], max(1, num_heads + 2 * num_kv_heads))
    if num_heads < 1 or num_kv_heads < 1 or rest or d_k == 0:
        raise ValueError(f"split_qkv: the last dimension must be (num_heads + 2·num_kv_heads)·d_k, got {qkv.shape[-1]} "
                         f"with num_heads={num_heads}, num_kv_heads={num_kv_heads}")
    q, k, v = qkv.split([num_heads * d_k, num_kv_heads * d_k, num_kv_heads * d_k], dim=-1)
    q = q.unflatten(-1, (num_heads, d_k)).transpose(-3, -2)
    k = k.unflatten(-1, (num_kv_heads, d_k)).transpose(-3, -2)
    v = v.unflatten(-1, (num_kv_heads, d_k)).transpose(-3, -2)
    return q, k, v


def quantize_int8(weight: Float[Tensor, "d_out d_in"]) -> tuple[Int8[Tensor, "d_out d_in"], Float[Tensor, " d_out"]]:
    """Step 5: symmetric int8 per output channel. Row i gets scale[i] = max_j |W[i, j]| / 127 and q[i, j] =
    round(W[i, j] / scale[i]), integers in [-127, 127], so that W ≈ q · scale[:, None]; a row of zeros gets scale 1.
    scale in float32 (whatever W's dtype), q int8."""
    if weight.ndim != 2 or not weight.is_floating_point():
        raise ValueError(f"quantize_int8: a floating-point (d_out, d_in) matrix, got {weight.dtype} of shape "
                         f"{tuple(weight.shape)}")
    w = weight.detach().to(torch.float32)
    scale = w.abs().amax(dim=1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
    return q, scale


@shape_checked
def int8_matmul(x: Float[Tensor, "... d_in"], q: Int8[Tensor, "d_out d_in"], scale: Float[Tensor, " d_out"]
                ) -> Float[Tensor, "... d_out"]:
    """Step 6: x @ (q · scale[:, None])ᵀ without the float matrix: the product with the int8 weight in x's dtype,
    then each output column i times scale[i]. Same dtype as x."""
    _check_last("int8_matmul", x, q.shape[-1])
    return (x @ q.T.to(x.dtype)) * scale.to(x.dtype)


def _check_attend_at(q: Tensor, k: Tensor, v: Tensor, keys: Tensor, values: Tensor, position: Tensor) -> None:
    """attend_at's checks, each a ValueError (TypeError for a position that is not an integer) naming the shapes: one
    new token (seq 1), k and v shaped as one position of the buffers, q's heads a multiple of theirs, one position."""
    if keys.shape != values.shape or keys.ndim < 3 or k.shape != v.shape or k.shape != (*keys.shape[:-2], 1,
                                                                                         keys.shape[-1]):
        raise ValueError(f"attend_at: k and v (..., kv_heads, 1, d_k) must fit the buffers keys and values (..., "
                         f"kv_heads, max_seq_len, d_k), got k {tuple(k.shape)}, v {tuple(v.shape)}, keys "
                         f"{tuple(keys.shape)}, values {tuple(values.shape)}")
    if q.ndim != k.ndim or q.shape[-2:] != k.shape[-2:] or q.shape[-3] % k.shape[-3]:
        raise ValueError(f"attend_at: q (..., heads, 1, d_k) with heads a multiple of k's {k.shape[-3]}, got q "
                         f"{tuple(q.shape)} and k {tuple(k.shape)}")
    if position.shape != (1,) or position.is_floating_point():
        raise (ValueError if position.shape != (1,) else TypeError)(
            f"attend_at: position must be one integer in a tensor of shape (1,), got shape {tuple(position.shape)} "
            f"and dtype {position.dtype}")


def attend_at(q: Float[Tensor, "*batch heads 1 d_k"], k: Float[Tensor, "*batch kv_heads 1 d_k"],
              v: Float[Tensor, "*batch kv_heads 1 d_k"], keys: Float[Tensor, "*batch kv_heads max_seq_len d_k"],
              values: Float[Tensor, "*batch kv_heads max_seq_len d_k"], position: Int[Tensor, "1"]
              ) -> Float[Tensor, "*batch heads 1 d_k"]:
    """Step 7: one new token's attention at a fixed shape. Writes k and v into the full buffers keys and values at
    `position` (an integer tensor of shape (1,)), in place, then attends q over every position of the buffers, those
    after `position` masked out (never written, or left from an earlier text); key/value head j serves query heads
    j·g … j·g+g-1. The shapes are the same at every position: a compiled step compiles once."""
    _check_attend_at(q, k, v, keys, values, position)
    keys.index_copy_(-2, position, k)
    values.index_copy_(-2, position, v)
    seen = torch.arange(keys.shape[-2], device=keys.device) <= position  # (max_seq_len,): True up to the new one
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=seen.view(1, -1), enable_gqa=True)


KERNEL_ROWS = 8  # Int8Linear's kernel for up to this many vectors (decoding); more (a prefill): Step 6's product


def _has_int8_kernel(x: Tensor) -> bool:
    """PyTorch's int8 weight-only matmul (the one gpt-fast uses) serves this input: on the CPU, x float32, bfloat16 or
    float16 (not float64, not CUDA in torch 2.13), and d_in a multiple of 16: torch 2.13's kernel crashed the process
    on bfloat16 rows of 6 on an AMD EPYC, and of 8, 24, 40 or 56 on an Intel Xeon with AVX-512 and AMX (and gave NaN
    for rows of 8, 24 and 40 there in a later run)."""
    return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and x.shape[-1] % 16 == 0)


class Int8Linear(nn.Module):
    """A Linear for decoding whose weight is kept in int8, one float32 scale per output row (Step 5): y ≈ x Wᵀ with a
    quarter of float32's bytes to read. Buffers `weight` (d_out, d_in) int8 and `scale` (d_out,) float32. The
    product: PyTorch's int8 weight-only kernel where it serves x (the CPU, float32/bfloat16/float16) for up to
    KERNEL_ROWS vectors, on x and the scales rounded to bfloat16 (its fast path: float32 rows took about 4 times as
    long in a decode step on the course's Intel Xeon, float16 ones longer still), the result back in x's dtype; else
    Step 6 (for a prefill, a float copy of the matrix costs less than the kernel on many rows)."""

    def __init__(self, weight: Float[Tensor, "d_out d_in"]) -> None:
        super().__init__()
        q, scale = quantize_int8(weight)
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale)

    @shape_checked
    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        """(..., d_in) -> (..., d_out), x's dtype (through the kernel, to bfloat16's precision)."""
        _check_last("Int8Linear", x, self.weight.shape[1])
        if _has_int8_kernel(x) and x.numel() <= KERNEL_ROWS * x.shape[-1]:  # decoding: a few vectors
            rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)  # the kernel's fast path: bfloat16 rows
            out = torch._weight_int8pack_mm(rows, self.weight, self.scale.to(torch.bfloat16))  # (n, d_out) bfloat16
            return out.to(x.dtype).reshape(*x.shape[:-1], out.shape[-1])
        return int8_matmul(x, self.weight, self.scale)

    def extra_repr(self) -> str:
        return f"in_features={self.weight.shape[1]}, out_features={self.weight.shape[0]}, int8 per row"


class FusedMatmul(nn.Module):
    """x @ weightᵀ for a fused matrix (Step 3's), kept as a non-persistent buffer: the state dict keeps the
    original linears' names, whose weights are views of this one."""

    def __init__(self, weight: Float[Tensor, "d_out d_in"]) -> None:
        super().__init__()
        self.register_buffer("weight", weight, persistent=False)

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        _check_last("FusedMatmul", x, self.weight.shape[1])
        return x @ self.weight.T


class FusedSelfAttention(nn.Module):
    """Notebook 08's MultiHeadSelfAttention for decoding: the same function, the queries, keys and values from one
    product with the fused, column-major matrix (Steps 2-3) instead of three, split by Step 4, and PyTorch's kernel
    (F.scaled_dot_product_attention, grouped heads included). Built from a MultiHeadSelfAttention `attn`, whose four
    Linears it keeps (the state dict is unchanged) and whose q/k/v weights become views of `qkv`'s matrix (stored
    column-major unless by_columns is False); RoPE and the cache as in notebook 08: forward(x, token_positions=None, *,
    cache=None)."""

    def __init__(self, attn: nn.Module, *, by_columns: bool = True) -> None:
        super().__init__()
        for name in ("d_model", "num_heads", "num_kv_heads", "d_k", "max_seq_len", "theta"):
            setattr(self, name, getattr(attn, name))
        self.q_proj, self.k_proj, self.v_proj = attn.q_proj, attn.k_proj, attn.v_proj
        self.output_proj = attn.output_proj
        self.rope = attn.rope
        self.qkv = FusedMatmul(fuse_weights(self.q_proj, self.k_proj, self.v_proj, by_columns=by_columns))
        self.out = FusedMatmul(fuse_weights(self.output_proj, by_columns=by_columns))

    @shape_checked
    def forward(self, x: Float[Tensor, "*batch seq d_model"], token_positions: Int[Tensor, "*#batch seq"] | None = None,
                *, cache=None) -> Float[Tensor, "*batch seq d_model"]:
        """(..., seq, d_model) -> (..., seq, d_model), as MultiHeadSelfAttention.forward."""
        past = 0 if cache is None else cache.length
        _check_input(self, x, token_positions, past)
        q, k, v = split_qkv(self.qkv(x), self.num_heads, self.num_kv_heads)
        if self.rope is not None:
            positions = range(past, past + x.shape[-2]) if token_positions is None else token_positions.unsqueeze(-2)
            q, k = self.rope(q, positions), self.rope(k, positions)
        if cache is not None:
            k, v = cache.update(k, v)
        return self.out(_attend(q, k, v, fused=True).transpose(-3, -2).flatten(-2))

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                "one q/k/v product")


class FusedSwiGLU(nn.Module):
    """Notebook 07's SwiGLU for decoding: w1 and w3 fused into one product (Step 3), then w2(silu(gate) ⊙ up).
    Built from a SwiGLU `ffn`, whose three Linears it keeps (the state dict is unchanged); by_columns as in
    FusedSelfAttention."""

    def __init__(self, ffn: nn.Module, *, by_columns: bool = True) -> None:
        super().__init__()
        self.d_model, self.d_ff = ffn.d_model, ffn.d_ff
        self.w1, self.w2, self.w3 = ffn.w1, ffn.w2, ffn.w3
        self.w13 = FusedMatmul(fuse_weights(self.w1, self.w3, by_columns=by_columns))
        self.down = FusedMatmul(fuse_weights(self.w2, by_columns=by_columns))

    @shape_checked
    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """(..., d_model) -> (..., d_model), as SwiGLU.forward."""
        _check_last("FusedSwiGLU", x, self.d_model)
        gate, up = self.w13(x).split(self.d_ff, dim=-1)
        return self.down(F.silu(gate) * up)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_ff={self.d_ff}, one w1/w3 product"


def _check_static_step(model: nn.Module, token: Tensor, position: Tensor, keys: list, values: list) -> None:
    """static_step's checks: a prepared model (fused attention), one token and one position as (1,) tensors, and one
    key and one value buffer per block; a TypeError or ValueError that names what is wrong."""
    if not all(hasattr(getattr(block, "attn", None), "qkv") for block in getattr(model, "layers", [None])):
        raise TypeError("static_step: a TransformerLM prepared by prepare_for_decode (every block's attention fused, "
                        "a FusedSelfAttention with its qkv), got " + type(model).__name__)
    if token.shape != (1,) or position.shape != (1,):
        raise ValueError(f"static_step: one token and one position, each of shape (1,), got token of shape "
                         f"{tuple(token.shape)} and position of shape {tuple(position.shape)}")
    if not len(keys) == len(values) == len(model.layers):
        raise ValueError(f"static_step: one key and one value buffer per block ({len(model.layers)}), got "
                         f"{len(keys)} and {len(values)}")


def static_step(model: nn.Module, token: Int[Tensor, "1"], position: Int[Tensor, "1"], keys: list[Tensor],
                values: list[Tensor]) -> Float[Tensor, "1 vocab"]:
    """One decode step of a prepared model (its blocks fused) whose shapes do not depend on the position: the token
    (1,) at `position` (1,) through every block, block i's new key and value written into its full buffers keys[i]
    and values[i] (1, kv_heads, max_seq_len, d_k) by Step 7; returns the next token's logits (1, vocab). This is
    TransformerLM.forward with a cache, for one token: what prepare_for_decode(compile=True) compiles, once."""
    _check_static_step(model, token, position, keys, values)
    x = model.token_embeddings(token.view(1, 1))  # (1, 1, d_model)
    for block, block_keys, block_values in zip(model.layers, keys, values):
        attn = block.attn
        q, k, v = split_qkv(attn.qkv(block.ln1(x)), attn.num_heads, attn.num_kv_heads)
        if attn.rope is not None:
            q, k = attn.rope(q, position), attn.rope(k, position)
        heads = attend_at(q, k, v, block_keys, block_values, position)  # (1, heads, 1, d_k)
        x = x + attn.out(heads.transpose(-3, -2).flatten(-2))
        x = x + block.ffn(block.ln2(x))
    return model.lm_head(model.ln_final(x))[0]


_compiled_steps = {}  # static_step under torch.compile, made at its first call, each for every model: "float", and
# "int8" for an int8 model on the CPU, run with inductor's settings below: the weights frozen in as constants (under
# no_grad, as in generate), a C++ template among the kernels it times (an int8 kernel that converts each weight in
# registers, for bfloat16 rows; the timings not printed), and no cache of compiled graphs, which in torch 2.13 handed a
# second model the first one's frozen weights (wrong logits)
INT8_COMPILE_OPTIONS = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                        "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False,
                        "fx_graph_cache": False}


def _compiled_forward(model: nn.Module, token_ids: Tensor, token_positions: Tensor | None = None, *,
                      cache: list | None = None) -> Tensor:
    """The forward of a model prepared with compile=True. One new id (token_ids (1, 1)) after what a cache holds, as
    generate's steps call it, runs static_step compiled; the arguments are trusted, as inside generate. Every other
    call (a prompt, even of one id, whose ids the model's forward checks; a batch, no cache, given positions, a full
    cache, or checks on) runs the model's own forward."""
    own = type(model).forward
    if (cache is None or token_positions is not None or token_ids.shape != (1, 1) or checking()
            or not 0 < cache[0].length < cache[0].keys.shape[-2]):
        return own(model, token_ids, token_positions, cache=cache)
    int8 = token_ids.device.type == "cpu" and isinstance(getattr(model.layers[0].attn, "qkv", None), Int8Linear)
    kind = "int8" if int8 else "float"
    if kind not in _compiled_steps:
        _compiled_steps[kind] = torch.compile(static_step, fullgraph=True)
    keys, values = [c.keys for c in cache], [c.values for c in cache]
    for buffer in keys + values:  # the length a symbol: one compilation for every length (dynamic=True would also
        torch._dynamo.mark_dynamic(buffer, 2)  # give a length equal to the number of heads their symbol, and recompile)
    position = torch.tensor([cache[0].length], device=token_ids.device)
    failure = None
    try:
        with torch._inductor.config.patch(INT8_COMPILE_OPTIONS if int8 else {}):  # read while compiling
            logits = _compiled_steps[kind](model, token_ids[0], position, keys, values)
    except torch._dynamo.exc.Unsupported as error:  # found while tracing, before anything ran: a raise (a stub's)
        failure = error  # or code that is not one graph. Run as written once, the step raises its own error if any
    if failure is not None:
        static_step(model, token_ids[0], position, keys, values)
        reason = " ".join(line.strip() for line in str(failure).splitlines()[:2])
        raise RuntimeError(f"static_step runs, but torch.compile cannot make it one graph: {reason} Keep it to tensor "
                           "operations: no print, no Python branch on a tensor's value") from failure
    for layer_cache in cache:
        layer_cache.length += 1
    return logits.unsqueeze(0)  # (1, 1, vocab), as the model's forward


_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "output_proj", "w1", "w2", "w3")  # a block's Linears, by name


def _quantize_children(module: nn.Module) -> None:
    """Every Linear and FusedMatmul below `module` becomes an Int8Linear of its weight; a fused module's own Linears,
    which its forward no longer reads, are dropped, so their float weights are freed."""
    for name, child in list(module.named_children()):
        if isinstance(child, (FusedSelfAttention, FusedSwiGLU)):
            for unread in _PROJECTIONS:
                if hasattr(child, unread):
                    setattr(child, unread, None)
        if isinstance(child, (Linear, FusedMatmul)):
            setattr(module, name, Int8Linear(child.weight))
        else:
            _quantize_children(child)


def faster_layout(weight: Float[Tensor, "d_out d_in"], repeats: int = 5) -> str:
    """"columns" or "rows": the layout in which x @ weight.T runs faster for one vector x, on weight's device and in its
    dtype, the best of `repeats` products each way (after one). The kernel's business, so measured, not assumed."""
    if weight.ndim != 2:
        raise ValueError(f"faster_layout: a (d_out, d_in) matrix, got shape {tuple(weight.shape)}")
    x = torch.randn(1, weight.shape[1], device=weight.device, dtype=weight.dtype)
    best = {}
    for layout, matrix in (("rows", weight.detach().contiguous()), ("columns", column_major(weight))):
        x @ matrix.T
        seconds = []
        for _ in range(repeats):
            if weight.device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            x @ matrix.T
            if weight.device.type == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
        best[layout] = min(seconds)
    return min(best, key=best.get)


LAYOUTS = ("auto", "columns", "rows")


def _check_prepare(model: nn.Module, fuse: bool, layout: str, threads: int | None, compile: bool) -> None:
    """prepare_for_decode's checks: a TransformerLM whose matrices have weights, a known layout, threads an int >= 1 or
    None, compile with fuse; a TypeError or ValueError that names what is wrong."""
    if not all(hasattr(model, name) for name in ("layers", "lm_head", "token_embeddings")):
        raise TypeError(f"prepare_for_decode: a TransformerLM (with .layers, .lm_head and .token_embeddings), got "
                        f"{type(model).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"prepare_for_decode: layout must be one of {LAYOUTS}, got {layout!r}")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise ValueError(f"prepare_for_decode: threads must be an int >= 1 or None, got {threads!r}")
    if compile and not fuse:
        raise ValueError("prepare_for_decode: compile=True compiles the fused step: it needs fuse=True")
    for path, child in model.named_modules():  # a LoRALinear (notebook 15) has no weight of its own to fuse
        if path.rpartition(".")[2] in (*_PROJECTIONS, "lm_head") and not isinstance(getattr(child, "weight", None),
                                                                                    Tensor):
            raise TypeError(f"prepare_for_decode: {path} is a {type(child).__name__} with no weight tensor: merge() a "
                            f"LoRA adapter and put its .base back first (make chat --adapter does)")


def prepare_for_decode(model: nn.Module, *, fuse: bool = True, layout: str = "auto", int8: bool = False,
                       threads: int | None = None, compile: bool = False) -> nn.Module:
    """Make a TransformerLM (notebook 10's, loaded or trained) decode faster, in place, and return it.

    fuse (exact: the same function, in float32 the greedy tokens of the plain model; a CPU's bfloat16 products of a
    fused matrix may round otherwise than those of its parts): every block's attention becomes a
    FusedSelfAttention and its SwiGLU a FusedSwiGLU, four products a block instead of seven; the state dict keeps its
    names and values. layout: how every fused matrix and lm_head are stored, "columns" (Step 2), "rows" (as loaded), or
    "auto", the faster of the two for lm_head's product on this machine (faster_layout; a tied embedding table stays
    tied). int8 (approximate; for decoding only, and for good): every matrix the step reads in full, lm_head included,
    becomes an Int8Linear and the float weights it replaces are freed (the embedding table stays: a step reads one row).
    threads: torch's CPU threads (torch.set_num_threads), None leaves them as they are. compile (exact, needs fuse): the
    model's forward runs generate's one-token steps through static_step under torch.compile (Step 7's fixed shapes, the
    cache's length a symbol: one compilation for every length), everything else as before; the first step compiles,
    about a minute on 2 CPU cores. compile with int8 (on the CPU): the step compiles with INT8_COMPILE_OPTIONS, so that
    inductor writes its own C++ kernel for Int8Linear's bfloat16 products, the weights frozen into it (a later change
    of them in place does not reach it); a minute or two, in every process. A second call changes nothing done.
    """
    _check_prepare(model, fuse, layout, threads, compile)
    if threads is not None:
        torch.set_num_threads(threads)
    head = model.lm_head
    if layout == "auto":
        layout = faster_layout(head.weight) if isinstance(head, Linear) else "rows"
    if fuse:
        for block in model.layers:
            if not isinstance(block.attn, FusedSelfAttention):
                block.attn = FusedSelfAttention(block.attn, by_columns=layout == "columns")
            if not isinstance(block.ffn, FusedSwiGLU):
                block.ffn = FusedSwiGLU(block.ffn, by_columns=layout == "columns")
        if isinstance(head, Linear) and layout == "columns" and not head.weight.T.is_contiguous():
            tied = head.weight is model.token_embeddings.weight
            fuse_weights(head)  # one matrix: column-major, a view
            if tied:
                model.token_embeddings.weight = head.weight
    if int8:
        _quantize_children(model)
    if compile and not isinstance(vars(model).get("forward"), types.MethodType):
        model.forward = types.MethodType(_compiled_forward, model)  # this model's own: a deepcopy gets its copy's
    return model
