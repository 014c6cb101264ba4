"""On a machine with a CUDA device: every family's int8 model (``quantize_model``) on the GPU,
where ``QuantizedLinear`` runs its fp32 reference of the int8 scheme, against the same model on
the CPU, where it runs the int8 kernels. Prints the largest difference of the main output.

    PYTHONPATH=src python scripts/check_int8_cuda.py
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.inference.quantize import quantize_model
from aiayn.layers.quantized import QuantizedLinear
from aiayn.models.families import FAMILIES, Family


def first_tensor(out: object) -> Tensor:
    """The first tensor of a model's output (a tensor, a tuple or an output dataclass)."""
    if isinstance(out, Tensor):
        return out
    values = out if isinstance(out, (list, tuple)) else vars(out).values()
    return next(v for v in values if isinstance(v, Tensor))


def inputs(family: Family, config: object) -> tuple[Tensor, ...]:
    """A batch of 2 random inputs the family reads: images, or ids (source and target for the
    encoder-decoders, which are called with two)."""
    if family.reads == "image":
        size = config.image_size  # type: ignore[attr-defined]
        return (torch.randn(2, config.num_channels, size, size),)  # type: ignore[attr-defined]
    ids = torch.randint(4, min(config.vocab_size, 100), (2, 7))  # type: ignore[attr-defined]
    return (ids, ids) if "translate" in family.commands else (ids,)


def main() -> None:
    torch.manual_seed(0)
    print(torch.__version__, torch.cuda.get_device_name(0))
    for family in FAMILIES.values():
        config = family.presets.build(family.default_preset)
        model: nn.Module = family.build(config).eval()
        for p in model.parameters():
            p.data.normal_(0, 0.05)
        q = quantize_model(model, "int8")
        count = sum(isinstance(m, QuantizedLinear) for m in q.modules())
        args = inputs(family, config)
        with torch.no_grad():
            cpu = first_tensor(q(*args))
            gpu = first_tensor(q.to("cuda")(*[a.cuda() for a in args])).cpu()
        difference = (cpu - gpu).abs().max().item()
        print(f"{family.name}: {count} int8 linears, max |cpu - cuda| {difference:.2e} "
              f"(outputs up to {cpu.abs().max().item():.2f})")


if __name__ == "__main__":
    main()
