# Generated from notebooks/09_transformer_block.ipynb by `make export`: edit the notebook, not this file.
# A hand edit here is detected and the export stops to ask (see CONTRIBUTING.md).
# body-sha256: bec08c6d13e750a4f4a114e3b4b5a7f80d9a77e543db3ebf6cbe653a7a9ffd5e

from jaxtyping import Float, Int
from torch import Tensor, nn

from transformer_from_scratch.multihead_attention import MultiHeadSelfAttention
from transformer_from_scratch.rmsnorm import RMSNorm
from transformer_from_scratch.shapes import shape_checked
from transformer_from_scratch.swiglu import SwiGLU


def _check_input(block: "TransformerBlock", x: Tensor) -> None:
    """TransformerBlock.forward's checks of what only the block knows, each a ValueError that names the numbers."""
    if x.ndim < 2 or x.shape[-1] != block.d_model:
        raise ValueError(f"TransformerBlock expected x of shape (..., seq, {block.d_model}) "
                         f"(d_model={block.d_model}), got shape {tuple(x.shape)}")
    if block.max_seq_len is not None and x.shape[-2] > block.max_seq_len:
        raise ValueError(f"TransformerBlock: the sequence has {x.shape[-2]} tokens, more than "
                         f"max_seq_len={block.max_seq_len} (x of shape {tuple(x.shape)})")


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
        device, dtype: where and in which dtype to create the weights.
        fused: passed to MultiHeadSelfAttention: attend with F.scaled_dot_product_attention (same result, faster).
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, max_seq_len: int | None, theta: float | None,
                 device=None, dtype=None, *, fused: bool = False) -> None:
        super().__init__()
        self.d_model, self.num_heads, self.d_ff = d_model, num_heads, d_ff
        self.max_seq_len, self.theta = max_seq_len, theta
        self.ln1 = RMSNorm(d_model, device=device, dtype=dtype)
        self.attn = MultiHeadSelfAttention(d_model, num_heads, max_seq_len, theta, device=device, dtype=dtype,
                                           fused=fused)
        self.ln2 = RMSNorm(d_model, device=device, dtype=dtype)
        self.ffn = SwiGLU(d_model, d_ff, device=device, dtype=dtype)

    @shape_checked
    def forward(self, x: Float[Tensor, "*batch seq d_model"],
                token_positions: Int[Tensor, "*#batch seq"] | None = None) -> Float[Tensor, "*batch seq d_model"]:
        """(..., seq, d_model) -> (..., seq, d_model); token_positions (..., seq) go to RoPE, None = 0 … seq-1."""
        _check_input(self, x)
        y = x + self.attn(self.ln1(x), token_positions)
        return y + self.ffn(self.ln2(y))

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, d_ff={self.d_ff}, "
                f"max_seq_len={self.max_seq_len}, theta={self.theta}")
