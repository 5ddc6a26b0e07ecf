"""Lexical-unit fine-tuning (LUD; Sun et al. 2024) of a trained NER model.

1. *Find the units*: the model reads its own training targets (PaDeLLM and AR answers,
   teacher-forced); a lexical unit is a run of answer tokens after whose first token every
   token is predicted with probability >= ``threshold`` (at most ``unit_size`` tokens).
2. *Fine-tune* a LoRA adapter on top of the model so that, fed ``unit_size - 1`` placeholder
   tokens after the token that precedes a unit, the placeholders predict the unit's second,
   third... tokens (the unit's first token is the ordinary next-token prediction). Each
   unit's placeholders are a branch of the packed training row under a tree mask, so the
   text and the answers are encoded once; the ordinary answer loss is kept alongside.

The result is an NER model folder whose base is the fine-tuned model (``ner_model.json``
``base`` = its name) and whose ``lud_placeholder`` names the placeholder token, for
:class:`general_decoding.lexical_units.LexicalUnitDecoder` (``--decoder lud``).
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from general_decoding.tree_attention import collate_parent_trees, parents_of
from ner_service.engine.ner_model import NERModel
from corpora import labels_of, read_corpus
from training.configs import LUDConfig
from training.examples import IGNORE, TrainingRow, build_row
from training.batching import length_batches
from training.loss import optimizer_step, packed_loss


@dataclass(frozen=True)
class LUDRow:
    """A training row as a general tree: tokens, each token's parent, and targets."""

    input_ids: list[int]
    parents: list[int]
    targets: list[int]
    units: int


def find_units(confidences: list[float], unit_size: int, threshold: float) -> list[tuple[int, int]]:
    """``(start, length)`` of the units of length >= 2 over one answer's targets, left to right;
    ``confidences[i]`` is the model's probability of target ``i``."""
    units, start = [], 0
    while start < len(confidences):
        length = 1
        while length < unit_size and start + length < len(confidences) and confidences[start + length] >= threshold:
            length += 1
        if length >= 2:
            units.append((start, length))
        start += length
    return units


def answer_runs(row: TrainingRow) -> list[list[int]]:
    """Columns of each answer in ``row`` (consecutive columns with a target, per branch)."""
    runs: list[list[int]] = []
    branch_of = row.tree.branch_of
    for column, target in enumerate(row.targets):
        if target == IGNORE:
            continue
        if runs and runs[-1][-1] == column - 1 and branch_of[column] == branch_of[runs[-1][-1]]:
            runs[-1].append(column)
        else:
            runs.append([column])
    return runs


def lud_row(row: TrainingRow, confidences: list[float], placeholder_id: int, unit_size: int, threshold: float) -> LUDRow:
    """``row`` plus, per unit, a branch of placeholders after the unit's anchor column."""
    ids, parents, targets = list(row.tree.input_ids), parents_of(row.tree), list(row.targets)
    units = 0
    for columns in answer_runs(row):
        for start, length in find_units([confidences[c] for c in columns], unit_size, threshold):
            parent = columns[start]  # its target is the unit's first token
            for offset in range(1, length):
                ids.append(placeholder_id)
                parents.append(parent)
                targets.append(row.targets[columns[start + offset]])
                parent = len(ids) - 1
            units += 1
    return LUDRow(ids, parents, targets, units)


def target_confidences(model: torch.nn.Module, rows: list[TrainingRow], pad_token_id: int) -> list[list[float]]:
    """Per row and column, the model's probability of that column's target (0 where none)."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    out = []
    with torch.inference_mode():
        for row in rows:
            ids, positions, mask = collate_parent_trees([(row.tree.input_ids, parents_of(row.tree))], pad_token_id, dtype)
            hidden = model.get_decoder()(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device)).last_hidden_state[0]
            columns = [c for c, t in enumerate(row.targets) if t != IGNORE]
            targets = torch.tensor([row.targets[c] for c in columns], device=device)
            logits = model.get_output_embeddings()(hidden[columns]).float()
            probs = torch.softmax(logits, dim=-1).gather(-1, targets[:, None])[:, 0].tolist()
            confidence = [0.0] * len(row.targets)
            for column, probability in zip(columns, probs):
                confidence[column] = probability
            out.append(confidence)
    return out


def lud_loss(model: torch.nn.Module, rows: list[LUDRow], pad_token_id: int) -> torch.Tensor:
    """Mean cross-entropy over answer and placeholder targets."""
    dtype = next(model.parameters()).dtype
    ids, positions, mask = collate_parent_trees([(r.input_ids, r.parents) for r in rows], pad_token_id, dtype)
    return packed_loss(model, ids, positions, mask, [r.targets for r in rows])


def train_lud(config: LUDConfig) -> dict:
    """Find units, fine-tune the LoRA adapter, and save the LUD model folder."""
    from peft import LoraConfig, get_peft_model

    random.seed(config.seed)
    torch.manual_seed(config.seed)
    ner = NERModel.load(config.model, device=config.device)
    tokenizer = ner.tokenizer
    placeholder_id = tokenizer.convert_tokens_to_ids(config.placeholder)
    if placeholder_id is None or placeholder_id == tokenizer.unk_token_id or tokenizer.convert_ids_to_tokens(placeholder_id) != config.placeholder:
        raise ValueError(f"placeholder {config.placeholder!r} is not one token of this model's vocabulary")
    examples = read_corpus(config.train)[: config.limit]
    labels = ner.config.labels or labels_of(examples)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else ner.eos_token_id
    names = ner.config.label_names
    rows = [build_row(e, labels, tokenizer, config.formats, names) for e in tqdm(examples, desc="build rows", unit="text")]
    confidences = [target_confidences(ner.model, [r], pad)[0] for r in tqdm(rows, desc="find units", unit="text")]
    lud_rows = [lud_row(r, c, placeholder_id, config.unit_size, config.threshold) for r, c in zip(rows, confidences)]
    units = sum(r.units for r in lud_rows)
    unit_tokens = sum(len(r.input_ids) - len(r0.tree) for r, r0 in zip(lud_rows, rows))

    model = get_peft_model(ner.model, LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, target_modules="all-linear", task_type="CAUSAL_LM"))
    model.train()
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=config.lr, weight_decay=0.0)
    lengths = [len(r.input_ids) for r in lud_rows]
    steps_per_epoch = len(length_batches(lengths, config.batch_tokens, config.seed))
    total = config.max_steps or steps_per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, total) / total))))
    state = {"step": 0, "tokens": 0, "seconds": 0.0}
    bar = tqdm(total=total, desc="train-lud", unit="step")
    epoch = 0
    while state["step"] < total and (config.max_minutes is None or state["seconds"] < 60 * config.max_minutes):
        for batch in length_batches(lengths, config.batch_tokens, config.seed + epoch):
            began = time.perf_counter()
            loss = lud_loss(model, [lud_rows[i] for i in batch], pad)
            optimizer_step(loss, parameters, optimizer, scheduler)
            state["step"] += 1
            state["tokens"] += sum(lengths[i] for i in batch)
            state["seconds"] += time.perf_counter() - began
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.4f}", tok_s=f"{state['tokens'] / state['seconds']:.0f}")
            if state["step"] >= total or (config.max_minutes is not None and state["seconds"] >= 60 * config.max_minutes):
                break
        epoch += 1
    bar.close()

    output = Path(config.output)
    for parameter in parameters:
        parameter.data = parameter.data.to(torch.float16)
    model.save_pretrained(output)
    ner_config = ner.config
    ner_config.name, ner_config.base, ner_config.metrics = config.name, config.model, {}
    ner_config.lud_placeholder, ner_config.lud_unit_size = config.placeholder, config.unit_size
    ner_config.write(output)
    summary = {"config": asdict(config), "units": units, "placeholder_tokens": unit_tokens, "rows": len(lud_rows),
               "steps": state["step"], "tokens": state["tokens"], "train_seconds": state["seconds"],
               "tokens_per_second": state["tokens"] / max(state["seconds"], 1e-9)}
    (output / "training.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary
