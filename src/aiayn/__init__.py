"""aiayn: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017)."""

from aiayn.config import PRESETS, TransformerConfig, preset
from aiayn.errors import ConfigError, UserError

__version__ = "0.1.0"

__all__ = ["PRESETS", "ConfigError", "TransformerConfig", "UserError", "__version__", "preset"]
