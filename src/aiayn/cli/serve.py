"""``aiayn serve``: checkpoints behind an HTTP service (FastAPI on uvicorn); docs/serving.md."""

from __future__ import annotations

import argparse
import dataclasses
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
        "--checkpoint",
        action="append",
        required=True,
        metavar="[NAME=]DIR",
        help="a checkpoint folder to serve, named NAME (default: the folder's name); repeat "
        "for more models",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    p.add_argument(
        "--port", type=flag_type(int, Bounds(ge=0, le=65535)), default=8000, help="port (8000)"
    )
    p.add_argument(
        "--api-key",
        help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}, else none)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin allowed to call the service (CORS is off without it)",
    )
    _add_options(p)
    add_device_option(p)


def _add_options(p: Any) -> None:
    """One flag per :class:`~aiayn.serving.options.ServeOptions` field, made from the field:
    its name (``--max-batch-tokens``; ``--no-batching`` for the switch), its rules, its default
    and its help (:data:`~aiayn.serving.options.FLAG_HELP`)."""
    from aiayn.serving.options import ServeOptions as O

    defaults = O()
    for f in dataclasses.fields(O):
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            p.add_argument(
                f"--no-{f.name.replace('_', '-')}",
                dest=f.name,
                action="store_false",
                help=O.flag_help(f.name),
            )
            continue
        shown = f"{default:,}" if isinstance(default, int) else f"{default:g}"
        p.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=flag(O, f.name),
            default=default,
            help=f"{O.flag_help(f.name)} ({shown})",
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
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(ServeOptions)}
    )
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
