"""Bounds on the work an input from someone else can ask of aiayn: each limit lives here and
nowhere else. docs/reliability.md ("Bounded work") gives the commands each one bounds, and its
lab book (docs/notes/reliability.md) each one's reasons. An input beyond a limit is refused in
one line naming the limit, before the work starts.
"""

from __future__ import annotations

MAX_IMAGE_PIXELS = 64_000_000
"""The most pixels (width × height) of an image file aiayn decodes (``classify-image``,
``attention --image``; :func:`aiayn.data.images.open_image`). It is read from the file's header
before any pixel is decoded, so a small file claiming a huge size (a "decompression bomb") is
refused without the memory. It stays below Pillow's own warning threshold
(``Image.MAX_IMAGE_PIXELS``), whose raw warning is therefore never printed. It also bounds the
conversion to the model's mode: at most 4 bytes a pixel (Pillow stores RGB as 4), 256 MB."""

MAX_IMAGE_SIDE = 16_384
"""The longest side (width or height, in pixels) of an image file aiayn decodes, read from the
header with :data:`MAX_IMAGE_PIXELS`. The pixel count alone does not bound the resize: Pillow's
resampling keeps, for every output pixel, weights over the input pixels it covers, about 14
bytes per pixel of the input's side (bilinear; more for bicubic and Lanczos), so a very long,
thin image within the pixel bound costs gigabytes to resize (docs/reliability.md, "Bounded work",
gives the measurement). Bounding the side bounds those tables to about 0.25 MB and the resize's
intermediate image to the output's side × this; any aspect ratio within it is accepted (the
cost grows with the side, not the ratio). 16,384 is WebP's own limit and twice the side of the
largest square within :data:`MAX_IMAGE_PIXELS`: a camera's photo (≤ 8,000 a side at 64 MP) or
a panorama up to 16,384 wide passes."""

MAX_BEAM_SIZE = 1000
"""The largest beam (``--beam`` of ``translate``, ``evaluate``, ``tune-alpha`` and
``generate``, and the ``beam_size`` of a ``tuned_alpha.json`` or a converted model's
``num_beams``; the most ``aiayn serve --max-beam`` may allow). A beam search keeps K hypotheses
per sentence and scores K × V continuations per step, so its memory grows with K."""

MAX_LENGTH_PENALTY_ALPHA = 10.0
"""The largest α of beam search's length penalty (``--alpha``, a request's ``alpha``, a
``tuned_alpha.json``). GNMT's penalty ((5 + |Y|) / 6)^α overflows a float64 from α ≈ 76 at the
longest outputs (65,536 tokens), and a server answered such a request 500; published settings
lie in 0.6-2 (the paper's 0.6, Hugging Face's 1.0), and ``tune-alpha`` searches 0-2."""

SERVE_MAX_BEAM = 16
"""``aiayn serve``'s default ``--max-beam``: the largest ``beam`` (and so ``n_best``) a
``/v1/translate`` request may ask. A beam's time and memory grow with K (docs/serving.md gives a
measured request at beam 1,000), while translation quality stops
improving well before 16: the paper decodes with 4, Marian and T5 releases with 4-6, and BLEU
falls again for larger beams (Koehn and Knowles 2017, "Six challenges for neural machine
translation"). A server that wants larger beams sets the flag, up to :data:`MAX_BEAM_SIZE`."""

MAX_EXPLAIN_TOKENS = 64
"""The most tokens ``aiayn explain --tokens`` traces. The trace prints every intermediate (the
T × T scores of each head among them): it is meant for a sentence read by eye."""

MAX_EXPLAIN_D_MODEL = 512
"""The largest ``d_model`` of ``aiayn explain`` (``--d-model``, or the size of the matrices a
``--weights`` file gives): the trace holds and prints four d_model × d_model matrices; 512 is
the paper's base model."""

MAX_EXPLAIN_HEADS = 64
"""The most heads of ``aiayn explain --heads`` (they must also divide ``d_model``): each head's
T × T scores, weights and outputs are printed."""

MAX_POSITION_BIAS_REACH = 4096
"""The farthest relative position ``aiayn attention --bias`` draws (``--bias-reach``): each is
a column of the picture; T5's buckets stop changing at ``max_distance`` (128 in the releases)."""

MAX_EXPLAIN_WEIGHTS_BYTES = 64 * 1024 * 1024
"""The largest ``aiayn explain --weights`` JSON file read: room for four
:data:`MAX_EXPLAIN_D_MODEL`-square matrices and :data:`MAX_EXPLAIN_TOKENS` embedding rows
written with full float precision."""

MAX_CHECKPOINT_JSON_BYTES = 64 * 1024 * 1024
"""The largest ``state.json`` or ``SHA256SUMS`` of a checkpoint read: far more than aiayn
writes (the run config, the random states, one line per file); the bound keeps a hostile
checkpoint from making a reader take all memory before it is checked."""

MAX_REQUEST_ITEMS = 1024
"""The most texts (or prompts × ``n`` completions) one ``aiayn serve`` request may carry: a
request is merged into batches whole, so its size bounds the work one client queues at once.
OpenAI's embeddings take up to 2,048 inputs; half that keeps one request's answer and Python
bookkeeping small next to the queue's other requests, and :data:`SERVE_MAX_REQUEST_TOKENS`
bounds its work."""

SERVE_MAX_REQUEST_TOKENS = 65_536
"""``aiayn serve``'s default ``--max-request-tokens``: the most tokens one request may ask the
model to hold: for ``/v1/translate``, each text's source tokens plus its output limit, times
the beam; for ``/v1/completions``, each prompt's tokens plus ``max_tokens``, times ``n``; for
the encoder endpoints, the input tokens. A decoder's key/value cache and a beam's rows grow with
exactly this count, so it bounds a request's memory whatever mix of items, lengths, beam and
``n`` it asks. 16 times the default ``--max-batch-tokens`` (4,096): 64 greedy translations of
512 + 512 tokens, or one completion prompt of 1,024 positions with ``n`` = 16 and room to spare
for beam 16 over four long sentences."""

MAX_REQUEST_TOKENS = 1 << 22
"""The largest ``aiayn serve --max-request-tokens`` (4,194,304 tokens: a GPU server's room)."""

MAX_REQUEST_BODY_BYTES = 64 * 1024 * 1024
"""The largest ``--max-body-bytes`` of ``aiayn serve`` (the body size it accepts per request,
1 MiB by default): room for an uploaded image well beyond what a ViT reads."""

MAX_COMPLETION_CHOICES = 16
"""The most completions ``n`` per prompt of ``aiayn serve``'s ``/v1/completions`` (and
``best_of``): each is a row of the decode with its own key/value cache, so ``n`` multiplies a
prompt's memory; 16 covers what sampling clients ask (OpenAI's default is 1, its documentation
advises small values for cost) and :data:`SERVE_MAX_REQUEST_TOKENS` bounds the product."""

MAX_ATTENTION_TOKENS = 160
"""The most tokens a side of an attention map (source with EOS, decoder input with BOS):
``aiayn attention --max-tokens``'s default and ``aiayn serve``'s ``/v1/attention`` bound.
Labelled maps beyond it are unreadable, their figures (which grow with the square of the
tokens) take minutes and gigabytes to draw, and a served map's JSON grows the same way."""

MAX_ATTENTION_WEIGHTS = 2**21
"""The most weights one ``POST /v1/attention`` answer carries, over its views, layers and heads
(layers × heads × queries × keys, summed): one view of the paper's base model at 160 tokens a
side (6 × 8 × 160², 1.2 million) fits; every view of it (3.7 million, some 80 MB of JSON) does not,
and the request is refused (413) with the advice to ask for fewer ``views`` or a shorter text."""
