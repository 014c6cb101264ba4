"""The attention of any text model over one input, in one form every view draws.

Each family's capture function (named in the family registry, ``Family.attention``) runs its
model once on the user's input and returns a :class:`TokenAttention`: the token labels and, for
each use of attention the model has (a :class:`AttentionView`: GPT-2's causal self-attention,
BERT's bidirectional self-attention, an encoder–decoder's encoder self-attention, masked decoder
self-attention and encoder–decoder attention, §3.2.3), the weights of every layer and head as
the model's forward returned them (``need_weights=True``: the weights of the one attention
function, :func:`aiayn.attention.scaled_dot_product_attention`; nothing is recomputed).

The PNG heatmaps (:func:`write_view_pngs`), the HTML page (:mod:`aiayn.visualization.html_report`)
and the head view (:mod:`aiayn.visualization.head_view`) draw a :class:`TokenAttention`; this
module imports neither (the page's data: :mod:`aiayn.visualization.attention_page`).

:class:`AttentionRequest` is what the user asked for (``aiayn attention``'s flags); each capture
function reads the parts its family takes.

Shape legend:
    N  layers     H  heads     R  rows (queries)     C  columns (keys)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeAlias

from torch import Tensor

from aiayn.errors import LengthError

__all__ = [
    "AttentionLike",
    "AttentionRequest",
    "AttentionView",
    "HasTokenAttention",
    "TokenAttention",
    "check_length",
    "readable",
    "write_view_pngs",
]


@dataclass(frozen=True)
class AttentionRequest:
    """What ``aiayn attention`` was asked to draw.

    Attributes:
        text: the input text (a translation model's source sentence, a language model's prompt,
            BERT's text), or None for an image.
        target: an encoder–decoder's target sentence, or None (the model's own greedy output).
        continuation: a language model: how many tokens of its greedy continuation to append
            to the prompt (0: the prompt alone).
        image: an image file (ViT), or None.
        max_tokens: the most tokens a side of a map may have (None: the model's limit only).
    """

    text: str | None = None
    target: str | None = None
    continuation: int = 0
    image: str | None = None
    max_tokens: int | None = None


@dataclass(frozen=True, eq=False)
class AttentionView:
    """One use of attention in a model, every layer and head.

    Attributes:
        name: its name in file names and the page (``self``, ``encoder_self``, ``cross`` …).
        title: its name in prose ("causal self-attention").
        rows: R labels of the queries.
        cols: C labels of the keys.
        layers: per layer, (H, R, C) weights; every row sums to 1 (a softmax, eq. 1).
        axis_names: what the rows and the columns are ("query: prompt token", …).
    """

    name: str
    title: str
    rows: list[str]
    cols: list[str]
    layers: list[Tensor]
    axis_names: tuple[str, str] = ("query", "key")

    @property
    def num_heads(self) -> int:
        """H, the heads of its first layer (every family here has as many in each layer)."""
        return int(self.layers[0].shape[0])


@dataclass(frozen=True, eq=False)
class TokenAttention:
    """The attention of a text model on one input.

    Attributes:
        title: what was run, for the page's heading ("GPT-2 attention: 'The cat'").
        lines: (label, text) pairs describing the input ("Prompt", …), shown above the views.
        views: the model's uses of attention, each with every layer and head.
        note: a paragraph on how to read the views (plain text).
        inputs: the ids the model read, by Hugging Face's argument names (``input_ids``,
            ``decoder_input_ids``), for checks against other implementations.
        highlight: per view name, token indexes to mark (a continuation's tokens, BERT's
            ``[MASK]``), as (row indexes, column indexes).
        focus: per view name, a query row the head view isolates when it opens (BERT's first
            ``[MASK]``), or absent.
        marked: what the highlighted tokens are ("the model's greedy continuation").
    """

    title: str
    lines: list[tuple[str, str]]
    views: list[AttentionView]
    note: str = ""
    inputs: dict[str, list[int]] = field(default_factory=dict)
    highlight: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    focus: dict[str, int] = field(default_factory=dict)
    marked: str = ""

    def view(self, name: str) -> AttentionView:
        """The view called ``name``."""
        for view in self.views:
            if view.name == name:
                return view
        names = ", ".join(v.name for v in self.views)
        raise ValueError(f"unknown attention view {name!r} (choose from {names})")

    def summary(self) -> list[str]:
        """Lines for the terminal: the input and each view's size."""
        out = [f"{label}: {text}" for label, text in self.lines]
        for view in self.views:
            size = f"{len(view.layers)} layers × {view.num_heads} heads"
            out.append(f"{view.title}: {len(view.rows)} × {len(view.cols)} tokens, {size}")
        return out


class HasTokenAttention(Protocol):
    """What converts itself into a :class:`TokenAttention` (an encoder–decoder's
    ``AttentionMaps``, a ViT's result): the pages draw it through that."""

    def token_attention(self) -> TokenAttention:
        """These weights as a :class:`TokenAttention`."""
        ...


AttentionLike: TypeAlias = TokenAttention | HasTokenAttention
"""What the attention pages (:mod:`aiayn.visualization.html_report`, the head view) draw."""


def readable(label: str) -> str:
    """A token label with its whitespace and control characters visible: a leading space as
    ``▁``, a newline as ``\\n``, any other unprintable character as its escape (``\\x1d``)."""
    if label.startswith(" "):
        label = "▁" + label[1:]
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in label)


def check_length(what: str, tokens: int, model_limit: int | None, max_tokens: int | None) -> None:
    """Refuse ``tokens`` (of ``what``: "the source sentence") beyond the model's learned
    positions ``model_limit`` or the drawing limit ``max_tokens`` (None: no such limit)."""
    if model_limit is not None and tokens > model_limit:
        raise LengthError(
            f"{what} has {tokens} tokens; this model's limit is {model_limit}",
            tokens=tokens,
            limit=model_limit,
        )
    if max_tokens is not None and tokens > max_tokens:
        raise LengthError(
            f"{what} has {tokens} tokens, more than --max-tokens {max_tokens}: maps that size are "
            "unreadable and take minutes and gigabytes to draw; shorten it or raise --max-tokens",
            tokens=tokens,
            limit=max_tokens,
        )


def _cell_size(rows: int, cols: int) -> tuple[float, float]:
    """Figure (width, height) in inches for an R × C map with tick labels and a colour bar."""
    return (max(3.5, 0.28 * cols + 2.2), max(3.0, 0.28 * rows + 1.6))


def draw_heatmap(
    weights: Tensor,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    title: str,
    path: Path,
    *,
    axis_names: tuple[str, str] = ("query", "key"),
) -> Path:
    """Write one (R, C) attention map as a PNG: white = 0, dark blue = 1, labelled axes and a
    colour bar."""
    from matplotlib.figure import Figure

    rows, cols = weights.shape
    fig = Figure(figsize=_cell_size(rows, cols), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(weights.numpy(), cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(cols), list(col_labels), rotation=90, fontsize=8)
    ax.set_yticks(range(rows), list(row_labels), fontsize=8)
    ax.set_ylabel(axis_names[0])
    ax.set_xlabel(axis_names[1])
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, shrink=0.8, label="attention weight")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    return path


def _draw_overview(view: AttentionView, caption: str, path: Path) -> Path:
    """Every layer (rows) × head (columns) of one view in one figure, without tick labels."""
    from matplotlib.figure import Figure

    heads = view.num_heads
    n = len(view.layers)
    fig = Figure(figsize=(1.9 * heads + 1.2, 1.9 * n + 0.6), layout="constrained")
    axes = fig.subplots(n, heads, squeeze=False)
    image = None
    for layer, weights in enumerate(view.layers):  # weights: (H, R, C)
        for head in range(heads):
            ax = axes[layer][head]
            image = ax.imshow(weights[head].numpy(), cmap="Blues", vmin=0.0, vmax=1.0)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=8)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    fig.suptitle(f"{view.title}: {caption}", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    return path


def view_filename(name: str, layer: int, head: int) -> str:
    """``{name}_L{layer}_H{head}.png``; ``layer`` and ``head`` count from 1."""
    return f"{name}_L{layer}_H{head}.png"


def write_view_pngs(
    views: Sequence[AttentionView], caption: str, out_dir: Path, *, overview: bool = True
) -> list[Path]:
    """Draw every (view, layer, head) map into ``out_dir``; returns the files written.

    Files: ``{view}_L{layer}_H{head}.png`` for each map and, with ``overview``,
    ``{view}_all.png`` with every layer and head of that view (``caption`` in its title).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for view in views:
        for layer, weights in enumerate(view.layers, start=1):  # weights: (H, R, C)
            for head in range(1, weights.shape[0] + 1):
                title = f"{view.title}, layer {layer}, head {head}"
                path = out_dir / view_filename(view.name, layer, head)
                written.append(
                    draw_heatmap(
                        weights[head - 1],
                        view.rows,
                        view.cols,
                        title,
                        path,
                        axis_names=view.axis_names,
                    )
                )
        if overview:
            written.append(_draw_overview(view, caption, out_dir / f"{view.name}_all.png"))
    return written
