"""The optimisation loop the trainers share: batches under a token budget in an order each epoch's
seed decides, warm-up then a cosine schedule, a progress bar with ETA, a checkpoint every few
minutes and at each epoch's end, ``resume`` that continues a killed run exactly, and memory kept
under a ceiling (``training.allocator``).

A run with ``max_minutes`` ends its cosine when its minutes do, if that comes before its epochs
end: the schedule's last step is re-estimated after every step from the run's pace so far, so
that one recipe trains to a finished schedule on a fast CPU and on a slow one."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from training.allocator import MemoryCeiling
from training.batching import length_batches
from training.checkpoints import CheckpointClock, load_checkpoint, save_checkpoint
from training.loss import optimizer_step

log = logging.getLogger(__name__)

#: The loss of one batch, given the indices of its rows.
BatchLoss = Callable[[list[int]], torch.Tensor]
#: Dev scores of the model as it is now (called at each epoch's end and at the run's end).
Evaluation = Callable[[], dict]
#: Called with the run's state after each timed checkpoint: a trainer saves a loadable snapshot.
Snapshot = Callable[[dict], None]


@dataclass(frozen=True)
class LoopSettings:
    """How long and how fast a run optimises, and where it keeps its checkpoint."""

    lr: float
    batch_tokens: int
    seed: int
    checkpoint_folder: Path
    epochs: float = 1.0
    warmup_steps: int = 30
    max_steps: int | None = None
    max_minutes: float | None = None
    checkpoint_minutes: float = 10.0
    resume: bool = False


def warmup_cosine(warmup: int, last_step: Callable[[], int]) -> Callable[[int], float]:
    """The learning-rate factor of a step: linear warm-up, then cosine down to 0.1 at ``last_step()``
    (and 0.1 after it)."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, last_step() - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def last_step_in_time(planned: int, step: int, step_seconds: float, seconds: float, max_minutes: float | None) -> int:
    """The step a run ends at: ``planned``, or sooner the step at which ``max_minutes`` of
    ``seconds`` (setup included) run out at the pace of its ``step`` steps so far (``step_seconds``)."""
    if max_minutes is None or step_seconds <= 0:
        return planned
    pace = step_seconds / step
    return max(step, min(planned, step + int((60 * max_minutes - seconds) / pace)))


def run_loop(model: torch.nn.Module, lengths: Sequence[int], batch_loss: BatchLoss, settings: LoopSettings,
             evaluate: Evaluation | None = None, setup_seconds: float = 0.0, description: str = "train",
             snapshot: Snapshot | None = None) -> dict:
    """Optimise the trainable parameters of ``model`` over rows of ``lengths`` and return the run's
    state: ``step``, ``tokens``, ``seconds`` (of training, ``setup_seconds`` included) and ``history``
    (the dev scores after each epoch). With ``settings.resume`` it starts from the last checkpoint;
    ``snapshot`` runs after every checkpoint written on the clock (the points of a curve)."""
    steps_per_epoch = len(length_batches(list(lengths), settings.batch_tokens, settings.seed))
    total_steps = settings.max_steps or max(1, math.ceil(steps_per_epoch * settings.epochs))
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.lr, weight_decay=0.0)
    state = {"step": 0, "tokens": 0, "seconds": 0.0, "step_seconds": 0.0, "evaluated_at": 0, "history": []}

    def last_step() -> int:
        return last_step_in_time(total_steps, state["step"], state["step_seconds"], state["seconds"], settings.max_minutes)

    warmup = min(settings.warmup_steps, max(1, total_steps // 10))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(warmup, last_step))
    folder = settings.checkpoint_folder
    if settings.resume:
        state.update(load_checkpoint(folder, model, optimizer, scheduler) or {})
        log.info("resuming at step %d", state["step"])
    state["seconds"] += setup_seconds
    clock = CheckpointClock(settings.checkpoint_minutes)
    ceiling = MemoryCeiling.of_machine()
    bar = tqdm(total=total_steps, initial=state["step"], desc=description, unit="step")
    timed_tokens, timed_seconds = 0, 0.0  # this process's steps alone: the bar's throughput

    def finished() -> bool:
        out_of_time = settings.max_minutes is not None and state["seconds"] >= 60 * settings.max_minutes
        return state["step"] >= total_steps or out_of_time

    def evaluate_if_due() -> None:
        """Score dev at the end of each epoch and of the run (once per step reached)."""
        epoch_ended = state["step"] // steps_per_epoch > state["evaluated_at"] // steps_per_epoch
        if evaluate is not None and state["step"] != state["evaluated_at"] and (epoch_ended or finished()):
            scores = evaluate()
            state["history"].append({"epoch": round(state["step"] / steps_per_epoch, 2), "step": state["step"],
                                     "train_seconds": round(state["seconds"], 1), **scores})
            tqdm.write(f"epoch {state['history'][-1]['epoch']} dev: {json.dumps(scores)}")
            state["evaluated_at"] = state["step"]

    while not finished():
        epoch = state["step"] // steps_per_epoch
        for batch in length_batches(list(lengths), settings.batch_tokens, settings.seed + epoch)[state["step"] - epoch * steps_per_epoch:]:
            began = time.perf_counter()
            loss = batch_loss(batch)
            optimizer_step(loss, trainable, optimizer, scheduler)
            tokens, seconds = sum(lengths[i] for i in batch), time.perf_counter() - began
            state["step"] += 1
            state["tokens"] += tokens
            state["seconds"] += seconds
            state["step_seconds"] += seconds
            ceiling.check()
            timed_tokens += tokens
            timed_seconds += seconds
            bar.total = last_step()
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.4f}", tok_s=f"{timed_tokens / timed_seconds:.0f}")
            if clock.due():
                save_checkpoint(folder, model, optimizer, scheduler, state)
                if snapshot is not None:
                    snapshot(state)
                clock.reset()
            if finished():
                break
        evaluate_if_due()
        save_checkpoint(folder, model, optimizer, scheduler, state)
        clock.reset()
    evaluate_if_due()
    bar.close()
    return state
