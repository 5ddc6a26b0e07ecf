"""The optimisation loop the trainers share: batches under a token budget in an order each epoch's
seed decides, warm-up then a cosine schedule, a progress bar with ETA, a checkpoint every few
minutes and at each epoch's end, and ``resume`` that continues a killed run exactly."""

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


def warmup_cosine(warmup: int, total: int) -> Callable[[int], float]:
    """The learning-rate factor of a step: linear warm-up, then cosine down to 0.1."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))

    return factor


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
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(min(settings.warmup_steps, max(1, total_steps // 10)), total_steps))
    folder = settings.checkpoint_folder
    state = {"step": 0, "tokens": 0, "seconds": 0.0, "evaluated_at": 0, "history": []}
    if settings.resume:
        state = load_checkpoint(folder, model, optimizer, scheduler) or state
        log.info("resuming at step %d", state["step"])
    state["seconds"] += setup_seconds
    clock = CheckpointClock(settings.checkpoint_minutes)
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
            timed_tokens += tokens
            timed_seconds += seconds
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
