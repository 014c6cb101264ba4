"""Training (§5): label-smoothed loss, the eq. (3) schedule, checkpoints and the trainer, which
runs a task: translation or a language model."""

from aiayn.training.config import (
    DataConfig,
    LMDataConfig,
    RunConfig,
    TrainConfig,
    load_run_config,
)
from aiayn.training.loss import LossSums, label_smoothed_nll
from aiayn.training.schedule import transformer_lr

__all__ = [
    "DataConfig",
    "LMDataConfig",
    "LossSums",
    "RunConfig",
    "TrainConfig",
    "label_smoothed_nll",
    "load_run_config",
    "transformer_lr",
]
