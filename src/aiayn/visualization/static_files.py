"""The pages' HTML templates, style sheets and scripts, kept as files in the package (a
package's ``static/`` folder: :mod:`aiayn.visualization`'s for the attention pages,
:mod:`aiayn.serving`'s for the playground) and read with :mod:`importlib.resources`, so that
they are found wherever the package is installed; each file is read once.

A template names its values as ``$name`` (:class:`string.Template`): :func:`fill` puts them in
as given, without reading them again, so a value is escaped for its place (``html.escape``, or
:func:`~aiayn.visualization.attention_page.script_json` inside a ``<script>``) before it is
passed. Style sheets and scripts are put into templates as values, so their braces and ``$``
are never read as placeholders.
"""

from __future__ import annotations

import functools
import string
from importlib import resources

__all__ = ["fill", "page_file", "static_text"]


@functools.cache
def static_text(package: str, name: str) -> str:
    """The text of ``static/<name>`` in ``package`` (e.g. ``"aiayn.serving"``), read once."""
    return (resources.files(package) / "static" / name).read_text(encoding="utf-8")


def page_file(name: str) -> str:
    """The text of ``static/<name>`` in :mod:`aiayn.visualization` (the attention pages')."""
    return static_text("aiayn.visualization", name)


def fill(template: str, **values: object) -> str:
    """``template`` with each ``$name`` replaced by ``values[name]`` (as ``str``, unescaped);
    a placeholder without a value raises :class:`KeyError`."""
    return string.Template(template).substitute(values)
