"""``aiayn serve``: checkpoints behind an HTTP service (FastAPI on uvicorn); docs/serving.md."""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from aiayn.cli.commands import add_command, add_device_option
from aiayn.errors import UserError
from aiayn.validation import Bounds, flag, flag_type

API_KEY_ENV = "AIAYN_API_KEY"
"""The environment variable holding the bearer token when ``--api-key`` is not given."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def register(subparsers: Any) -> None:
    """Add the ``serve`` sub-command (each batching option checked by the rule of the
    :class:`~aiayn.serving.options.ServeOptions` field it sets)."""
    from aiayn.serving.options import ServeOptions as O

    p = add_command(
        subparsers,
        "serve",
        run,
        help="serve checkpoints over HTTP (translate, completions, embeddings, classify, ...)",
        description="Serve one or more checkpoints over HTTP: each checkpoint's family decides "
        "its endpoints (/v1/translate, /v1/completions, /v1/embeddings, /v1/classify, "
        "/v1/fill-mask), with /health, /v1/models, /metrics and /openapi.json. Requests from "
        "concurrent clients are batched. Stops on SIGTERM or Ctrl-C after answering the "
        "requests in flight. See docs/serving.md.",
    )
    p.add_argument(
        "--checkpoint", action="append", required=True, metavar="[NAME=]DIR",
        help="a checkpoint folder to serve, named NAME (default: the folder's name); repeat "
        "for more models",
    )  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    p.add_argument(
        "--port", type=flag_type(int, Bounds(ge=0, le=65535)), default=8000, help="port (8000)"
    )
    p.add_argument(
        "--api-key",
        help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}, else none)",
    )
    p.add_argument(
        "--cors-origin", action="append", default=[], metavar="ORIGIN",
        help="a browser origin allowed to call the service (CORS is off without it)",
    )  # fmt: skip
    d = O()  # the defaults, written once: ServeOptions'
    p.add_argument("--max-batch-tokens", type=flag(O, "max_batch_tokens"),
                   default=d.max_batch_tokens,
                   help=f"token budget of a batch ({d.max_batch_tokens})")  # fmt: skip
    p.add_argument("--max-wait-ms", type=flag(O, "max_wait_ms"), default=d.max_wait_ms,
                   help="how long an encoder batch waits for more requests "
                   f"({d.max_wait_ms:g} ms)")  # fmt: skip
    p.add_argument("--max-decode-groups", type=flag(O, "max_decode_groups"),
                   default=d.max_decode_groups,
                   help="decode groups running together per model "
                   f"({d.max_decode_groups})")  # fmt: skip
    p.add_argument("--decode-workers", type=flag(O, "decode_workers"), default=d.decode_workers,
                   help="worker threads decoding per translation or generation model "
                   f"({d.decode_workers})")  # fmt: skip
    p.add_argument("--queue-size", type=flag(O, "queue_size"), default=d.queue_size,
                   help=f"requests waiting per model before 503 ({d.queue_size})")  # fmt: skip
    p.add_argument("--timeout-s", type=flag(O, "timeout_s"), default=d.timeout_s,
                   help=f"seconds before a request is answered 504 ({d.timeout_s:g})")  # fmt: skip
    p.add_argument("--max-body-bytes", type=flag(O, "max_body_bytes"), default=d.max_body_bytes,
                   help=f"largest request body in bytes ({d.max_body_bytes:,})")  # fmt: skip
    p.add_argument("--no-batching", dest="batching", action="store_false",
                   help="one request at a time per model (a baseline)")  # fmt: skip
    _add_bounds(p, d)
    add_device_option(p)


def _add_bounds(p: Any, d: Any) -> None:
    """The flags bounding one request's work and the connections (ServeOptions' fields)."""
    from aiayn.serving.options import ServeOptions as O

    p.add_argument(
        "--max-beam",
        type=flag(O, "max_beam"),
        default=d.max_beam,
        help=f"largest beam of a translation request ({d.max_beam})",
    )
    p.add_argument(
        "--max-request-tokens",
        type=flag(O, "max_request_tokens"),
        default=d.max_request_tokens,
        help="most tokens one request may ask for: inputs plus output limits, times "
        f"beams or n ({d.max_request_tokens:,})",
    )
    p.add_argument(
        "--header-timeout-s",
        type=flag(O, "header_timeout_s"),
        default=d.header_timeout_s,
        help=f"seconds a connection has to send a request's headers ({d.header_timeout_s:g})",
    )
    p.add_argument(
        "--keep-alive-s",
        type=flag(O, "keep_alive_s"),
        default=d.keep_alive_s,
        help=f"seconds an idle connection stays open ({d.keep_alive_s})",
    )
    p.add_argument(
        "--max-connections",
        type=flag(O, "max_connections"),
        default=d.max_connections,
        help=f"connections open at once; 503 beyond ({d.max_connections})",
    )


def named_checkpoints(values: list[str]) -> list[tuple[str, Path]]:
    """(name, folder) of each ``--checkpoint [NAME=]DIR``; a bad or repeated name is a
    :class:`UserError` naming it."""
    out: list[tuple[str, Path]] = []
    for value in values:
        name, sep, folder = value.partition("=")
        if not sep:
            name, folder = Path(value).resolve().name, value
        if not _NAME.fullmatch(name):
            raise UserError(
                f"--checkpoint {value}: model name {name!r} must be 1-64 letters, digits, "
                "'.', '_' or '-', starting with a letter or digit"
            )
        if any(name == n for n, _ in out):
            raise UserError(f"--checkpoint {value}: a model named {name!r} is given twice")
        out.append((name, Path(folder)))
    return out


def _check_port(host: str, port: int) -> None:
    """Refuse (one line) an address that cannot be listened on, before loading anything."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as error:
        raise UserError(f"--host {host}: {error.strerror or error}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            raise UserError(f"cannot listen on {host}:{port} ({error.strerror})") from None


def run(args: argparse.Namespace) -> int:
    """Load the checkpoints and serve until SIGTERM or Ctrl-C."""
    import torch
    import uvicorn

    from aiayn.performance import keep_freed_memory
    from aiayn.serving import ServeOptions, create_app, load_served_model
    from aiayn.serving.connections import server_config
    from aiayn.serving.metrics import Metrics
    from aiayn.serving.options import intra_op_threads
    from aiayn.validation import resolve_device

    named = named_checkpoints(args.checkpoint)
    options = ServeOptions(
        max_batch_tokens=args.max_batch_tokens, max_wait_ms=args.max_wait_ms,
        max_decode_groups=args.max_decode_groups, decode_workers=args.decode_workers,
        queue_size=args.queue_size,
        timeout_s=args.timeout_s, max_body_bytes=args.max_body_bytes, batching=args.batching,
        max_beam=args.max_beam, max_request_tokens=args.max_request_tokens,
        header_timeout_s=args.header_timeout_s, keep_alive_s=args.keep_alive_s,
        max_connections=args.max_connections,
    )  # fmt: skip
    _check_port(args.host, args.port)
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    metrics = Metrics()
    if resolve_device(args.device).type == "cpu":
        keep_freed_memory()  # decoding reallocates its caches every step: keep them mapped
        torch.set_num_threads(intra_op_threads(torch.get_num_threads(), options))
    models = [load_served_model(n, d, options, metrics, device=args.device) for n, d in named]
    if resolve_device(args.device).type == "cpu":  # ready only with its kernels built
        from aiayn.kernels import prepare
        from aiayn.kernels.dispatch import report

        for line in (*prepare(), *report()):
            print(f"aiayn serve: {line}", file=sys.stderr, flush=True)
    app = create_app(models, options, metrics, api_key=api_key, cors_origins=args.cors_origin)
    config = server_config(app, options, host=args.host, port=args.port)
    # uvicorn handles SIGTERM while it serves (stop accepting, answer the requests in flight),
    # then raises it again under the handler it found: a no-op one, so the command exits 0
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        uvicorn.Server(config).run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0
