"""Train an open-label PaDeLLM model: one model asked for any label names at call time.

The rows are :mod:`training.open_data`'s mixture, each record asked for its own label names (a
dropout of its source's labels and a few negatives of other domains); the AR query names the
labels it asks for. Everything else is the ``lm`` trainer's: the same packed rows, loss, loop,
checkpoints and ``resume``. The rows are built once and kept in the run folder, so a resumed run
starts training at once; a snapshot of the trained weights is written every
``snapshot_minutes`` of training (:mod:`training.open_eval` scores them: quality against CPU time).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import random
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from general_decoding.kept_vocabulary import KeptVocabulary
from ner_service.engine import NERModelConfig
from ner_service.engine.ner_model import SELF_CONTAINED, resolve_ner_model
from training.configs import OpenTrainConfig
from training.examples import TrainingRow, build_row
from training.loop import LoopSettings, run_loop
from training.loss import answer_loss, inner_model
from training.open_data import MixtureSettings, trained_names, training_mixture
from training.precision import resolve_precision
from training.trainer import prepare_model, save_model

SNAPSHOTS = "snapshots"
RUN_CONFIG = "run_config.json"


def mixture_settings(config: OpenTrainConfig) -> MixtureSettings:
    return MixtureSettings(records=config.records if config.limit is None else min(config.records, config.limit),
                           temperature=config.temperature, supervised_shares=dict(config.supervised_shares),
                           keep_label_min=config.keep_label_min, absent_keep=config.absent_keep, negatives_max=config.negatives_max,
                           description_rate=config.description_rate, synonym_rate=config.synonym_rate,
                           variant_rate=config.variant_rate,
                           chinese_names_rate=config.chinese_names_rate, ar_rate=config.ar_rate,
                           cut_chars=config.max_text_chars if config.cut_long_records else None, held_out=tuple(config.held_out),
                           seed=config.seed)


def open_rows(config: OpenTrainConfig, tokenizer) -> list[TrainingRow]:
    """The run's training rows, built once and cached in its checkpoint folder (keyed by the settings
    that make them): a resumed run reads them back."""
    settings = mixture_settings(config)
    key = hashlib.sha256(json.dumps([asdict(settings), config.max_text_chars, config.train, tokenizer.name_or_path],
                                    sort_keys=True, default=str).encode()).hexdigest()[:16]
    cache = Path(config.output) / "checkpoint" / f"rows-{key}.pickle"
    if cache.is_file():
        return pickle.loads(cache.read_bytes())
    folder = Path(config.train)
    mixture = [e for e in training_mixture(folder, folder.parent, settings) if len(e.example.text) <= config.max_text_chars]
    rows = [build_row(e.example, e.labels, tokenizer, ("padellm", "ar") if e.ar else ("padellm",), past_count=config.past_count_queries,
                      listed_labels=True) for e in tqdm(mixture, desc="build rows", unit="text")]
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_suffix(".partial")
    partial.write_bytes(pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL))
    partial.replace(cache)
    return rows


def open_ner_config(config: OpenTrainConfig, tokenizer) -> NERModelConfig:
    """``ner_model.json`` of an open model: any labels at call time, ``config.labels`` by default, and
    the names it trained on, which its callers are told of (:func:`ner_service.engine.labels.unfamiliar_names`).
    A run over an open model's adapter keeps that model's count rule until it is chosen again."""
    return NERModelConfig(name=config.name, labels=list(config.labels or []), base=SELF_CONTAINED if config.full else config.base,
                          language=config.language, eos_token=tokenizer.eos_token, open_labels=True,
                          answers_past_count=config.past_count_queries, sentence_windows=config.sentence_windows,
                          window_tokens=config.window_tokens, trained_names=sorted(trained_names(config.train, config.held_out)),
                          **continued_count_rule(config.init_adapter))


def continued_count_rule(init_adapter: str | None) -> dict:
    """The count bias and count quantile of the open model whose adapter a run trains further (chosen
    on zero-shot texts: ``python -m training.open_eval --choose-quantile``), so that the run's
    snapshots and model count as the model they are compared with does; nothing otherwise."""
    if init_adapter is None:
        return {}
    chosen = NERModelConfig.read(resolve_ner_model(init_adapter))
    return {"count_bias": chosen.count_bias, "count_quantile": chosen.count_quantile} if chosen.open_labels else {}


def train_open(config: OpenTrainConfig) -> dict:
    """Train, save the model to ``config.output`` and return the run's summary; ``resume`` continues
    a stopped run exactly."""
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    output = Path(config.output)
    output.mkdir(parents=True, exist_ok=True)
    (output / RUN_CONFIG).write_text(json.dumps(asdict(config), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")  # for snapshots
    model, tokenizer, first_layer = prepare_model(config)
    rows = open_rows(config, tokenizer)
    ner_config = open_ner_config(config, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    vocabulary = KeptVocabulary.of((t for r in rows for t in r.input_ids), tokenizer) if config.kept_vocabulary else None
    settings = LoopSettings(lr=config.lr, batch_tokens=config.batch_tokens, seed=config.seed, checkpoint_folder=output / "checkpoint",
                            epochs=config.epochs, warmup_steps=config.warmup_steps, max_steps=config.max_steps,
                            max_minutes=config.max_minutes, checkpoint_minutes=config.checkpoint_minutes, resume=config.resume)
    precision = resolve_precision(config.dtype, config.device)

    def batch_loss(batch: list[int]) -> torch.Tensor:
        with precision.autocast(config.device):  # the layers below ``first_layer`` get no gradient and keep no activations
            return answer_loss(model, [rows[i] for i in batch], pad, None, 0, vocabulary)

    def snapshot(state: dict) -> None:
        minutes = state["seconds"] / 60
        if minutes // config.snapshot_minutes > state.get("snapshots", 0):
            state["snapshots"] = int(minutes // config.snapshot_minutes)
            save_snapshot(model, output / SNAPSHOTS, state)

    began = time.perf_counter()
    state = run_loop(model, [len(r) for r in rows], batch_loss, settings, None, 0.0, snapshot=snapshot)
    save_snapshot(model, output / SNAPSHOTS, state)
    if vocabulary is not None:
        output.mkdir(parents=True, exist_ok=True)
        vocabulary.save(output)
    summary = save_model(model, tokenizer, config, ner_config, state)
    summary["wall_seconds_last_session"] = round(time.perf_counter() - began, 1)
    return summary


def save_snapshot(model: torch.nn.Module, folder: Path, state: dict) -> Path:
    """The trained weights as they are now, named by training minutes (``snapshot-0090min.pt``)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"snapshot-{round(state['seconds'] / 60):04d}min.pt"
    trained = {name: p.detach().to(torch.bfloat16) for name, p in inner_model(model).named_parameters() if p.requires_grad}
    torch.save({"params": trained, "step": state["step"], "tokens": state["tokens"], "seconds": state["seconds"]}, path)
    return path
