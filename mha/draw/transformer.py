"""The encoder-decoder Transformer, drawn by code, with its three attentions marked.

1. encoder self-attention (Q, K and V all projected from the source; source padding
   mask),
2. decoder causal self-attention (Q, K and V all projected from the target so far;
   causal AND target padding mask),
3. encoder-decoder cross-attention (Q from the decoder, K and V from the encoder's
   output "memory"; source padding mask).

(Three different projections of one sequence, not three equal matrices.)

Every attention and feed-forward block has a residual connection: its input
skips round it, on the right of the column, and is added to its output in the
"add & norm" box above it.

Coordinates are inches on a single axes, so boxes and text keep their size.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from mha.draw.style import EDGE_COLOR, TICK_PT, TITLE_PT, set_alt_text, tint

# Kinds of attention, not heads: colours from the same colour-blind-safe
# palette, chosen away from heads 0 and 1 (blue, orange) that most figures use.
ATTENTION_COLORS: dict[str, str] = {
    "encoder self-attention": "#009E73",
    "decoder causal self-attention": "#D55E00",
    "cross-attention": "#CC79A7",
}

_W, _H = 7.6, 7.45  # figure size in inches
_ENC_X, _ENC_W = 1.85, 2.5  # centre and width of the encoder column
_DEC_X, _DEC_W = 5.7, 2.6
_PAD = 0.2  # between a column's boxes and the panel of its layer
_SKIP = 0.11  # residual paths run this far right of the boxes, inside the panel
_GAP = 0.26  # vertical room for an arrow between two boxes
_FONT = 9.0


def _box(ax: Axes, cx: float, y: float, w: float, h: float, text: str, *,
         color: str | None = None, gid: str = "block") -> FancyBboxPatch:
    """A rounded box with centred text; ``color`` marks an attention block."""
    face = tint(color, 0.28) if color else "#FFFFFF"
    box = FancyBboxPatch((cx - w / 2, y), w, h, boxstyle="round,pad=0,rounding_size=0.07",
                         facecolor=face, edgecolor=color or EDGE_COLOR,
                         linewidth=2.0 if color else 0.9, zorder=2)
    box.set_gid(gid)
    ax.add_patch(box)
    ax.text(cx, y + h / 2, text, ha="center", va="center", fontsize=_FONT, zorder=3,
            linespacing=1.35)
    return box


def _arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float]) -> None:
    arrow = FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=11, linewidth=1.1,
                            color="#333333", shrinkA=0, shrinkB=0, zorder=1)
    arrow.set_gid("arrow")
    ax.add_patch(arrow)


def _stack(ax: Axes, cx: float, w: float, y: float,
           blocks: list[tuple[str, float, str | None, str]]) -> list[tuple[float, float]]:
    """Boxes bottom to top with arrows between; returns each box's (bottom, top)."""
    spans = []
    for i, (text, h, color, gid) in enumerate(blocks):
        if i:
            _arrow(ax, (cx, y - _GAP), (cx, y))
        _box(ax, cx, y, w, h, text, color=color, gid=gid)
        spans.append((y, y + h))
        y += h + _GAP
    return spans


def _frame(ax: Axes, cx: float, w: float, bottom: float, top: float, label: str,
           side: str) -> None:
    """The light panel around one layer, with "N x" written beside it."""
    pad = _PAD
    frame = FancyBboxPatch((cx - w / 2 - pad, bottom - pad), w + 2 * pad, top - bottom + 2 * pad,
                           boxstyle="round,pad=0,rounding_size=0.12", facecolor="#F4F4F4",
                           edgecolor="#9A9A9A", linewidth=0.9, zorder=0)
    frame.set_gid("layer")
    ax.add_patch(frame)
    x = cx - w / 2 - pad - 0.06 if side == "left" else cx + w / 2 + pad + 0.06
    # Rotated 90 degrees, the text's "bottom" faces right: va picks the side.
    ax.text(x, (bottom + top) / 2, label, ha="center",
            va="bottom" if side == "left" else "top", fontsize=TICK_PT, rotation=90,
            rotation_mode="anchor")


def _residual(ax: Axes, cx: float, w: float, sublayer: tuple[float, float],
              add_norm: tuple[float, float]) -> None:
    """The skip path round one sublayer: from its input arrow to the add & norm box."""
    start = sublayer[0] - _GAP / 2  # halfway up the arrow into the sublayer
    side = cx + w / 2 + _SKIP
    mid = (add_norm[0] + add_norm[1]) / 2
    line, = ax.plot([cx, side, side], [start, start, mid], color="#333333", linewidth=1.1,
                    zorder=1, solid_joinstyle="miter")
    line.set_gid("residual")
    dot, = ax.plot([cx], [start], marker="o", markersize=3.5, color="#333333", zorder=1)
    dot.set_gid("residual")
    arrow = FancyArrowPatch((side, mid), (cx + w / 2, mid), arrowstyle="-|>",
                            mutation_scale=9, linewidth=1.1, color="#333333", shrinkA=0,
                            shrinkB=0, zorder=1)
    arrow.set_gid("residual")
    ax.add_patch(arrow)


def transformer_figure(*, source: str = "You are welcome",
                       target: str = "<s> De nada") -> Figure:
    """Draw the encoder-decoder Transformer with its three attentions highlighted.

    Parameters
    ----------
    source : str
        Encoder input, written under the encoder.
    target : str
        Decoder input (the target shifted right, starting with a start token), written
        under the decoder; the output label shows it shifted back left, ending in </s>.

    Returns
    -------
    matplotlib.figure.Figure
        The three attention blocks are patches with gid ``"attention"``, coloured
        by ``ATTENTION_COLORS``; the other blocks have gid ``"block"``. Each of the
        five residual connections (two in the encoder layer, three in the decoder
        layer) is a line, a dot and an arrow with gid ``"residual"``, the arrow
        ending on the right edge of its add & norm box.
    """
    if not isinstance(source, str) or not isinstance(target, str):
        raise ValueError("source and target must be strings")
    fig = plt.figure(figsize=(_W, _H), facecolor="white")
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, _W)
    ax.set_ylim(0, _H)
    ax.set_axis_off()
    enc, dec, cross = ATTENTION_COLORS.values()

    base = 0.45
    ax.text(_ENC_X, 0.22, f"source: {source}", ha="center", va="center", fontsize=_FONT)
    ax.text(_DEC_X, 0.22, f"target shifted right: {target}", ha="center", va="center",
            fontsize=_FONT)
    embed = "embedding + positional encoding"
    e = _stack(ax, _ENC_X, _ENC_W, base, [
        (embed, 0.4, None, "block"),
        ("(1) encoder self-attention\nQ, K, V all from the source\nmask: source padding", 0.78, enc,
         "attention"),
        ("add & norm", 0.32, None, "block"),
        ("feed-forward", 0.4, None, "block"),
        ("add & norm", 0.32, None, "block"),
    ])
    d = _stack(ax, _DEC_X, _DEC_W, base, [
        (embed, 0.4, None, "block"),
        ("(2) decoder causal self-attention\nQ, K, V all from the target so far\n"
         "mask: causal AND target padding", 0.78, dec, "attention"),
        ("add & norm", 0.32, None, "block"),
        ("(3) cross-attention (encoder-decoder)\nQ from decoder, K and V from memory\n"
         "mask: source padding", 0.78, cross, "attention"),
        ("add & norm", 0.32, None, "block"),
        ("feed-forward", 0.4, None, "block"),
        ("add & norm", 0.32, None, "block"),
        ("linear to the target vocabulary", 0.36, None, "block"),
        ("softmax", 0.32, None, "block"),
    ])
    # Residual connections: each sublayer's input is added to its output.
    for sub, add in ((1, 2), (3, 4)):
        _residual(ax, _ENC_X, _ENC_W, e[sub], e[add])
    for sub, add in ((1, 2), (3, 4), (5, 6)):
        _residual(ax, _DEC_X, _DEC_W, d[sub], d[add])
    for cx, first in ((_ENC_X, e[0]), (_DEC_X, d[0])):
        _arrow(ax, (cx, 0.34), (cx, first[0]))
    _frame(ax, _ENC_X, _ENC_W, e[1][0], e[-1][1], "encoder layer × N", "left")
    _frame(ax, _DEC_X, _DEC_W, d[1][0], d[6][1], "decoder layer × N", "right")
    out_top = d[-1][1]
    _arrow(ax, (_DEC_X, out_top), (_DEC_X, out_top + _GAP))
    # The decoder predicts its input shifted left by one: drop the start token, add </s>.
    predicted = " ".join(target.split()[1:] + ["</s>"])
    ax.text(_DEC_X, out_top + _GAP + 0.14, f"probabilities of the next token: {predicted}",
            ha="center", va="center", fontsize=_FONT)

    # The encoder's output ("memory") feeds K and V of every cross-attention.
    enc_top = e[-1][1] + 0.14
    cross_mid = (d[3][0] + d[3][1]) / 2
    turn_x = _ENC_X + _ENC_W / 2 + 0.45
    ax.plot([_ENC_X, _ENC_X, turn_x, turn_x], [enc_top, enc_top + 0.35, enc_top + 0.35,
            cross_mid], color="#333333", linewidth=1.1, zorder=1, solid_joinstyle="miter")
    _arrow(ax, (turn_x, cross_mid), (_DEC_X - _DEC_W / 2, cross_mid))
    ax.text(_ENC_X, enc_top + 0.5, "encoder output (memory)", ha="center", va="bottom",
            fontsize=_FONT)
    ax.text(turn_x + 0.12, cross_mid + 0.06, "K, V", ha="left", va="bottom", fontsize=_FONT)
    # Left of the arrow: the residual path leaves it to the right.
    ax.text(_DEC_X - 0.08, d[3][0] - _GAP / 2, "Q", ha="right", va="center", fontsize=_FONT)
    ax.text(_W / 2, _H - 0.2, "Where a Transformer uses attention", ha="center", va="center",
            fontsize=TITLE_PT)
    return set_alt_text(
        fig, "Block diagram of an encoder-decoder Transformer with its three attentions "
        "highlighted: encoder self-attention, decoder causal self-attention, and "
        "cross-attention whose keys and values come from the encoder output; a residual "
        "path runs round every attention and feed-forward block into the add & norm "
        "box above it."
    )
