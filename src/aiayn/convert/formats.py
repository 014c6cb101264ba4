"""The formats ``aiayn export`` writes and the weight types it offers: names that the command
(:mod:`aiayn.convert.export`) and the converters (:mod:`aiayn.convert.to_ct2`) share, kept
below both so that neither imports the other for them."""

from __future__ import annotations

FORMATS = {"ct2": "CTranslate2", "onnx": "ONNX"}
"""``aiayn export --to`` values -> the format's name in prose."""

QUANTIZATIONS = ("float32", "int8_float32", "int8")
"""The weight types ``aiayn export --to ct2 --quantization`` offers (CPU inference)."""
