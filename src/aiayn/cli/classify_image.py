"""``aiayn classify-image``: the top-k labels of images with a ViT classification checkpoint
(Dosovitskiy et al. 2021), preprocessed as its folder's ``preprocessor_config.json`` says."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from aiayn.cli.commands import (
    add_batch_size_option,
    add_command,
    add_device_option,
)
from aiayn.validation import PositiveInt, flag_type


def register(subparsers: Any) -> None:
    """Add the ``classify-image`` sub-command."""
    p = add_command(
        subparsers,
        "classify-image",
        run,
        help="the most probable labels of images with a ViT checkpoint",
        description="For each image, print its path and then the --top-k labels, one line "
        "each: probability and label (the config's id2label, else the class index).",
    )
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files")
    p.add_argument("--checkpoint", required=True, help="a ViT checkpoint with a classifier")
    p.add_argument(
        "--top-k", type=flag_type(PositiveInt), help="labels per image (5, or every label if fewer)"
    )
    add_batch_size_option(p, 16, "images")
    add_device_option(p, quantize=True)


def run(args: argparse.Namespace) -> int:
    """Classify every image and print the top labels."""
    import torch

    from aiayn.checkpoint import checkpoint_preprocessor
    from aiayn.cli.commands import load_model_checkpoint
    from aiayn.errors import UserError
    from aiayn.inference.encoder import ViTInference
    from aiayn.models.vit import ViT

    ckpt = load_model_checkpoint(args, ViT, "classify-image")
    model, config = ckpt.model, ckpt.model.config
    if config.num_labels < 1:
        raise UserError(f"{ckpt.path} holds a ViT without a classifier (num_labels = 0)")
    top_k = min(5, config.num_labels) if args.top_k is None else args.top_k
    if not 1 <= top_k <= config.num_labels:
        raise UserError(f"--top-k must be in 1..{config.num_labels}, got {top_k}")
    preprocessor = checkpoint_preprocessor(ckpt.path)
    device = next(model.parameters()).device
    run = ViTInference(model.eval())  # the blocks flattened, held equal to model.forward
    lines = []
    for start in range(0, len(args.images), args.batch_size):
        paths = args.images[start : start + args.batch_size]
        pixels = preprocessor.preprocess_batch(paths).to(device)  # (B, C, H, W)
        logits = run(pixels).logits
        assert logits is not None  # num_labels >= 1 was checked
        probs = torch.softmax(logits.float(), dim=-1)  # (B, labels)
        top = probs.topk(top_k, dim=-1)
        for path, values, indices in zip(paths, top.values, top.indices, strict=True):
            lines.append(str(path))
            for p, i in zip(values.tolist(), indices.tolist(), strict=True):
                label = config.id2label[i] if config.id2label else str(i)
                lines.append(f"{p:.4f}\t{label}")
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0
