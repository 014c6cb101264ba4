"""``aiayn serve``: every family's checkpoints behind one HTTP service (FastAPI, uvicorn).

The family registry decides a checkpoint's endpoints (:data:`ENDPOINTS`: the commands it serves);
each loaded model has one worker thread that owns it and runs every batch
(:mod:`aiayn.serving.engine`, :mod:`aiayn.serving.decode`); requests reach it through a bounded
queue. Results are the library's, computed by the functions the CLI commands call. docs/serving.md
describes the endpoints, batching, limits, metrics and security.
"""

from aiayn.serving.app import ENDPOINTS, create_app
from aiayn.serving.models import ServedModel, load_served_model
from aiayn.serving.options import ServeOptions

__all__ = ["ENDPOINTS", "ServeOptions", "ServedModel", "create_app", "load_served_model"]
