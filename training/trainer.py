"""Fine-tune a causal LM for PaDeLLM-NER (LoRA through ``peft``, or full fine-tuning).

Each text is one packed row (its prefix once, every query as a branch), batched by a
token budget. Progress bar, dev evaluation per epoch, checkpoints with resume, seed.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from general_decoding.tree_attention import collate_trees
from ner_service.engine import NEREngine, NERModel, NERModelConfig
from ner_service.engine.ner_model import SELF_CONTAINED, load_base
from corpora import Example, labels_of, read_corpus
from training.evaluate import evaluate_engine
from training.examples import FORMATS, IGNORE, QUERY_KINDS, TrainingRow, build_row

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class TrainConfig:
    """Everything a training run needs; saved next to the result for the model card."""

    base: str
    train: str
    output: str
    name: str = "padellm-ner"
    dev: str | None = None
    labels: list[str] | None = None
    label_names: dict[str, str] = field(default_factory=dict)
    language: str = "en"
    formats: list[str] = field(default_factory=lambda: list(FORMATS))
    full: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lr: float = 8e-4
    warmup_steps: int = 30
    epochs: float = 1.0
    max_steps: int | None = None
    max_minutes: float | None = None
    batch_tokens: int = 2048
    limit: int | None = None
    eval_limit: int | None = 200
    eval_batch_size: int = 16
    save_every: int = 100
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    resume: bool = False
    #: Weight of each query kind's answer tokens in the loss (count, mention, ar; missing: 1).
    loss_weights: dict[str, float] = field(default_factory=dict)
    #: Texts with a label of at least ``hard_count_min`` mentions are seen this many times an epoch.
    hard_count_repeat: int = 1
    hard_count_min: int = 3


def oversample_hard_counts(examples: list[Example], labels: list[str], minimum: int, repeat: int) -> list[Example]:
    """``examples`` with each text that holds at least ``minimum`` mentions of a label repeated
    ``repeat`` times (under-counting long lists is PaDeLLM's main error)."""
    if repeat <= 1:
        return examples
    return [e for e in examples for _ in range(repeat if any(len(e.mentions(label)) >= minimum for label in labels) else 1)]


def length_batches(lengths: list[int], batch_tokens: int, seed: int) -> list[list[int]]:
    """Indices of rows (of the given lengths) grouped by similar length under a padded-token
    budget, in seeded order."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        if current and lengths[index] * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    random.Random(seed).shuffle(batches)
    return batches


def _inner(model: torch.nn.Module) -> PreTrainedModel:
    """The plain transformers model (LoRA layers, if any, are injected into it)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[return-value]


def packed_loss(model: torch.nn.Module, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                targets: list[list[int]], weights: list[list[float] | None] | None = None) -> torch.Tensor:
    """Mean cross-entropy of collated packed rows at their targets (``IGNORE`` elsewhere),
    weighted per target when ``weights`` are given; the LM head runs on the target positions only."""
    lm = _inner(model)
    padded = torch.full(ids.shape, IGNORE, dtype=torch.long)
    for i, row in enumerate(targets):
        padded[i, : len(row)] = torch.tensor(row)
    device = lm.device
    hidden = lm.get_decoder()(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device)).last_hidden_state
    selected = padded.to(device) != IGNORE
    logits = lm.get_output_embeddings()(hidden[selected]).float()
    if weights is None or all(w is None for w in weights):
        return torch.nn.functional.cross_entropy(logits, padded.to(device)[selected])
    scale = torch.zeros(ids.shape)
    for i, (row, row_weights) in enumerate(zip(targets, weights)):
        scale[i, : len(row)] = torch.tensor(row_weights) if row_weights is not None else (torch.tensor(row) != IGNORE).float()
    scale = scale.to(device)[selected]
    losses = torch.nn.functional.cross_entropy(logits, padded.to(device)[selected], reduction="none")
    return (losses * scale).sum() / scale.sum().clamp(min=1e-9)


def answer_loss(model: torch.nn.Module, rows: list[TrainingRow], pad_token_id: int) -> torch.Tensor:
    """Cross-entropy on answer tokens of packed PaDeLLM/AR rows (weighted by the rows' weights)."""
    ids, positions, mask = collate_trees([r.tree for r in rows], pad_token_id, dtype=next(_inner(model).parameters()).dtype)
    return packed_loss(model, ids, positions, mask, [r.targets for r in rows], [r.weights for r in rows])


def optimizer_step(loss: torch.Tensor, parameters: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LRScheduler | None = None) -> None:
    """Backward, clip the gradient norm to 1, step (and the schedule), clear the gradients."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def _prepare_model(config: TrainConfig) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    model, tokenizer = load_base(config.base, dtype=DTYPES[config.dtype], device=config.device)
    if config.full:
        model.requires_grad_(True)
    else:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout, target_modules="all-linear", task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
    model.train()
    return model, tokenizer


def _trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}


def _save_checkpoint(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler, state: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / "checkpoint.pt.partial"
    torch.save({"params": _trainable_state(model), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "state": state}, partial)
    partial.replace(folder / "checkpoint.pt")


def _ner_config(config: TrainConfig, labels: list[str], tokenizer: PreTrainedTokenizerBase) -> NERModelConfig:
    return NERModelConfig(
        name=config.name, labels=labels, base=SELF_CONTAINED if config.full else config.base, language=config.language,
        eos_token=tokenizer.eos_token, label_names=dict(config.label_names),
    )


def evaluate_during_training(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, config: TrainConfig, labels: list[str], dev: list[Example]) -> dict:
    """Dev scores of the model as it is now (both decoders when both formats are trained)."""
    lm = _inner(model)
    lm.eval()
    engine = NEREngine(NERModel(lm, tokenizer, _ner_config(config, labels, tokenizer), Path(config.output)))
    scores = {
        decoder: evaluate_engine(engine, dev, strategy=decoder, batch_size=config.eval_batch_size, progress=False)
        for decoder in ("padellm", "ar")
        if decoder in config.formats
    }
    lm.train()
    return {d: {"micro_f1": s["micro_f1"], "precision": s["precision"], "recall": s["recall"], "n_sentences": s["n_sentences"]} for d, s in scores.items()}


def train(config: TrainConfig) -> dict:
    """Train, evaluate and save the model to ``config.output``; return the final metrics."""
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    output = Path(config.output)
    train_examples = read_corpus(config.train)[: config.limit]
    dev_examples = read_corpus(config.dev)[: config.eval_limit] if config.dev else []
    labels = config.labels or labels_of(train_examples)
    model, tokenizer = _prepare_model(config)
    unknown = set(config.loss_weights) - set(QUERY_KINDS)
    if unknown:
        raise ValueError(f"loss_weights names unknown query kinds {sorted(unknown)}; the kinds: {', '.join(QUERY_KINDS)}")
    train_examples = oversample_hard_counts(train_examples, labels, config.hard_count_min, config.hard_count_repeat)
    rows = [build_row(e, labels, tokenizer, config.formats, config.label_names, config.loss_weights or None)
            for e in tqdm(train_examples, desc="build rows", unit="text")]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    lengths = [len(r.tree) for r in rows]
    steps_per_epoch = len(length_batches(lengths, config.batch_tokens, config.seed))
    total_steps = config.max_steps or max(1, math.ceil(steps_per_epoch * config.epochs))
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=0.0)
    warmup = min(config.warmup_steps, max(1, total_steps // 10))

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total_steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    state = {"step": 0, "tokens": 0, "seconds": 0.0, "history": []}
    checkpoint = output / "checkpoint" / "checkpoint.pt"
    if config.resume and checkpoint.is_file():
        saved = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(saved["params"], strict=False)
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        state = saved["state"]
        log.info("resumed from step %d", state["step"])
    bar = tqdm(total=total_steps, initial=state["step"], desc="train", unit="step")
    epoch = state["step"] // steps_per_epoch

    def finished() -> bool:
        out_of_time = config.max_minutes is not None and state["seconds"] >= 60 * config.max_minutes
        return state["step"] >= total_steps or out_of_time

    while not finished():
        batches = length_batches(lengths, config.batch_tokens, config.seed + epoch)
        for batch in batches[state["step"] - epoch * steps_per_epoch:]:
            began = time.perf_counter()
            loss = answer_loss(model, [rows[i] for i in batch], pad)
            optimizer_step(loss, trainable, optimizer, scheduler)
            state["step"] += 1
            state["tokens"] += sum(len(rows[i].tree) for i in batch)
            state["seconds"] += time.perf_counter() - began
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.4f}", tok_s=f"{state['tokens'] / state['seconds']:.0f}")
            if state["step"] % config.save_every == 0:
                _save_checkpoint(output / "checkpoint", model, optimizer, scheduler, state)
            if finished():
                break
        epoch += 1
        if dev_examples:
            scores = evaluate_during_training(model, tokenizer, config, labels, dev_examples)
            state["history"].append({"epoch": epoch, "step": state["step"], **scores})
            log.info("epoch %d dev: %s", epoch, json.dumps(scores))
            tqdm.write(f"epoch {epoch} dev: {json.dumps(scores)}")
        _save_checkpoint(output / "checkpoint", model, optimizer, scheduler, state)
    bar.close()
    return save_model(model, tokenizer, config, labels, state)


def save_model(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, config: TrainConfig, labels: list[str], state: dict) -> dict:
    """Write the adapter (fp16) or the full model, ``ner_model.json`` and ``training.json``."""
    output = Path(config.output)
    output.mkdir(parents=True, exist_ok=True)
    if config.full:
        _inner(model).save_pretrained(output)
        tokenizer.save_pretrained(output)
    else:
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.data = parameter.data.to(torch.float16)
        model.save_pretrained(output)
    ner_config = _ner_config(config, labels, tokenizer)
    ner_config.metrics = {"dev_during_training": state["history"][-1] if state["history"] else None}
    ner_config.write(output)
    summary = {"config": asdict(config), "steps": state["step"], "tokens": state["tokens"], "train_seconds": round(state["seconds"], 1),
               "tokens_per_second": round(state["tokens"] / max(state["seconds"], 1e-9), 1), "history": state["history"]}
    (output / "training.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary
