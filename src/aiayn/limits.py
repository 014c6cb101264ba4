"""Bounds on the work an input from someone else can ask of aiayn: each limit lives here and
nowhere else, with why it has its value; docs/reliability.md ("Files from others") lists them
with the commands they bound. An input beyond a limit is refused in one line naming the limit,
before the work starts.
"""

from __future__ import annotations

MAX_IMAGE_PIXELS = 64_000_000
"""The most pixels (width × height) of an image file aiayn decodes (``classify-image``,
``attention --image``; :func:`aiayn.data.images.open_image`). It is read from the file's header
before any pixel is decoded, so a small file claiming a huge size (a "decompression bomb": a
12000 × 12000 PNG of a few hundred KB decodes to hundreds of MB) is refused without the memory.
64 million pixels takes the largest photos of common cameras and phones (50 MP sensors, 8160 ×
6120) with room to spare, and is below Pillow's own warning threshold (``Image.MAX_IMAGE_PIXELS``,
about 89 million), whose raw warning is therefore never printed."""
