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

MAX_BEAM_SIZE = 1000
"""The largest beam (``--beam`` of ``translate``, ``evaluate``, ``tune-alpha`` and
``generate``, and the ``beam_size`` of a ``tuned_alpha.json`` or a converted model's
``num_beams``). A beam search keeps K hypotheses per sentence and scores K × vocabulary
continuations per step, so its memory grows with K: ``--beam 1000000000000`` would ask for
terabytes. Published systems use beams of 4 to a few dozen, and studies of very wide beams go to
a few hundred; 1000 leaves room for those while keeping one step of one sentence within a few
GB for a 32k vocabulary."""

MAX_EXPLAIN_TOKENS = 64
"""The most tokens ``aiayn explain --tokens`` traces. The trace prints every intermediate (the
T × T scores of each head among them), so it is meant for a sentence read by eye; 20,000
words grew to 23 GB. 64 tokens is a long sentence and prints in well under a second."""

MAX_EXPLAIN_D_MODEL = 512
"""The largest ``d_model`` of ``aiayn explain`` (``--d-model``, or the size of the matrices a
``--weights`` file gives). The trace holds and prints four d_model × d_model matrices; 512 (the
paper's base model) is the largest size worth reading, and takes a few MB."""

MAX_EXPLAIN_HEADS = 64
"""The most heads of ``aiayn explain --heads`` (they must also divide ``d_model``): each head's
T × T scores, weights and outputs are printed."""

MAX_EXPLAIN_WEIGHTS_BYTES = 64 * 1024 * 1024
"""The largest ``aiayn explain --weights`` JSON file read: four 512 × 512 matrices and 64
embedding rows written with full float precision take about 25 MB."""

MAX_CHECKPOINT_JSON_BYTES = 64 * 1024 * 1024
"""The largest ``state.json`` or ``SHA256SUMS`` of a checkpoint read. aiayn writes a few KB
(the run config, the random states, one line per file); the bound keeps a hostile checkpoint
from making a reader take all memory before it is checked."""
