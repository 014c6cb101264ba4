"""Reading the JSON objects of model folders (a Hugging Face ``config.json``, its
``generation_config.json``, a ``preprocessor_config.json``): one readable object or a
:class:`~aiayn.errors.UserError` naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiayn.errors import UserError


def read_json_object(file: Path, what: str) -> dict[str, Any]:
    """``file``'s JSON object as a dict.

    Raises:
        UserError: naming ``file`` and ``what`` it holds (e.g. "the model config") when it cannot
            be read or parsed, or is JSON but not an object.
    """
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{file}: cannot read {what} ({exc})") from None
    if not isinstance(value, dict):
        raise UserError(f"{file}: not a JSON object")
    return value
