"""Store a fine-tuned model as a LoRA adapter over the base it started from, within a size budget.

Full fine-tuning of a model's top layers gains more on the CPU than LoRA does, but its result is a
whole model. What it changed is smaller: each linear layer's change
``W_tuned - W_base`` is kept as the product ``B @ A`` of its truncated SVD (the closest matrix of
that rank), the ranks chosen across all layers by largest squared singular value per stored weight until
the adapter's budget is spent; the changed norms (a few hundred weights each) are stored whole
(peft's ``modules_to_save``). The result is an ordinary peft adapter, which the engine merges into
its base at load time. A lexical-unit model keeps its placeholder adapter as it is, beside the
stored change of the model beneath it. A stage of a recipe (trainer ``low_rank``) after a full fine-tuning stage.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel

from general_decoding.kept_vocabulary import FILE as KEPT_VOCABULARY
from training.configs import LowRankConfig
from training.top_layers import LINEAR_MODULES

if TYPE_CHECKING:
    from ner_service.engine.ner_model import NERModel, NERModelConfig

#: Bytes a stored adapter weight takes (fp16), and at most what the file's header takes per tensor (its name, shape, offsets).
WEIGHT_BYTES = 2
HEADER_BYTES_PER_TENSOR = 256
MEGABYTE = 1_000_000
#: A singular value below this share of the largest is zero for :func:`thin_svd` (its rounding is about 1.5e-8).
ZERO_SINGULAR_VALUE = 1e-7


@dataclass(frozen=True)
class LayerChange:
    """One linear layer's change, by singular values (descending) and the factors that give it."""

    name: str
    singular_values: torch.Tensor
    left: torch.Tensor  # out x k: U * sqrt(S)
    right: torch.Tensor  # k x in: sqrt(S) * V^T

    @property
    def weights_per_rank(self) -> int:
        """Stored weights one more rank costs (a column of B and a row of A)."""
        return self.left.shape[0] + self.right.shape[1]


@dataclass(frozen=True)
class RankChoice:
    """What the adapter keeps: a rank per changed linear layer, the norms stored whole, and the
    share of the change (squared Frobenius norm) the ranks keep."""

    ranks: dict[str, int]
    norms: list[str]
    kept_share: float
    stored_weights: int


def linear_changes(tuned: PreTrainedModel, base: PreTrainedModel) -> list[LayerChange]:
    """Every adapted linear layer (:data:`LINEAR_MODULES`) that differs between the two models, as its SVD."""
    base_modules = dict(base.named_modules())
    changes = []
    for name, module in tuned.named_modules():
        if not (isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in LINEAR_MODULES):
            continue
        delta = module.weight.detach().double() - base_modules[name].weight.detach().double()
        if not delta.any():
            continue
        u, s, vt = thin_svd(delta)
        root = s.sqrt()
        changes.append(LayerChange(name, s, (u * root).float(), (root[:, None] * vt).float()))
    return changes


def thin_svd(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``U, S, V^T`` of ``matrix`` (singular values descending) through the eigendecomposition of its
    smaller Gram matrix, about twice as fast as ``torch.linalg.svd`` on the CPU. In float64 the
    singular vectors of the smaller side are orthonormal, the first ``k`` factors give the matrix
    projected on that side's first ``k`` (its best approximation of rank ``k``), and a singular value
    is exact to rounding well above 1e-7 of the largest; below that the Gram matrix cannot tell it
    from zero, and it is zero (its vector of the other side too)."""
    wide = matrix.shape[0] <= matrix.shape[1]
    short = matrix if wide else matrix.T
    eigenvalues, vectors = torch.linalg.eigh(short @ short.T)
    values = eigenvalues.flip(0).clamp_min(0).sqrt()
    values = torch.where(values > ZERO_SINGULAR_VALUE * values[:1], values, torch.zeros_like(values))
    vectors = vectors.flip(1)
    rows = vectors.T @ short
    rows = torch.where(values[:, None] > 0, rows / values.clamp_min(torch.finfo(values.dtype).tiny)[:, None], torch.zeros_like(rows))
    return (vectors, values, rows) if wide else (rows.T, values, vectors.T)


def changed_norms(tuned: PreTrainedModel, base: PreTrainedModel) -> list[str]:
    """The modules other than adapted linear layers whose weights changed: they must be norms
    (stored whole); anything larger (an embedding, the output layer) cannot be an adapter."""
    base_parameters = dict(base.named_parameters())
    changed = set()
    for name, parameter in tuned.named_parameters():
        module = name.rsplit(".", 1)[0]
        if module.rsplit(".", 1)[-1] in LINEAR_MODULES or torch.equal(parameter, base_parameters[name]):
            continue
        if parameter.dim() != 1:
            raise ValueError(f"{name} changed ({tuple(parameter.shape)}): only linear layers and norms can be stored as an adapter")
        changed.add(module)
    return sorted(changed)


def choose_ranks(changes: list[LayerChange], budget_weights: int, norm_weights: int = 0) -> dict[str, int]:
    """Ranks per layer that keep the most squared singular value per stored weight (the truncated
    SVDs' error is the sum of the squares left out) within ``budget_weights``."""
    candidates = sorted(((float(s) ** 2 / change.weights_per_rank, index, change.weights_per_rank)
                         for index, change in enumerate(changes) for s in change.singular_values if s > 0), reverse=True)
    ranks = [0] * len(changes)
    spent = norm_weights
    for _, index, cost in candidates:
        if spent + cost > budget_weights:
            continue
        ranks[index] += 1
        spent += cost
    return {change.name: rank for change, rank in zip(changes, ranks) if rank}


def kept_share(changes: list[LayerChange], ranks: dict[str, int]) -> float:
    """The share of the whole change (squared Frobenius norm) that the chosen ranks keep."""
    total = sum(float((c.singular_values ** 2).sum()) for c in changes)
    kept = sum(float((c.singular_values[: ranks.get(c.name, 0)] ** 2).sum()) for c in changes)
    return kept / total if total else 1.0


def low_rank_adapter(tuned: PreTrainedModel, base: PreTrainedModel, max_megabytes: float) -> tuple[torch.nn.Module, RankChoice]:
    """``base`` wrapped in a peft LoRA adapter that approximates ``tuned`` within ``max_megabytes``
    of fp16 weights: the chosen truncated SVDs as ``B @ A`` (scaling 1), changed norms whole."""
    from peft import LoraConfig, get_peft_model

    changes = linear_changes(tuned, base)
    norms = changed_norms(tuned, base)
    tuned_modules = dict(tuned.named_modules())
    norm_weights = sum(p.numel() for name in norms for p in tuned_modules[name].parameters())
    header = HEADER_BYTES_PER_TENSOR * (2 * len(changes) + len(norms))
    budget = (int(max_megabytes * MEGABYTE) - header) // WEIGHT_BYTES
    ranks = choose_ranks(changes, budget, norm_weights)
    if not ranks:
        raise ValueError("the tuned model's linear layers do not differ from the base's: nothing to store")
    config = LoraConfig(r=max(ranks.values()), lora_alpha=max(ranks.values()), target_modules=list(ranks),
                        rank_pattern=dict(ranks), alpha_pattern=dict(ranks), modules_to_save=norms or None,
                        lora_dropout=0.0, task_type="CAUSAL_LM")
    adapted = get_peft_model(base, config)
    modules = dict(adapted.get_base_model().named_modules())
    with torch.no_grad():
        for change in changes:
            rank = ranks.get(change.name, 0)
            if rank:
                layer = modules[change.name]
                layer.lora_A["default"].weight.copy_(change.right[:rank])
                layer.lora_B["default"].weight.copy_(change.left[:, :rank])
        for name in norms:
            saved = modules[name].modules_to_save["default"]
            saved.load_state_dict(tuned_modules[name].state_dict())
    stored = sum(ranks[c.name] * c.weights_per_rank for c in changes if c.name in ranks) + norm_weights
    return adapted, RankChoice(ranks, norms, kept_share(changes, ranks), stored)


def store_low_rank(config: LowRankConfig) -> dict:
    """The ``low_rank`` trainer: write ``config.model`` as an adapter over ``config.base`` to
    ``config.output`` (with its ``ner_model.json`` and a model card), choose its count biases on dev
    (``calibrate_counts``) and score it on dev."""
    from ner_service.engine.ner_model import PLACEHOLDER_ADAPTER, NERModel, load_base
    from training.trainer import save_adapter

    tuned = NERModel.load(config.model, device=config.device)
    base, _ = load_base(config.base, device=config.device)
    if tuned.model.config.to_dict().get("num_hidden_layers") != base.config.num_hidden_layers:
        raise ValueError(f"{config.model} and {config.base} differ in shape: the base must be the model the tuning started from")
    output = Path(config.output)
    placeholder_bytes = 0
    if tuned.config.lud_placeholder is not None:
        if (tuned.path / PLACEHOLDER_ADAPTER).is_dir():
            raise ValueError(f"{config.model} is a lexical-unit model stored over a public base already")
        # the placeholder adapter applies at placeholder columns only: it is kept as it is, the change beneath it stored low-rank
        placeholder_bytes = _copy_placeholder_adapter(tuned.path, output / PLACEHOLDER_ADAPTER)
        changed, _ = load_base(tuned.config.base, device=config.device)
    else:
        changed = tuned.model
    adapted, choice = low_rank_adapter(changed, base, config.max_megabytes - placeholder_bytes / MEGABYTE)
    save_adapter(adapted, config.base, output)
    size = (output / "adapter_model.safetensors").stat().st_size + placeholder_bytes
    if size > config.max_megabytes * MEGABYTE:
        raise ValueError(f"the adapter takes {size / MEGABYTE:.2f} MB, over max_megabytes {config.max_megabytes}")
    ner_config = replace(tuned.config, name=config.name, base=config.base, metrics={})
    ner_config.write(output)
    if (tuned.path / KEPT_VOCABULARY).is_file():  # the tokens the tuning's loss spanned (benchmarks/kept_vocabulary.py)
        shutil.copyfile(tuned.path / KEPT_VOCABULARY, output / KEPT_VOCABULARY)
    tuning = tuned.path / "training.json"  # how the model was tuned: the stage before, for the card
    summary = {"config": asdict(config), "adapter_bytes": size, "kept_share": choice.kept_share, "stored_weights": choice.stored_weights,
               "norms": choice.norms, "ranks": choice.ranks, "dev": None,
               "tuned": json.loads(tuning.read_text(encoding="utf-8")) if tuning.is_file() else None}
    if config.dev:
        written = NERModel.load(output, device=config.device)  # the adapter as users load it (fp16, merged), loaded once
        if config.calibrate_counts:
            summary["count_calibration"] = _calibrate_counts(written, config, ner_config)
        summary["dev"] = _dev_scores(written, config) if config.eval_limit != 0 else None
        ner_config.metrics = {"dev_during_training": summary["dev"]} if summary["dev"] else {}
        ner_config.write(output)
    (output / "training.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (output / "README.md").write_text(model_card(config, summary), encoding="utf-8")
    return summary


def _copy_placeholder_adapter(model_folder: Path, target: Path) -> int:
    """Copy a lexical-unit model's placeholder adapter (its folder's own); the bytes its weights take."""
    source = model_folder
    target.mkdir(parents=True, exist_ok=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copyfile(source / name, target / name)
    return (target / "adapter_model.safetensors").stat().st_size


def _calibrate_counts(written: "NERModel", config: LowRankConfig, ner_config: "NERModelConfig") -> str:
    """Choose each label's count bias on the whole dev file for the stored adapter (the stored
    change is not the tuned one: its counts are chosen again), set it in ``ner_config`` (written with
    the dev scores) and on the loaded model ``written``, and return the calibration's table."""
    from ner_service.engine import NEREngine
    from training.count_calibration import calibrate_model

    table = calibrate_model(NEREngine(written), ner_config, config.dev, config.eval_batch_size)
    written.config.count_bias = ner_config.count_bias
    return table


def _dev_scores(written: "NERModel", config: LowRankConfig) -> dict:
    """PaDeLLM and AR micro-F1 of the stored adapter on the first ``eval_limit`` dev texts."""
    from corpora import read_corpus
    from ner_service.engine import NEREngine
    from training.evaluate import dev_scores

    return dev_scores(NEREngine(written), read_corpus(config.dev)[: config.eval_limit], ("padellm", "ar"), progress=True)


def model_card(config: LowRankConfig, summary: dict) -> str:
    """A short ``README.md``: what the adapter stores and what it scores on dev."""
    ranks = summary["ranks"]
    lines = [
        "---", f"base_model: {json.dumps(config.base)}", "library_name: peft", "tags: [padellm-ner, ner]", "---", "",
        f"# {config.name}", "",
        f"`{config.model}` stored as a LoRA adapter over `{config.base}`: each changed linear layer's difference from the "
        f"base cut to a rank of its own (truncated SVD), {len(ranks)} layers, ranks {min(ranks.values())}-{max(ranks.values())}, "
        f"{summary['stored_weights']:,} fp16 weights ({summary['adapter_bytes'] / MEGABYTE:.2f} MB) keeping "
        f"{100 * summary['kept_share']:.1f} % of the change (squared Frobenius norm); {len(summary['norms'])} changed norms stored whole.",
    ]
    if summary["dev"]:
        lines += ["", "| strategy | dev texts | micro-F1 | P | R |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {s} | {r['n_sentences']} | {r['micro_f1']:.2f} | {r['precision']:.2f} | {r['recall']:.2f} |" for s, r in summary["dev"].items()]
    if summary.get("count_calibration"):
        lines += ["", "Each label's count bias, chosen on the whole dev file for its F1:", "", summary["count_calibration"]]
    return "\n".join(lines) + "\n"
