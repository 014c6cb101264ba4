"""Training (§5): the eq. (3) schedule, the run config, the objectives and the trainer, which
runs a task: translation or a language model. (The label-smoothed loss is in
:mod:`aiayn.layers.loss`, checkpoints in :mod:`aiayn.checkpoint`.)"""

from aiayn.training.config import (
    DataConfig,
    LMDataConfig,
    RunConfig,
    TrainConfig,
    load_run_config,
)
from aiayn.training.schedule import transformer_lr

__all__ = [
    "DataConfig",
    "LMDataConfig",
    "RunConfig",
    "TrainConfig",
    "load_run_config",
    "transformer_lr",
]
