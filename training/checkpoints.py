"""A training run's checkpoint: everything needed to continue it exactly after a stop.

The trained parameters, the optimizer and schedule, the run's counters and the random number
generators' states are written to ``checkpoint.pt`` in one atomic rename, so a process killed at
any moment leaves the previous checkpoint whole. :class:`CheckpointClock` says when the next one
is due.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

FILE = "checkpoint.pt"


def save_checkpoint(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler | None, state: dict) -> None:
    """Write the checkpoint of a run (its trainable parameters only) to ``folder``; a run whose
    learning rate follows its own clock has no ``scheduler`` and keeps that clock in ``state``."""
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f"{FILE}.partial"
    trainable = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    torch.save({"params": trainable, "optimizer": optimizer.state_dict(), "scheduler": None if scheduler is None else scheduler.state_dict(), "state": state,
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate()}}, partial)
    partial.replace(folder / FILE)


def load_checkpoint(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler | None) -> dict | None:
    """Restore a run from ``folder``'s checkpoint and return its state (None when there is none)."""
    path = folder / FILE
    if not path.is_file():
        return None
    saved = torch.load(path, weights_only=False)
    missing = set(saved["params"]) - {name for name, _ in model.named_parameters()}
    if missing:
        raise ValueError(f"{path} was written by another kind of run: it holds parameters this model lacks ({sorted(missing)[:3]}...)")
    model.load_state_dict(saved["params"], strict=False)
    optimizer.load_state_dict(saved["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(saved["scheduler"])
    torch.set_rng_state(saved["rng"]["torch"])
    random.setstate(saved["rng"]["python"])
    return saved["state"]


@dataclass
class CheckpointClock:
    """Due every ``minutes`` of wall time since the last checkpoint."""

    minutes: float
    last: float = field(default_factory=time.monotonic)

    def due(self) -> bool:
        return time.monotonic() - self.last >= 60 * self.minutes

    def reset(self) -> None:
        self.last = time.monotonic()
