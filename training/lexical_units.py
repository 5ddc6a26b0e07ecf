"""Lexical-unit fine-tuning (LUD; Sun et al. 2024) of a trained NER model, on the CPU.

Every answer token of the model's training rows (PaDeLLM and AR answers) is an anchor: a branch
of up to ``unit_size - 1`` placeholder tokens after it learns to predict the answer's tokens that
follow the anchor's own next token. Placeholders trained after every anchor, not only where the
model is sure of what follows, also learn where an answer is uncertain (after a separator, at a
mention's first word), so that the decoder's threshold accepts the units that are predictable.

A LoRA adapter on the top layers learns this and applies at placeholder columns only
(:func:`general_decoding.lexical_units.restrict_adapter_to_placeholders`): every other column
computes exactly what the NER model computes, so the loss is taken on placeholder targets only,
and decoding's greedy token of each forward stays the NER model's. The frozen layers below run
once per row (:class:`training.top_layers.FrozenHidden`); the loop checkpoints and resumes
(:mod:`training.loop`), writing a loadable snapshot at every timed checkpoint
(``snapshots/minute-N``, the points of the model's curve).

The result is an NER model folder stacked on the model it was trained from (``ner_model.json``
``base``) whose ``lud_placeholder`` names the placeholder token, for
:mod:`general_decoding.lexical_units` (``--decoder lud``).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from corpora import labels_of, read_corpus
from general_decoding.lexical_units import restrict_adapter_to_placeholders
from general_decoding.tree_attention import collate_parent_trees
from ner_service.engine.ner_model import NERModel
from training.configs import LUDConfig
from training.examples import IGNORE, TrainingRow, build_row
from training.loop import LoopSettings, run_loop
from training.loss import packed_loss
from training.top_layers import LINEAR_MODULES, FrozenHidden, trained_layer_indices
from training.precision import resolve_precision
from training.trainer import save_adapter


@dataclass(frozen=True)
class LUDRow:
    """A training row as a general tree: tokens, each token's parent, and the placeholders' targets
    (``IGNORE`` at every other token)."""

    input_ids: list[int]
    parents: list[int]
    targets: list[int]

    @property
    def placeholders(self) -> int:
        return sum(t != IGNORE for t in self.targets)


def answer_runs(row: TrainingRow) -> list[list[int]]:
    """Columns of each answer in ``row`` (columns with a target, each the child of the one before)."""
    runs: list[list[int]] = []
    for column, target in enumerate(row.targets):
        if target == IGNORE:
            continue
        if runs and row.parents[column] == runs[-1][-1]:
            runs[-1].append(column)
        else:
            runs.append([column])
    return runs


def lud_row(row: TrainingRow, placeholder_id: int, unit_size: int) -> LUDRow:
    """``row`` plus, after every answer column (the anchor, whose target is the answer's next
    token), a branch of placeholders whose targets are the answer's following tokens."""
    ids, parents, targets = list(row.input_ids), list(row.parents), [IGNORE] * len(row)
    for columns in answer_runs(row):
        answer = [row.targets[c] for c in columns]
        for index, anchor in enumerate(columns):
            parent = anchor
            for ahead in range(1, min(unit_size, len(answer) - index)):
                ids.append(placeholder_id)
                parents.append(parent)
                targets.append(answer[index + ahead])
                parent = len(ids) - 1
    return LUDRow(ids, parents, targets)


def train_lud(config: LUDConfig) -> dict:
    """Fine-tune the placeholder adapter and save the LUD model folder; ``config.resume``
    continues a stopped run from its last checkpoint."""
    from peft import LoraConfig, get_peft_model

    random.seed(config.seed)
    torch.manual_seed(config.seed)
    precision = resolve_precision(config.dtype, config.device)
    ner = NERModel.load(config.model, dtype=precision.weights, device=config.device)
    tokenizer = ner.tokenizer
    placeholder_id = tokenizer.convert_tokens_to_ids(config.placeholder)
    if placeholder_id is None or placeholder_id == tokenizer.unk_token_id or tokenizer.convert_ids_to_tokens(placeholder_id) != config.placeholder:
        raise ValueError(f"placeholder {config.placeholder!r} is not one token of this model's vocabulary")
    examples = read_corpus(config.train)[: config.limit]
    labels = ner.config.labels or labels_of(examples)
    rows = [lud_row(build_row(e, labels, tokenizer, config.formats, ner.config.label_names), placeholder_id, config.unit_size)
            for e in tqdm(examples, desc="build rows", unit="text")]

    trained = trained_layer_indices(ner.model, config.top_layers)
    lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, target_modules=list(LINEAR_MODULES),
                      layers_to_transform=trained, task_type="CAUSAL_LM")
    model = get_peft_model(ner.model, lora)
    columns = restrict_adapter_to_placeholders(model.get_base_model(), placeholder_id)
    model.train()
    pad = ner.pad_token_id
    output = Path(config.output)
    settings = LoopSettings(lr=config.lr, batch_tokens=config.batch_tokens, seed=config.seed, checkpoint_folder=output / "checkpoint",
                            epochs=config.epochs, warmup_steps=config.warmup_steps, max_steps=config.max_steps,
                            max_minutes=config.max_minutes, checkpoint_minutes=config.checkpoint_minutes, resume=config.resume)
    trees = [(r.input_ids, r.parents) for r in rows]
    frozen, setup_seconds, first_layer = None, 0.0, trained[0]
    if first_layer > 0:
        began = time.perf_counter()
        with precision.autocast(config.device):
            frozen = FrozenHidden.build(model.get_base_model(), trees, first_layer, settings.checkpoint_folder / "frozen", pad, config.batch_tokens)
        setup_seconds = time.perf_counter() - began
    dtype = next(model.parameters()).dtype

    def batch_loss(batch: list[int]) -> torch.Tensor:
        ids, positions, mask = collate_parent_trees([trees[i] for i in batch], pad, dtype)
        columns.see(ids)
        hidden = frozen.padded(batch) if frozen is not None else None
        with precision.autocast(config.device):
            return packed_loss(model, ids, positions, mask, [rows[i].targets for i in batch], frozen_hidden=hidden, first_layer=first_layer)

    def save(folder: Path) -> None:
        save_adapter(model, config.model, folder)
        replace(ner.config, name=config.name, base=config.model, metrics={}, lud_placeholder=config.placeholder,
                lud_unit_size=config.unit_size).write(folder)

    def snapshot(state: dict) -> None:
        save(output / "snapshots" / f"minute-{round(state['seconds'] / 60)}")

    state = run_loop(model, [len(r.input_ids) for r in rows], batch_loss, settings, setup_seconds=setup_seconds, description="train-lud",
                     snapshot=snapshot)
    save(output)
    summary = {"config": asdict(config), "rows": len(rows), "placeholder_targets": sum(r.placeholders for r in rows),
               "steps": state["step"], "tokens": state["tokens"], "train_seconds": round(state["seconds"], 1),
               "tokens_per_second": round(state["tokens"] / max(state["seconds"], 1e-9), 1)}
    (output / "training.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary
