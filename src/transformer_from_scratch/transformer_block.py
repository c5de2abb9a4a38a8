# Generated from notebooks/09_transformer_block.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: 252f2a68e8fa58e44a42fd4c0cb53651f01462c8abb49d518c823c7befd264da

from jaxtyping import Float, Int
from torch import Tensor, nn

from transformer_from_scratch.multihead_attention import MultiHeadSelfAttention
from transformer_from_scratch.rmsnorm import RMSNorm
from transformer_from_scratch.shapes import check_stream, checking, shape_checked
from transformer_from_scratch.swiglu import SwiGLU


def _check_input(block: "TransformerBlock", x: Tensor, past: int) -> None:
    """TransformerBlock.forward's checks of what only the block knows, each a ValueError that names the numbers.
    `past`: the positions its attention's cache already holds. Skipped inside `trusted()` (the model checked)."""
    if not checking():
        return
    check_stream("TransformerBlock", x, block.d_model, block.max_seq_len, past=past)


class TransformerBlock(nn.Module):
    """A pre-norm Transformer block: causal multi-head self-attention, then a SwiGLU feed-forward network,
    each reading a normalised copy of the residual stream and adding its result back to it (pre-norm: attention
    reads ln1 of the stream, the feed-forward network ln2 of the stream that attention left).

    Submodules, named as the course's checkpoints name them (the state dict holds `ln1.weight`,
    `attn.{q,k,v,output}_proj.weight`, `ln2.weight`, `ffn.{w1,w2,w3}.weight` and nothing else):
    `ln1`, `ln2`: RMSNorm(d_model), two separate gains; `attn`: MultiHeadSelfAttention(d_model, num_heads,
    max_seq_len, theta), causal, with RoPE on the queries and keys; `ffn`: SwiGLU(d_model, d_ff).
    The stream itself (x, then y) is never normalised: only the branches' inputs are.

    Args:
        d_model: the width of the residual stream, the last dimension of the input and the output.
        num_heads: attention heads; must divide d_model.
        d_ff: the feed-forward network's hidden width (canonically swiglu_hidden_size(d_model), about 8/3 · d_model).
        max_seq_len: the longest sequence RoPE is built for. theta: RoPE's base Θ (10,000 in Llama).
            Both None builds attention without RoPE.
        device, dtype: where and in which dtype to create the weights. norm_eps: the ε of ln1 and ln2.
        fused, num_kv_heads: passed to MultiHeadSelfAttention (F.scaled_dot_product_attention; key/value heads).
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, max_seq_len: int | None, theta: float | None,
                 device=None, dtype=None, *, fused: bool = False, num_kv_heads: int | None = None,
                 norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.d_model, self.num_heads, self.d_ff = d_model, num_heads, d_ff
        self.max_seq_len, self.theta = max_seq_len, theta
        self.ln1 = RMSNorm(d_model, norm_eps, device=device, dtype=dtype)
        self.attn = MultiHeadSelfAttention(d_model, num_heads, max_seq_len, theta, device=device, dtype=dtype,
                                           fused=fused, num_kv_heads=num_kv_heads)
        self.ln2 = RMSNorm(d_model, norm_eps, device=device, dtype=dtype)
        self.ffn = SwiGLU(d_model, d_ff, device=device, dtype=dtype)

    @shape_checked
    def forward(self, x: Float[Tensor, "*batch seq d_model"], token_positions: Int[Tensor, "*#batch seq"] | None = None,
                *, cache=None) -> Float[Tensor, "*batch seq d_model"]:
        """(..., seq, d_model) -> (..., seq, d_model); token_positions (..., seq) go to RoPE, None = 0 … seq-1.
        cache: the attention's (notebook 12), passed on: x then holds the tokens after the cached ones."""
        _check_input(self, x, 0 if cache is None else cache.length)
        y = x + self.attn(self.ln1(x), token_positions, cache=cache)
        return y + self.ffn(self.ln2(y))

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, d_ff={self.d_ff}, "
                f"max_seq_len={self.max_seq_len}, theta={self.theta}")
