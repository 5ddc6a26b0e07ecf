"""Fine-tune a causal LM for PaDeLLM-NER (LoRA through ``peft``, or full fine-tuning).

Each text is one packed row (its prefix once, every query as a branch), batched by a token
budget. With ``top_layers``, only the top layers train and the frozen ones below run once per
row (:mod:`training.top_layers`). Progress bar with ETA, dev evaluation per epoch, a checkpoint
every few minutes, and ``resume`` that continues a killed run exactly.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from general_decoding.kept_vocabulary import KeptVocabulary
from training.allocator import current_allocator
from training.batching import length_batches
from training.loop import LoopSettings, run_loop
from training.model_merge import add_model_changes
from training.loss import answer_loss, inner_model
from training.run_budget import PROBE_TEXTS, SMALL_DEV_TEXTS, DevPlan, plan_dev
from training.precision import resolve_precision
from training.top_layers import LINEAR_MODULES, FrozenHidden, trained_layer_indices
from ner_service.engine import NEREngine, NERModel, NERModelConfig, prompts
from ner_service.engine.engine import MAX_WINDOW_TOKENS
from ner_service.engine.chunking import mostly_single_sentences
from ner_service.engine.model_loading import ModelNotFoundError
from ner_service.engine.ner_model import SELF_CONTAINED, load_base, resolve_ner_model
from corpora import Example, check_labels, read_corpus
from training.evaluate import dev_scores
from training.configs import QUERY_KINDS, TrainConfig
from training.count_calibration import calibrate_model
from training.document_windows import document_windows
from training.examples import build_row

def oversample_hard_counts(examples: list[Example], labels: list[str], minimum: int, repeat: int) -> list[Example]:
    """``examples`` with each text that holds at least ``minimum`` mentions of a label repeated
    ``repeat`` times (under-counting long lists is PaDeLLM's main error)."""
    if repeat <= 1:
        return examples
    return [e for e in examples for _ in range(repeat if any(len(e.mentions(label)) >= minimum for label in labels) else 1)]

log = logging.getLogger(__name__)
#: Fewer optimizer steps than this teach a model none of its queries (a 20-line file for 3 epochs
#: is 3 steps, and scores 0 on dev): the run says so before it starts.
MIN_USEFUL_STEPS = 50


def too_few_steps(n_texts: int, lengths: list[int], config: TrainConfig) -> str | None:
    """What to tell a user whose run will take too few optimizer steps to learn anything (None:
    enough, or ``max_steps`` set on purpose)."""
    if config.max_steps is not None:
        return None
    per_epoch = len(length_batches(list(lengths), config.batch_tokens, config.seed))
    steps = max(1, math.ceil(per_epoch * config.epochs))
    if steps >= MIN_USEFUL_STEPS:
        return None
    epochs = math.ceil(MIN_USEFUL_STEPS / per_epoch)
    return (f"{config.train}: {n_texts} training texts make {per_epoch} optimizer step(s) an epoch in batches of "
            f"{config.batch_tokens} tokens, so {config.epochs:g} epoch(s) are {steps} step(s): too few to learn the queries "
            f"(about {MIN_USEFUL_STEPS} at least). Give more texts (a few hundred), or --epochs {epochs}, or a smaller "
            f"--batch-tokens; with only a few dozen texts expect a weak model.")


def prepare_model(config: TrainConfig) -> tuple[torch.nn.Module, PreTrainedTokenizerBase, int]:
    """The model to train, its tokenizer, and the index of its first trained layer."""
    model, tokenizer = load_base(config.base, dtype=resolve_precision(config.dtype, config.device).weights, device=config.device)
    if config.merged_with:  # also on resume: a checkpoint holds only the trained layers
        add_model_changes(model, config.base, config.merged_with, config.device)
    trained = trained_layer_indices(model, config.top_layers)
    if config.full:
        model.requires_grad_(config.top_layers is None)
        if config.top_layers is not None:
            for index in trained:
                model.get_decoder().layers[index].requires_grad_(True)
            model.get_decoder().norm.requires_grad_(True)
    elif config.init_adapter:
        model = continued_adapter(model, config.init_adapter, AdapterShape(
            config.base, config.lora_r, config.lora_alpha, None if config.top_layers is None else trained))
    else:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout, task_type="CAUSAL_LM",
                          target_modules="all-linear" if config.top_layers is None else list(LINEAR_MODULES),
                          layers_to_transform=None if config.top_layers is None else trained)
        model = get_peft_model(model, lora)
    model.train()
    return model, tokenizer, trained[0]


@dataclass(frozen=True)
class AdapterShape:
    """What a LoRA adapter must share with a run that trains it further."""

    base: str
    rank: int | None  # None: a rank per layer (an adapter stored by ``low_rank``), which the run keeps
    alpha: int | None
    layers: list[int] | None  # None: every layer

    #: how an error message names each field
    NAMES = {"base": "base", "rank": "LoRA rank", "alpha": "LoRA alpha", "layers": "layers"}

    @classmethod
    def of_adapter(cls, folder: Path) -> AdapterShape:
        """The shape of the adapter in the NER model ``folder``."""
        from peft import PeftConfig

        adapter = PeftConfig.from_pretrained(str(folder))
        base = NERModelConfig.read(folder).base
        if adapter.rank_pattern:
            return cls(base, None, None, _adapted_layers(adapter.target_modules))
        return cls(base, adapter.r, adapter.lora_alpha, adapter.layers_to_transform)

    def mismatches(self, run: AdapterShape) -> list[str]:
        """Where ``run`` does not fit this adapter: a rank per layer is kept whatever the run's
        rank, but its layers must be among those the run trains."""
        if self.rank is not None:
            return [f"{self.NAMES[f.name]} {getattr(self, f.name)} where the run has {getattr(run, f.name)}"
                    for f in fields(self) if getattr(self, f.name) != getattr(run, f.name)]
        wrong = [f"base {self.base} where the run has {run.base}"] if self.base != run.base else []
        if self.layers is not None and run.layers is not None and not set(self.layers) <= set(run.layers):
            wrong.append(f"layers {self.layers} where the run trains only {run.layers}")
        return wrong


def _adapted_layers(target_modules: object) -> list[int] | None:
    """The decoder layers that an adapter's modules, named in full, lie in (None: not named so)."""
    if not isinstance(target_modules, (list, set, tuple)):
        return None
    found = [re.search(r"\.layers\.(\d+)\.", name) for name in target_modules]
    return None if not all(found) else sorted({int(match.group(1)) for match in found})


def continued_adapter(model: torch.nn.Module, init_adapter: str, run: AdapterShape) -> torch.nn.Module:
    """``model`` with the adapter of the NER model ``init_adapter``, trainable: a model trained
    further stays one adapter on its base, whose shape must fit the ``run``'s."""
    from peft import PeftModel

    folder = resolve_ner_model(init_adapter)
    mismatches = AdapterShape.of_adapter(folder).mismatches(run)
    if mismatches:
        raise ValueError(f"--init-adapter {init_adapter}: its adapter has " + "; ".join(mismatches))
    return PeftModel.from_pretrained(model, str(folder), is_trainable=True)


def _ner_config(config: TrainConfig, labels: list[str], tokenizer: PreTrainedTokenizerBase, sentence_windows: bool) -> NERModelConfig:
    choices = decoding_choices(config.init_adapter or config.base, labels)
    if config.document_consistency is not None:
        choices["document_consistency"] = config.document_consistency
    return NERModelConfig(
        name=config.name, labels=labels, base=SELF_CONTAINED if config.full else config.base, language=config.language,
        eos_token=tokenizer.eos_token, label_names=dict(config.label_names), sentence_windows=sentence_windows,
        window_tokens=config.window_tokens, answers_past_count=config.past_count_queries, **choices,
    )


def decoding_choices(model: str, labels: list[str]) -> dict:
    """The decoding settings chosen on dev for the NER model a run trains further (its count bias,
    mention repair, document consistency and overlap margin), when it has the run's labels: the
    trained model keeps them until they are chosen again (``padellm-ner calibrate-counts``).
    Nothing for a plain causal LM."""
    try:
        chosen = NERModelConfig.read(resolve_ner_model(model))
    except ModelNotFoundError:
        return {}
    if chosen.labels != labels:
        return {}
    return {"count_bias": chosen.count_bias, "repair_unaligned": chosen.repair_unaligned,
            "document_consistency": chosen.document_consistency, "shorter_span_margin": chosen.shorter_span_margin}


def evaluate_during_training(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, config: TrainConfig, ner_config: NERModelConfig,
                             dev: list[Example], deadline: float | None = None) -> dict:
    """Dev scores of the model as it is now (both strategies when both formats are trained), of
    the dev texts scored by ``deadline``."""
    lm = inner_model(model)
    lm.eval()
    engine = NEREngine(NERModel(lm, tokenizer, ner_config, Path(config.output)))
    scores = dev_scores(engine, dev, [s for s in ("padellm", "ar") if s in config.formats], config.eval_batch_size, deadline=deadline)
    lm.train()
    return scores


def train(config: TrainConfig) -> dict:
    """Train, evaluate and save the model to ``config.output``; return the final metrics. With
    ``config.resume``, a run stopped at any moment continues from its last checkpoint exactly as
    if it had not stopped (same weights, optimizer, schedule, data order). ``config.max_minutes``
    bounds the whole run, dev scoring included (:mod:`training.run_budget`)."""
    started = time.perf_counter()
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    output = Path(config.output)
    train_examples = read_corpus(config.train)[: config.limit]
    dev_examples = read_corpus(config.dev)[: config.eval_limit] if config.dev else []
    labels = check_labels(config.labels, train_examples, config.train, dev_examples, config.dev)
    unknown = set(config.loss_weights) - set(QUERY_KINDS)
    if unknown:
        raise ValueError(f"loss_weights names unknown query kinds {sorted(unknown)}; the kinds: {', '.join(QUERY_KINDS)}")
    if config.calibrate_counts and (config.dev is None or "padellm" not in config.formats):
        raise ValueError("calibrate_counts chooses PaDeLLM's count bias on a dev file: it needs dev and the padellm format")
    model, tokenizer, first_layer = prepare_model(config)
    ner_config = _ner_config(config, labels, tokenizer, mostly_single_sentences([e.text for e in train_examples]))
    windows = config.document_windows if config.limit is None else min(config.document_windows, config.limit)  # a smoke run reads few
    if windows:
        train_examples += document_windows(config.train, lambda piece: prompts.text_token_count(tokenizer, piece),
                                           ner_config.window_tokens or MAX_WINDOW_TOKENS, windows, config.seed)
    train_examples = oversample_hard_counts(train_examples, labels, config.hard_count_min, config.hard_count_repeat)
    rows = [build_row(e, labels, tokenizer, config.formats, config.label_names, config.loss_weights or None, config.past_count_queries)
            for e in tqdm(train_examples, desc="build rows", unit="text")]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    vocabulary = KeptVocabulary.of((t for r in rows for t in r.input_ids), tokenizer) if config.kept_vocabulary else None
    lengths = [len(r) for r in rows]
    warning = too_few_steps(len(train_examples), lengths, config)
    if warning:
        log.warning(warning)
    settings = LoopSettings(lr=config.lr, batch_tokens=config.batch_tokens, seed=config.seed, checkpoint_folder=output / "checkpoint",
                            epochs=config.epochs, warmup_steps=config.warmup_steps, max_steps=config.max_steps,
                            max_minutes=config.max_minutes, checkpoint_minutes=config.checkpoint_minutes, resume=config.resume)
    precision = resolve_precision(config.dtype, config.device)
    frozen, setup_seconds = None, 0.0
    if first_layer > 0:
        began = time.perf_counter()
        trees = [r.tree for r in rows]
        with precision.autocast(config.device):
            frozen = FrozenHidden.build(inner_model(model), trees, first_layer, settings.checkpoint_folder / "frozen", pad, config.batch_tokens)
        setup_seconds = time.perf_counter() - began

    def batch_loss(batch: list[int]) -> torch.Tensor:
        hidden = frozen.padded(batch) if frozen is not None else None
        with precision.autocast(config.device):
            return answer_loss(model, [rows[i] for i in batch], pad, hidden, first_layer, vocabulary)

    plan = budget_dev(model, tokenizer, config, ner_config, dev_examples, started) if config.max_minutes is not None and dev_examples else None
    if plan is not None:
        dev_examples = dev_examples[: plan.dev_texts]
        # the loop counts the frozen pass, already done, among its minutes
        settings = replace(settings, max_minutes=plan.training_minutes + setup_seconds / 60)

    def evaluate() -> dict:
        return evaluate_during_training(model, tokenizer, config, ner_config, dev_examples, plan.deadline if plan else None)

    state = run_loop(model, lengths, batch_loss, settings, evaluate if dev_examples else None, setup_seconds)
    calibration_limit = config.limit if plan is None else min(config.limit or plan.calibration_texts, plan.calibration_texts)
    calibration = calibrate_count_bias(model, tokenizer, config, ner_config, calibration_limit) if config.calibrate_counts else None
    if vocabulary is not None:
        output.mkdir(parents=True, exist_ok=True)
        vocabulary.save(output)
    return save_model(model, tokenizer, config, ner_config, state, calibration)


def calibrate_count_bias(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, config: TrainConfig, ner_config: NERModelConfig,
                         limit: int | None = None) -> str:
    """Choose each label's count bias on the dev file's first ``limit`` texts (None: all of it; a
    smoke run's ``limit`` or the run's budget cuts it), set it in ``ner_config`` and return the
    table of its F1 and counts' errors before and after."""
    lm = inner_model(model)
    lm.eval()
    engine = NEREngine(NERModel(lm, tokenizer, ner_config, Path(config.output)))
    return calibrate_model(engine, ner_config, config.dev, config.eval_batch_size, limit)


def budget_dev(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, config: TrainConfig, ner_config: NERModelConfig,
               dev: list[Example], started: float) -> DevPlan:
    """The plan of a run with ``config.max_minutes``: a text's seconds measured on the first dev
    texts (of a dev set larger than :data:`~training.run_budget.SMALL_DEV_TEXTS`), then what dev
    scoring the minutes allow (:func:`training.run_budget.plan_dev`)."""
    seconds_per_text = 0.0  # a dev set hardly bigger than the probe is not cut: only the deadline holds it
    if len(dev) > SMALL_DEV_TEXTS:
        probe = dev[:PROBE_TEXTS]
        began = time.perf_counter()
        evaluate_during_training(model, tokenizer, config, ner_config, probe)
        seconds_per_text = (time.perf_counter() - began) / len(probe)
    calibration_texts = len(read_corpus(config.dev)[: config.limit]) if config.calibrate_counts and config.dev else 0
    plan = plan_dev(config.max_minutes or 0.0, started, seconds_per_text, len(dev), max(1, math.ceil(config.epochs)), calibration_texts)
    note = plan.note(len(dev), calibration_texts)
    if note:
        log.warning(note)
    return plan


def save_model(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, config: TrainConfig, ner_config: NERModelConfig, state: dict,
               count_calibration: str | None = None) -> dict:
    """Write the adapter (fp16) or the full model, ``ner_model.json``, ``training.json`` and a
    ``README.md`` model card (with ``count_calibration``, the table of a count bias chosen on dev). The adapter names its base as the run was given it (an alias such
    as ``smollm2-135m-instruct``, a name or a path), never the folder it resolved to on this
    machine (the de-quantised cache of an alias); :class:`NERModel` loads the base of ``ner_model.json``."""
    output = Path(config.output)
    output.mkdir(parents=True, exist_ok=True)
    if config.full:
        inner_model(model).save_pretrained(output)
        tokenizer.save_pretrained(output)
    else:
        save_adapter(model, config.base, output)
    ner_config.metrics = {"dev_during_training": state["history"][-1]} if state["history"] else {}
    ner_config.write(output)
    summary = {"config": asdict(config), "steps": state["step"], "tokens": state["tokens"], "train_seconds": round(state["seconds"], 1),
               "tokens_per_second": round(state["tokens"] / max(state["seconds"], 1e-9), 1), "history": state["history"],
               "count_bias": ner_config.count_bias, "count_calibration": count_calibration, "allocator": current_allocator()}
    (output / "training.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (output / "README.md").write_text(model_card(config, ner_config.labels, summary), encoding="utf-8")  # in place of peft's empty template
    return summary


def save_adapter(model: torch.nn.Module, base: str, output: Path) -> None:
    """Write a peft model's trained adapter to ``output`` in fp16, naming ``base`` as given (an
    alias, a shipped name or a path), never the folder it resolved to on this machine. The model
    itself is left as it was, so a run can save snapshots and go on training."""
    trained = {name: parameter.detach().half() for name, parameter in model.named_parameters() if parameter.requires_grad}
    for adapter in model.peft_config.values():
        adapter.base_model_name_or_path = base
    # training keeps the base's vocabulary: no embeddings to save, and no look-up of the base's
    # config.json (by the name as given, which peft would try on the Hugging Face Hub)
    model.save_pretrained(output, state_dict=trained, save_embedding_layers=False)


def model_card(config: TrainConfig, labels: list[str], summary: dict) -> str:
    """A short ``README.md`` of a trained folder: what it is, how to use it, how it was trained
    (the settings that differ from :class:`TrainConfig`'s defaults) and its dev scores."""
    if config.full:
        kind = f"full fine-tuning of `{config.base}`"
    elif config.init_adapter:
        kind = f"the LoRA adapter of `{config.init_adapter}` trained further, over `{config.base}`"
    else:
        kind = f"a LoRA adapter (r={config.lora_r}) over `{config.base}`"
    defaults = asdict(type(config)(base="", train="", output=""))
    settings = {key: value for key, value in summary["config"].items()
                if key != "output" and (key in ("base", "train") or value != defaults[key])}
    lines = [
        "---", f"base_model: {json.dumps(config.base)}", f"library_name: {'transformers' if config.full else 'peft'}",
        f"language: {config.language}", "tags: [padellm-ner, ner]", "---", "",
        f"# {config.name}", "",
        f"A PaDeLLM-NER model: {kind}, trained for the labels {', '.join(f'`{label}`' for label in labels)} "
        f"({', '.join(config.formats)} formats).", "",
        "```", f"padellm-ner extract --model {config.output} \"Text to tag\"", f"padellm-ner serve --model {config.output}", "```", "",
        "## Training", "",
        f"- steps: {summary['steps']}, {summary['tokens']:,} tokens in {summary['train_seconds']} s ({summary['tokens_per_second']:,} tokens/s) "
        f"on `{config.device}`",
        "- settings other than the defaults (all of them are in `training.json`):", "",
        "```json", json.dumps(settings, indent=2, ensure_ascii=False), "```",
    ]
    if summary["history"]:
        strategies = [s for s in ("padellm", "ar") if s in summary["history"][-1]]
        lines += ["", "## Dev micro-F1 during training", "", "| epoch | step | " + " | ".join(strategies) + " |",
                  "| --- | --- | " + " | ".join("---" for _ in strategies) + " |"]
        lines += [f"| {h['epoch']} | {h['step']} | " + " | ".join(f"{h[s]['micro_f1']:.2f}" for s in strategies) + " |" for h in summary["history"]]
    if summary.get("count_calibration"):
        lines += ["", "## Count bias chosen on dev", "", f"`count_bias`: `{json.dumps(summary['count_bias'])}` (before it: the model's bias in brackets)",
                  "", summary["count_calibration"]]
    return "\n".join(lines) + "\n"
