"""Draw the architecture diagram of the Transformer LM built in this course.

The model is a pre-norm, decoder-only Transformer in the Llama style (RMSNorm,
RoPE, SwiGLU, no biases).  The script draws the whole model once, with the
inside of multi-head attention and of the SwiGLU feed-forward expanded in side
panels, and writes one SVG per course component with that component
highlighted:

    images/architecture.svg            nothing highlighted
    images/architecture_<key>.svg      key in KEYS below (the tokenizer: its own box for the ids)
    images/training_loop.svg           one training step (notebook 11)

Run it from the repository root with either of

    make images
    .venv/bin/python images/make_diagrams.py

It always writes next to itself, whatever the current directory.  The output
is deterministic: running it twice gives byte-identical SVGs.

To look at one diagram as a PNG (for instance while editing the layout):

    import make_diagrams
    make_diagrams.draw("rope").savefig("/tmp/rope.png", dpi=100)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Polygon
from matplotlib.path import Path as MplPath

OUT_DIR = Path(__file__).resolve().parent

# ---------------------------------------------------------------------------
# What each highlight key lights up, and the title it gets.
# ---------------------------------------------------------------------------

TITLES = {
    None: "A pre-norm Transformer LM",
    "linear": "Where Linear layers sit in the model",
    "embedding": "Where the token Embedding sits in the model",
    "softmax": "Where softmax is used in the model",
    "rmsnorm": "Where RMSNorm sits in the model",
    "attention": "Where scaled dot-product attention sits in the model",
    "rope": "Where RoPE is applied in the model",
    "swiglu": "Where the SwiGLU feed-forward sits in the model",
    "multihead_attention": "Where multi-head self-attention sits in the model",
    "transformer_block": "Where the Transformer block sits in the model",
    "transformer_lm": "The whole model: a pre-norm Transformer LM",
    "tokenizer": "Where the tokenizer sits: text in, token ids out",
    "pretrained": "Real weights: every part, and the tokenizer, from one file",
    "finetune": "LoRA: a trainable low-rank update beside q_proj and v_proj",
    "fast_decode": "Decoding: every matrix read once a token; q/k/v and w1/w3 fused",
}
KEYS = [k for k in TITLES if k is not None]

# Every element listed under a container key also belongs to the containers
# around it; "transformer_lm" lights up everything, so nothing lists it.
BLOCK = ("transformer_block",)
MHA = ("multihead_attention", "transformer_block")
FFN = ("swiglu", "transformer_block")
# Fine-tuning (notebook 15) lights the two Linears LoRA adapts, and the attention that holds them; the rest is frozen.
LORA = ("finetune",)
LORA_TARGETS = ("q_proj", "v_proj")
# Fast decoding (notebook 16) lights every matrix a step reads in full; these are fused into two products a block.
FUSED = ("q_proj", "k_proj", "v_proj", "w1", "w3")

# ---------------------------------------------------------------------------
# Colours and fonts.  A white background keeps it readable in dark themes.
# ---------------------------------------------------------------------------

FONT = "DejaVu Sans"
FS_TITLE = 15
FS_LABEL = 12  # text inside boxes
FS_SMALL = 10.5  # second lines, tensor shapes, panel captions

PLAIN = dict(fill="#f4f6f8", edge="#3d4852", text="#1f2328")  # nothing highlighted
MUTED = dict(fill="#eeeeee", edge="#b3b3b3", text="#6e6e6e")
HIGH = dict(fill="#f59331", edge="#9c4a00", text="#1f1300")
HIGH_FRAME = dict(fill="#fdebd8", edge="#9c4a00", text="#7a3a00")  # containers
PLAIN_FRAME = dict(fill="#fafbfc", edge="#8c959f", text="#3d4852")
MUTED_FRAME = dict(fill="#fbfbfb", edge="#cccccc", text="#8a8a8a")
ARROW = "#4a4a4a"
ARROW_MUTED = "#9a9a9a"

# ---------------------------------------------------------------------------
# Layout, in inches (the axes span the figure, one data unit = one inch).
# ---------------------------------------------------------------------------

FIG_W, FIG_H = 8.5, 10.3

MAIN_X = 2.17  # centre of the main column
MAIN_W = 2.5  # width of main-column boxes
SKIP_X = 0.67  # x of the residual skip lines
FRAME_X0, FRAME_X1 = 0.5, 3.57  # transformer-block frame; "× num_layers" goes left of it

PANEL_X0, PANEL_X1 = 4.07, 8.4  # both side panels
PANEL_C = (PANEL_X0 + PANEL_X1) / 2


@dataclass(frozen=True)
class Node:
    """One thing on the diagram.

    kind: "box" (rounded rectangle), "add"/"mul" (circle with + or ⊙),
          "dot" (residual branch point), "text" (bare label), "frame"/"panel"
          (containers drawn behind their contents).
    x, y: centre; w, h: size (for circles w is the diameter).
    label: main text; sub: optional smaller second line.
    keys: highlight keys that light this node up.
    """

    name: str
    kind: str
    x: float
    y: float
    w: float = MAIN_W
    h: float = 0.46
    label: str = ""
    sub: str = ""
    keys: tuple[str, ...] = ()


def main_box(name, y, label, sub="", keys=(), h=None):
    hh = h if h is not None else (0.6 if sub or "\n" in label else 0.44)
    return Node(name, "box", MAIN_X, y, MAIN_W, hh, label, sub, keys)


# y positions of the main column (bottom -> top)
Y_IDS, Y_EMB = 0.32, 0.98
Y_FRAME0 = 1.42
Y_BR1, Y_LN1, Y_ATTN, Y_ADD1 = 1.7, 2.17, 2.95, 3.68
Y_BR2, Y_LN2, Y_FFN, Y_ADD2 = 4.0, 4.47, 5.18, 5.88
Y_FRAME1 = 6.38
Y_LNF, Y_HEAD, Y_LOGITS, Y_SOFT, Y_PROBS = 6.93, 7.68, 8.27, 8.83, 9.38
Y_TITLE = 9.98

# Multi-head attention panel (bottom right)
MP_Y0, MP_Y1 = 0.14, 5.16
MP_COLS = (PANEL_C - 1.4, PANEL_C, PANEL_C + 1.4)  # Q, K, V columns
Y_MX, Y_MFAN, Y_QKV, Y_ROPE = 0.44, 0.72, 1.2, 1.95
Y_SDPA, Y_CONCAT, Y_OPROJ = 2.98, 3.86, 4.56
SDPA_W, SDPA_H = 4.0, 0.92

# SwiGLU panel (top right)
SP_Y0, SP_Y1 = 5.62, 9.42
SP_L, SP_R = PANEL_C - 1.1, PANEL_C + 1.1  # w1 / w3 columns
Y_SX, Y_SFAN, Y_W13, Y_SILU, Y_MUL, Y_W2 = 5.94, 6.2, 6.68, 7.4, 8.04, 8.72

R_OP = 0.17  # radius of the + and ⊙ circles

NODES = [
    # ---- main column ----
    Node("ids", "text", MAIN_X, Y_IDS, label="token ids  (batch, seq)"),
    main_box("emb", Y_EMB, "Token embedding", "vocab_size × d_model", ("embedding",)),
    Node("block", "frame", (FRAME_X0 + FRAME_X1) / 2, (Y_FRAME0 + Y_FRAME1) / 2,
         FRAME_X1 - FRAME_X0, Y_FRAME1 - Y_FRAME0, "Transformer block", "× num_layers", BLOCK),
    Node("br1", "dot", MAIN_X, Y_BR1, keys=BLOCK),
    main_box("ln1", Y_LN1, "RMSNorm (ln1)", keys=("rmsnorm",) + BLOCK),
    main_box("attn", Y_ATTN, "Causal multi-head\nself-attention", keys=MHA + LORA, h=0.66),
    Node("add1", "add", MAIN_X, Y_ADD1, 2 * R_OP, 2 * R_OP, keys=BLOCK),
    Node("br2", "dot", MAIN_X, Y_BR2, keys=BLOCK),
    main_box("ln2", Y_LN2, "RMSNorm (ln2)", keys=("rmsnorm",) + BLOCK),
    main_box("ffn", Y_FFN, "SwiGLU feed-forward", keys=FFN, h=0.52),
    Node("add2", "add", MAIN_X, Y_ADD2, 2 * R_OP, 2 * R_OP, keys=BLOCK),
    main_box("lnf", Y_LNF, "RMSNorm (ln_final)", keys=("rmsnorm",)),
    main_box("head", Y_HEAD, "Linear (lm_head)", "d_model → vocab_size", ("linear",)),
    Node("logits", "text", MAIN_X, Y_LOGITS, label="logits  (batch, seq, vocab)"),
    main_box("soft", Y_SOFT, "softmax", keys=("softmax",)),
    Node("probs", "text", MAIN_X, Y_PROBS, label="next-token probabilities"),
    # ---- multi-head attention panel ----
    Node("mha", "panel", PANEL_C, (MP_Y0 + MP_Y1) / 2, PANEL_X1 - PANEL_X0, MP_Y1 - MP_Y0,
         "Inside causal multi-head self-attention", keys=MHA + LORA),
    Node("mx", "text", PANEL_C, Y_MX, label="x  (batch, seq, d_model)", keys=MHA),
    *[Node(f"{p}_proj", "box", cx, Y_QKV, 1.15, 0.6, "Linear", f"{p}_proj",
           ("linear",) + MHA + (LORA if f"{p}_proj" in LORA_TARGETS else ()))
      for p, cx in zip("qkv", MP_COLS)],
    *[Node(f"rope_{p}", "box", cx, Y_ROPE, 1.15, 0.42, "RoPE", "", ("rope",) + MHA)
      for p, cx in zip("qk", MP_COLS)],
    Node("sdpa", "box", PANEL_C, Y_SDPA, SDPA_W, SDPA_H,
         "scaled dot-product attention, per head", "", ("attention",) + MHA),
    Node("sdpa_soft", "box", PANEL_C - 1.32, Y_SDPA - 0.18, 0.98, 0.38, "softmax", "",
         ("softmax", "attention") + MHA),
    Node("concat", "box", PANEL_C, Y_CONCAT, 2.1, 0.4, "concatenate heads", "", MHA),
    Node("o_proj", "box", PANEL_C, Y_OPROJ, 2.1, 0.6, "Linear", "output_proj", ("linear",) + MHA),
    # ---- SwiGLU panel ----
    Node("swi", "panel", PANEL_C, (SP_Y0 + SP_Y1) / 2, PANEL_X1 - PANEL_X0, SP_Y1 - SP_Y0,
         "Inside the SwiGLU feed-forward", keys=FFN),
    Node("sx", "text", PANEL_C, Y_SX, label="x  (batch, seq, d_model)", keys=FFN),
    Node("w1", "box", SP_L, Y_W13, 1.5, 0.6, "Linear", "w1: d_model → d_ff", ("linear",) + FFN),
    Node("w3", "box", SP_R, Y_W13, 1.5, 0.6, "Linear", "w3: d_model → d_ff", ("linear",) + FFN),
    Node("silu", "box", SP_L, Y_SILU, 1.5, 0.42, "SiLU", "", FFN),
    Node("mul", "mul", PANEL_C, Y_MUL, 2 * R_OP, 2 * R_OP, keys=FFN),
    Node("w2", "box", PANEL_C, Y_W2, 1.9, 0.6, "Linear", "w2: d_ff → d_model", ("linear",) + FFN),
]
BY_NAME = {n.name: n for n in NODES}
# In the tokenizer's diagram (notebook 13) the token ids come out of a box: the tokenizer, drawn over the ids' label.
TOKENIZER_BOX = Node("ids", "box", MAIN_X, Y_IDS, MAIN_W, 0.5, "Tokenizer (byte-level BPE)", "text → token ids",
                     ("tokenizer",))


def at(name: str, side: str = "c", dx: float = 0.0, dy: float = 0.0) -> tuple[float, float]:
    """A point on a node: side is one of c (centre), t, b, l, r."""
    n = BY_NAME[name]
    half_w, half_h = n.w / 2, n.h / 2
    if n.kind == "text":
        half_h = 0.12
    if n.kind == "dot":
        half_w = half_h = 0.0
    x, y = {"c": (n.x, n.y), "t": (n.x, n.y + half_h), "b": (n.x, n.y - half_h),
            "l": (n.x - half_w, n.y), "r": (n.x + half_w, n.y)}[side]
    return x + dx, y + dy


@dataclass(frozen=True)
class Edge:
    """A polyline; head=True puts an arrowhead at its last point."""

    points: tuple[tuple[float, float], ...]
    keys: tuple[str, ...] = ()
    head: bool = True


def up(a: str, b: str, keys=()) -> Edge:
    """Straight arrow from the top of a to the bottom of b."""
    return Edge((at(a, "t"), at(b, "b")), keys)


def skip(branch: str, add: str) -> Edge:
    """Residual connection: left from the branch point, up, right into the add."""
    x0, y0 = at(branch)
    x1, y1 = at(add, "l")
    return Edge(((x0, y0), (SKIP_X, y0), (SKIP_X, y1), (x1, y1)), BLOCK)


def elbow(a: str, a_side: str, b: str, b_side: str, keys=()) -> Edge:
    """Vertical, then horizontal: from a, up to b's height, then into b's side."""
    xa, ya = at(a, a_side)
    xb, yb = at(b, b_side)
    return Edge(((xa, ya), (xa, yb), (xb, yb)), keys)


def fan(src: str, y_bar: float, dsts: list[str], keys=()) -> list[Edge]:
    """One input feeding several boxes: up to a bar, then up into each box."""
    x0, y0 = at(src, "t")
    xs = [at(d, "b")[0] for d in dsts]
    edges = [Edge(((x0, y0), (x0, y_bar)), keys, head=False),
             Edge(((min(xs), y_bar), (max(xs), y_bar)), keys, head=False)]
    edges += [Edge(((at(d, "b")[0], y_bar), at(d, "b")), keys) for d in dsts]
    return edges


EDGES = [
    # main column
    Edge((at("ids", "t"), at("emb", "b"))),
    Edge((at("emb", "t"), at("br1")), BLOCK, head=False),
    Edge((at("br1"), at("ln1", "b")), BLOCK),
    up("ln1", "attn", BLOCK),
    up("attn", "add1", BLOCK),
    skip("br1", "add1"),
    Edge((at("add1", "t"), at("br2")), BLOCK, head=False),
    Edge((at("br2"), at("ln2", "b")), BLOCK),
    up("ln2", "ffn", BLOCK),
    up("ffn", "add2", BLOCK),
    skip("br2", "add2"),
    up("add2", "lnf"),
    up("lnf", "head"),
    Edge((at("head", "t"), at("logits", "b"))),
    Edge((at("logits", "t"), at("soft", "b"))),
    Edge((at("soft", "t"), at("probs", "b"))),
    # multi-head attention panel
    *fan("mx", Y_MFAN, ["q_proj", "k_proj", "v_proj"], MHA),
    up("q_proj", "rope_q", MHA),
    up("k_proj", "rope_k", MHA),
    Edge((at("rope_q", "t"), (MP_COLS[0], Y_SDPA - SDPA_H / 2)), MHA),
    Edge((at("rope_k", "t"), (MP_COLS[1], Y_SDPA - SDPA_H / 2)), MHA),
    Edge((at("v_proj", "t"), (MP_COLS[2], Y_SDPA - SDPA_H / 2)), MHA),
    up("sdpa", "concat", MHA),
    up("concat", "o_proj", MHA),
    Edge((at("o_proj", "t"), (PANEL_C, MP_Y1 - 0.02)), MHA),
    # SwiGLU panel
    *fan("sx", Y_SFAN, ["w1", "w3"], FFN),
    up("w1", "silu", FFN),
    elbow("silu", "t", "mul", "l", FFN),
    elbow("w3", "t", "mul", "r", FFN),
    up("mul", "w2", FFN),
    Edge((at("w2", "t"), (PANEL_C, SP_Y1 - 0.02)), FFN),
]

# Labels next to arrows: (x, y, text, keys)
Y_QKV_LABEL = (at("rope_q", "t")[1] + Y_SDPA - SDPA_H / 2) / 2
ARROW_LABELS = [
    *[(cx + 0.1, Y_QKV_LABEL, p, MHA) for p, cx in zip("QKV", MP_COLS)],
    (PANEL_C + 0.1, MP_Y1 - 0.2, "(batch, seq, d_model)", MHA),
    (PANEL_C + 0.1, SP_Y1 - 0.2, "(batch, seq, d_model)", FFN),
]

# Dashed "zoom" lines from a main-column box to the panel that expands it.
ZOOMS = [("attn", "mha"), ("ffn", "swi")]


# ---------------------------------------------------------------------------
# Drawing
# ---------------------------------------------------------------------------


def is_lit(keys: tuple[str, ...], highlight: str | None) -> bool:
    if highlight == "fast_decode":  # notebook 16: the matrices a decode step reads in full, lm_head included
        return "linear" in keys
    return highlight in ("transformer_lm", "pretrained") or (highlight is not None and highlight in keys)


def style(node: Node, highlight: str | None) -> dict:
    container = node.kind in ("frame", "panel")
    if highlight is None:
        return PLAIN_FRAME if container else PLAIN
    if is_lit(node.keys, highlight):
        return HIGH_FRAME if container else HIGH
    return MUTED_FRAME if container else MUTED


def text(ax, x, y, s, color, size=FS_LABEL, **kw):
    kw.setdefault("ha", "center")
    kw.setdefault("va", "center")
    ax.text(x, y, s, color=color, fontsize=size, fontfamily=FONT, **kw)


def draw_node(ax, node: Node, highlight: str | None) -> None:
    if highlight == "finetune" and node.name in LORA_TARGETS:  # LoRA's update, beside the frozen weight
        node = Node(node.name, node.kind, node.x, node.y, node.w, node.h, f"{node.sub}", "+ (α/r)·B A", node.keys)
    if highlight == "fast_decode" and node.name in FUSED:  # one product for q, k, v; one for w1, w3
        node = Node(node.name, node.kind, node.x, node.y, node.w, node.h, node.sub, node.label + " · fused", node.keys)
    st = style(node, highlight)
    x0, y0 = node.x - node.w / 2, node.y - node.h / 2
    if node.kind in ("box", "frame", "panel"):
        pad = 0.08 if node.kind == "box" else 0.12
        ax.add_patch(FancyBboxPatch(
            (x0 + pad, y0 + pad), node.w - 2 * pad, node.h - 2 * pad,
            boxstyle=f"round,pad={pad}", fc=st["fill"], ec=st["edge"],
            lw=1.3 if node.kind == "box" else 1.1,
            ls="-" if node.kind == "box" else (0, (5, 3)), zorder=1 if node.kind == "box" else 0))
    if node.kind == "box":
        if node.name == "sdpa":  # title on top, inline formula drawn by draw_sdpa_formula
            text(ax, node.x, node.y + node.h / 2 - 0.2, node.label, st["text"], FS_SMALL + 0.5)
        elif node.sub:
            text(ax, node.x, node.y + 0.11, node.label, st["text"])
            text(ax, node.x, node.y - 0.14, node.sub, st["text"], FS_SMALL)
        else:
            text(ax, node.x, node.y, node.label, st["text"], linespacing=1.25)
    elif node.kind == "frame":  # name inside the top-left corner, repeat count on the left
        text(ax, x0 + 0.14, y0 + node.h - 0.2, node.label, st["text"], FS_SMALL,
             ha="left", fontweight="bold")
        text(ax, x0 - 0.22, node.y, node.sub, st["text"], FS_LABEL + 1, rotation=90,
             fontweight="bold")
    elif node.kind == "panel":  # caption just above the panel
        text(ax, x0 + 0.04, y0 + node.h + 0.17, node.label, st["text"], FS_SMALL + 0.5,
             ha="left", fontweight="bold")
    elif node.kind in ("add", "mul"):
        ax.add_patch(Circle((node.x, node.y), R_OP, fc=st["fill"], ec=st["edge"], lw=1.3, zorder=2))
        if node.kind == "add":  # residual add: a plus sign
            d = R_OP * 0.55
            ax.plot([node.x - d, node.x + d], [node.y, node.y], color=st["edge"], lw=1.6, zorder=3)
            ax.plot([node.x, node.x], [node.y - d, node.y + d], color=st["edge"], lw=1.6, zorder=3)
        else:  # elementwise product: a dot in the circle, as in ⊙
            ax.add_patch(Circle((node.x, node.y), R_OP * 0.28, fc=st["edge"], ec="none", zorder=3))
    elif node.kind == "dot":
        ax.add_patch(Circle((node.x, node.y), 0.045, fc=arrow_color(node.keys, highlight),
                            ec="none", zorder=3))
    elif node.kind == "text":  # tensors flowing between boxes
        text(ax, node.x, node.y, node.label, st["text"], FS_SMALL + 0.5, style="italic")


def draw_sdpa_formula(ax, highlight: str | None) -> None:
    """softmax( QKᵀ/√d_k, with -inf where j > i ) V, with the softmax being its own box.

    The causal mask is a boolean "may attend" mask (True where key j <= query i), so it is not added to
    the scores: the future keys' scores are set to -inf, which is what the formula says.
    """
    sm = BY_NAME["sdpa_soft"]
    color = style(BY_NAME["sdpa"], highlight)["text"]
    text(ax, sm.x + sm.w / 2 + 0.04, sm.y - 0.01,
         r"$\left(\,QK^{\top}/\sqrt{d_k},\;{-\infty}\ \mathrm{where}\ j>i\,\right)\,V$",
         color, FS_LABEL, ha="left")


def arrow_color(keys, highlight) -> str:
    if highlight is None or is_lit(keys, highlight):
        return ARROW
    return ARROW_MUTED


def draw_edge(ax, edge: Edge, highlight: str | None) -> None:
    color = arrow_color(edge.keys, highlight)
    path = MplPath(edge.points)
    ax.add_patch(FancyArrowPatch(
        path=path, arrowstyle="-|>" if edge.head else "-", mutation_scale=13,
        color=color, lw=1.4, shrinkA=0, shrinkB=0, zorder=0.5, joinstyle="miter",
        capstyle="butt"))


def draw_zoom(ax, box: str, panel: str, highlight: str | None) -> None:
    """Two light dashed lines plus a faint wedge from a box to its detail panel."""
    b, p = BY_NAME[box], BY_NAME[panel]
    lit = is_lit(p.keys, highlight) and highlight is not None
    color = HIGH["edge"] if lit else "#b8b8b8"
    bx = b.x + b.w / 2
    px = p.x - p.w / 2
    pts = [(bx, b.y - b.h / 2), (px, p.y - p.h / 2), (px, p.y + p.h / 2), (bx, b.y + b.h / 2)]
    ax.add_patch(Polygon(pts, closed=True, fc=HIGH_FRAME["fill"] if lit else "#f3f3f3",
                         ec="none", alpha=0.6, zorder=-1))
    for (xa, ya), (xb, yb) in (pts[0:2], pts[2:4]):
        ax.plot([xa, xb], [ya, yb], color=color, lw=1.0, ls=(0, (4, 3)), zorder=-0.5)


def draw(highlight: str | None = None) -> Figure:
    """Draw the diagram with the component `highlight` lit up (None: nothing)."""
    if highlight not in TITLES:
        raise ValueError(f"unknown highlight {highlight!r}; expected None or one of {KEYS}")
    fig = Figure(figsize=(FIG_W, FIG_H), facecolor="white")
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, FIG_W)
    ax.set_ylim(0, FIG_H)
    ax.set_axis_off()
    ax.set_facecolor("white")

    text(ax, FIG_W / 2, Y_TITLE + 0.02, TITLES[highlight], "#1f2328", FS_TITLE, fontweight="bold")
    for box, panel in ZOOMS:
        draw_zoom(ax, box, panel, highlight)
    for node in NODES:
        draw_node(ax, TOKENIZER_BOX if highlight in ("tokenizer", "pretrained") and node.name == "ids" else node, highlight)
    draw_sdpa_formula(ax, highlight)
    for edge in EDGES:
        draw_edge(ax, edge, highlight)
    for x, y, s, keys in ARROW_LABELS:
        color = MUTED["text"] if highlight is not None and not is_lit(keys, highlight) else PLAIN["text"]
        text(ax, x, y, s, color, FS_SMALL, ha="left", style="italic" if len(s) > 1 else "normal")
    return fig


# ---------------------------------------------------------------------------
# The training loop (notebook 11): its own picture, in the same style.  The
# parts notebook 11 builds are lit; the model and autograd's backward pass,
# built before or given by PyTorch, are plain.
# ---------------------------------------------------------------------------

LOOP_W, LOOP_H = 8.5, 4.9


def draw_training_loop() -> Figure:
    """One training step as a cycle of boxes, with the schedule and the checkpoints beside it."""
    fig = Figure(figsize=(LOOP_W, LOOP_H), facecolor="white")
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, LOOP_W)
    ax.set_ylim(0, LOOP_H)
    ax.set_axis_off()
    ax.set_facecolor("white")
    cols, top, mid, low, w, h = (1.1, 3.2, 5.3, 7.4), 3.55, 2.0, 0.6, 1.95, 0.72
    boxes = {  # name: (x, y, label, sub, built in notebook 11)
        "data": (cols[0], top, "token file", "bytes, memory-mapped", True),
        "batch": (cols[1], top, "get_batch", "inputs, targets", True),
        "model": (cols[2], top, "TransformerLM", "notebooks 01-10", False),
        "loss": (cols[3], top, "cross_entropy", "logits → one number", True),
        "back": (cols[3], mid, "loss.backward()", "autograd", False),
        "clip": (cols[2], mid, "gradient_clipping", "one global L2 norm", True),
        "adamw": (cols[1], mid, "AdamW.step()", "m, v, decoupled decay", True),
        "ckpt": (cols[0], mid, "save_checkpoint", "load_checkpoint", True),
        "sched": (cols[1], low, "lr_cosine_schedule", "warm-up, then cosine", True),
    }
    for x, y, label, sub, lit in boxes.values():
        st = HIGH if lit else PLAIN
        pad = 0.08
        ax.add_patch(FancyBboxPatch((x - w / 2 + pad, y - h / 2 + pad), w - 2 * pad, h - 2 * pad,
                                    boxstyle=f"round,pad={pad}", fc=st["fill"], ec=st["edge"], lw=1.3, zorder=1))
        text(ax, x, y + 0.12, label, st["text"])
        text(ax, x, y - 0.15, sub, st["text"], FS_SMALL)

    def side(name: str, where: str, dx: float = 0.0) -> tuple[float, float]:
        x, y = boxes[name][:2]
        return {"t": (x + dx, y + h / 2), "b": (x + dx, y - h / 2), "l": (x - w / 2, y), "r": (x + w / 2, y)}[where]

    def arrow(points, dashed=False):
        ax.add_patch(FancyArrowPatch(path=MplPath(points), arrowstyle="-|>", mutation_scale=13, color=ARROW,
                                     lw=1.4, shrinkA=0, shrinkB=0, zorder=0.5, joinstyle="miter", capstyle="butt",
                                     ls=(0, (4, 3)) if dashed else "-"))

    arrow([side("data", "r"), side("batch", "l")])
    arrow([side("batch", "r"), side("model", "l")])
    arrow([side("model", "r"), side("loss", "l")])
    arrow([side("loss", "b"), side("back", "t")])
    arrow([side("back", "l"), side("clip", "r")])
    arrow([side("clip", "l"), side("adamw", "r")])
    arrow([side("sched", "t"), side("adamw", "b")])
    arrow([side("adamw", "t", 0.45), side("model", "b", -0.45)])
    arrow([side("adamw", "l"), side("ckpt", "r")], dashed=True)
    for x, y, label in [(cols[1] + 0.08, (low + mid) / 2, "learning rate"),
                        (cols[1] + 1.2, (mid + top) / 2 + 0.1, "new weights"),
                        (cols[3] + 0.08, (mid + top) / 2, "gradients"),
                        (cols[0] - 0.75, mid - 0.55, "every N steps")]:
        text(ax, x, y, label, PLAIN["text"], FS_SMALL, ha="left", style="italic")
    text(ax, LOOP_W / 2, LOOP_H - 0.38, "One training step: what notebook 11 builds (orange)", "#1f2328", FS_TITLE,
         fontweight="bold")
    return fig

def main() -> None:
    # A fixed hash salt and no date make the SVGs byte-identical from run to run;
    # text is drawn as paths so the files look the same without the font installed.
    svg_rc = {"svg.hashsalt": "transformer-from-scratch", "svg.fonttype": "path"}
    with matplotlib.rc_context(svg_rc):
        for key in [None, *KEYS]:
            name = "architecture.svg" if key is None else f"architecture_{key}.svg"
            draw(key).savefig(OUT_DIR / name, format="svg", facecolor="white",
                              metadata={"Date": None})
            print(f"wrote {OUT_DIR / name}")
        draw_training_loop().savefig(OUT_DIR / "training_loop.svg", format="svg", facecolor="white",
                                     metadata={"Date": None})
        print(f"wrote {OUT_DIR / 'training_loop.svg'}")


if __name__ == "__main__":
    main()
