"""An NER model: a causal LM (a base plus, usually, a LoRA adapter) and its ``ner_model.json``.

Shipped models live in ``ner_service/shipped_models/<name>/`` and are chosen by name, as are
the models in the folders of ``PADELLM_NER_MODEL_PATH`` (a list of folders like ``PATH``: one's
own models, the test suite's tiny model); any folder with an ``ner_model.json`` works too.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ner_service.engine.count_bias import CountBiasSetting
from ner_service.engine.model_loading import ModelNotFoundError, load_causal_lm, vocabulary
from ner_service.engine.shared_bases import SharedBases, own_lora_targets, shared_copy

if TYPE_CHECKING:  # torch is imported by loading, not by reading a model's ner_model.json
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

CONFIG_FILE = "ner_model.json"
log = logging.getLogger(__name__)
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "shipped_models"
DEFAULT_MODEL = "en-conll03"
#: The shipped model that serves each language by default.
DEFAULT_MODELS = {"en": DEFAULT_MODEL, "zh": "zh-resume"}
#: The shipped models a server offers unless ``NER_MODELS`` says otherwise: each language's
#: default and the current model of each other kind (Weibo posts, lexical units, diffusion, any labels);
#: earlier versions and other bases stay loadable by the command line and by ``NER_MODELS``.
CURRENT_MODELS = (*DEFAULT_MODELS.values(), "zh-weibo", "en-conll03-lud", "en-conll03-diffusion", "open")
SELF_CONTAINED = "."
#: The sub-folder of a lexical-unit model stored over a public base that holds its placeholder
#: adapter (unmerged); the folder's own adapter, merged, is the rest of its change from the base.
PLACEHOLDER_ADAPTER = "placeholder_adapter"


@dataclass
class NERModelConfig:
    """What ``ner_model.json`` holds: labels, where the base is, decoding limits, metrics."""

    name: str
    labels: list[str]  # an open model: the labels answered when a caller names none
    base: str = SELF_CONTAINED
    language: str = "en"
    prompt_version: int = 1
    max_mention_tokens: int = 24
    max_ar_tokens: int = 192
    eos_token: str | None = None
    label_names: dict[str, str] = field(default_factory=dict)
    lud_placeholder: str | None = None  # set by `train-lud`: the placeholder token of lexical-unit decoding
    lud_unit_size: int | None = None
    count_bias: CountBiasSetting = 0.0  # PaDeLLM: per unit of a count's first digit, for every label or per label (count_bias.py)
    count_quantile: float | None = None  # PaDeLLM: the largest count this probable or more, in place of count_bias (count_bias.py)
    repair_unaligned: bool = True  # PaDeLLM: re-ask a mention not in the text, restricted to its spans
    answers_past_count: bool = False  # trained with past-count queries: an empty mention answer says "no such mention", kept
    past_count_floor: float = 0.0  # PaDeLLM asks past a count only where a further mention has this probability (0: always); chosen on dev
    sentence_windows: bool = False  # read each sentence as a window of its own (trained on single sentences)
    window_tokens: int | None = None  # the longest window read, in text tokens (None: the engine's); chosen on dev
    document_consistency: bool = False  # a name keeps one label in a text and is tagged wherever it recurs (document_consistency.py)
    shorter_span_margin: float | None = None  # a span replaces longer ones it overlaps when this much more probable (spans.py); chosen on dev
    mask_token: str | None = None  # set by `train-diffusion`: the mask token of a masked-diffusion model
    diffusion_shift: bool = False  # a diffusion model adapted from an AR LM reads token i from column i - 1
    diffusion_causal_prompt: bool = False  # ... and keeps its prompt causal (only the answer is bidirectional)
    diffusion_threshold: float = 0.9  # Fast-dLLM unmasks the run of positions more confident than this (chosen per model)
    open_labels: bool = False  # takes any label names (and descriptions) at call time (training/open_trainer.py)
    trained_names: list[str] = field(default_factory=list)  # an open model: the label names it trained on, lower-cased (labels.unfamiliar_names)
    score_calibration: dict[str, dict[str, float]] = field(default_factory=dict)  # per strategy: Platt slope, intercept (score_calibration.py)
    metrics: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, folder: Path) -> "NERModelConfig":
        data = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def prompt_name(self, label: str) -> str:
        """How ``label`` is written in prompts (``label_names``, e.g. NAME -> 人名; else the label)."""
        return self.label_names.get(label, label)

    def label_of(self, name: str) -> str:
        """The label written as ``name`` in a prompt (inverse of :meth:`prompt_name`)."""
        return next((label for label, shown in self.label_names.items() if shown == name), name)

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_FILE).write_text(json.dumps(asdict(self), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


#: Folders of further models chosen by name, separated as in ``PATH`` (after the shipped ones).
MODEL_PATH_ENV = "PADELLM_NER_MODEL_PATH"


def shipped_model_names() -> list[str]:
    """Names of the models shipped with the package."""
    return sorted(p.parent.name for p in SHIPPED_DIR.glob(f"*/{CONFIG_FILE}"))


def model_path_folders() -> list[Path]:
    """The folders of :data:`MODEL_PATH_ENV`, in order."""
    return [Path(f).expanduser() for f in os.environ.get(MODEL_PATH_ENV, "").split(os.pathsep) if f.strip()]


def named_model_names() -> list[str]:
    """Names of every model chosen by name: the shipped ones, then those of :data:`MODEL_PATH_ENV`."""
    shipped = shipped_model_names()
    found = [p.parent.name for folder in model_path_folders() for p in sorted(folder.glob(f"*/{CONFIG_FILE}"))]
    return shipped + [name for name in dict.fromkeys(found) if name not in shipped]


def shipped_models_that(can: Callable[[NERModelConfig], bool]) -> list[str]:
    """Names of the shipped models whose config passes ``can`` (which models run a given decoder or strategy)."""
    return [name for name in shipped_model_names() if can(NERModelConfig.read(SHIPPED_DIR / name))]


def _base_language(language: str) -> str:
    """``"zh"`` of ``"zh-CN"``, ``"zh_Hans"`` or ``" ZH "``."""
    return language.strip().lower().replace("_", "-").split("-")[0]


def default_model_for_language(language: str) -> str:
    """The shipped model name for ``language`` ("en", "zh"; a region such as "zh-CN" is ignored)."""
    base = _base_language(language)
    if base not in DEFAULT_MODELS:
        raise ModelNotFoundError(f"no model for language {language!r}; languages: {', '.join(sorted(DEFAULT_MODELS))}")
    return DEFAULT_MODELS[base]


def model_for_language(language: str | None, default: str | Path) -> str:
    """The model that serves ``language`` when ``default`` is the configured model: ``default``
    itself for no language or its own language, else the shipped default of ``language``
    (:class:`ModelNotFoundError` when there is none)."""
    if language is None or _base_language(language) == _base_language(NERModelConfig.read(resolve_ner_model(default)).language):
        return str(default)
    return default_model_for_language(language)


def resolve_ner_model(name_or_path: str | Path) -> Path:
    """The folder of a shipped model name or of a path holding ``ner_model.json``."""
    path = Path(name_or_path).expanduser()
    if (path / CONFIG_FILE).is_file():
        return path
    name = str(name_or_path)
    if "/" not in name and name not in (".", ".."):  # a name, not a path: never a way out of the folders
        for folder in (SHIPPED_DIR, *model_path_folders()):
            if (folder / name / CONFIG_FILE).is_file():
                return folder / name
    raise ModelNotFoundError(f"unknown model {name!r}: not a folder with {CONFIG_FILE}; models: {', '.join(named_model_names())}")


@dataclass
class NERModel:
    """A loaded NER model, ready for the engine."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    config: NERModelConfig
    path: Path

    @classmethod
    def load(cls, name_or_path: str | Path = DEFAULT_MODEL, dtype: torch.dtype | None = None, device: str = "cpu",
             bases: SharedBases | None = None, native: bool = False) -> "NERModel":
        """Load by shipped name or folder (``dtype`` None: float32); a LoRA adapter is merged into its
        base for speed, except a lexical-unit one (:mod:`general_decoding.lexical_units`): the
        folder's adapter when the model stands on another NER model, :data:`PLACEHOLDER_ADAPTER`
        when it stands on a public base (its own adapter, merged, the rest of the change). With
        ``bases`` (of this dtype and device), the base comes from there and the model shares the
        weights its adapter leaves as they are (:mod:`.shared_bases`). ``native``: for inference, a
        model merged from its files on a Gemma 3 base loads as this package's own class
        (:mod:`.gemma3_model`), read back merged from the cache where it was kept
        (:mod:`.merged_weights`); one that keeps a peft adapter, and ``bases`` loaded without
        ``native``, stay transformers' classes."""
        folder = resolve_ner_model(name_or_path)
        config = NERModelConfig.read(folder)
        if config.base == SELF_CONTAINED:
            model, tokenizer = load_causal_lm(folder, dtype=dtype, device=device, native=native)
        else:
            import copy

            from ner_service.engine.gemma3_model import Gemma3ForCausalLM
            from ner_service.engine.lora_merge import merge_lora, mergeable

            merged = config.lud_placeholder is None and mergeable(folder)  # the usual case: merged from the adapter's files
            shared = bases.get(config.base) if bases is not None else None
            kept = None
            if shared is not None and (merged or not isinstance(shared[0], Gemma3ForCausalLM)):  # peft wraps transformers' classes only
                base, tokenizer = shared_copy(shared[0]), copy.deepcopy(shared[1])
            else:
                kept = _kept_merge(config.base, folder, dtype) if native and merged and bases is None else None
                read_back = _read_kept_merge(kept, config.base, dtype, device) if kept is not None else None
                if read_back is not None:
                    return cls._finished(*read_back, config, folder)
                base, tokenizer = load_base(config.base, dtype, device, native=native and merged)
                shared = None
            if merged:
                merge_lora(base, folder)
                if kept is not None:
                    from ner_service.engine.merged_weights import keep

                    keep(base, kept)
                return cls._finished(base.eval(), tokenizer, config, folder)
            import warnings

            from peft import PeftModel

            from general_decoding.lexical_units import placeholder_adapter

            with warnings.catch_warnings():  # peft asks transformers for an attribute it deprecated; nothing to act on here
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                adapted = PeftModel.from_pretrained(base, folder)
                if config.lud_placeholder is None or (folder / PLACEHOLDER_ADAPTER).is_dir():  # else: the placeholder adapter itself
                    if shared is not None:
                        own_lora_targets(adapted)  # the merge writes into these: the shared base keeps its own
                    adapted = adapted.merge_and_unload()
                    if config.lud_placeholder is not None:
                        adapted = PeftModel.from_pretrained(adapted, folder / PLACEHOLDER_ADAPTER)
            if config.lud_placeholder is None:
                model = adapted.eval()
            else:  # a lexical-unit adapter stays unmerged: it applies at placeholder columns only
                model = adapted.get_base_model().eval()
                placeholder_adapter(model, tokenizer.convert_tokens_to_ids(config.lud_placeholder))
        return cls._finished(model, tokenizer, config, folder)

    @classmethod
    def _finished(cls, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: NERModelConfig, folder: Path) -> "NERModel":
        """The loaded model with its tokenizer set as the model was trained."""
        if config.eos_token and tokenizer.eos_token != config.eos_token:
            # tokenizer versions disagree on a GGUF's end token: answers end with the one trained on
            log.warning("end token %r of the base tokenizer replaced by %r, as trained", tokenizer.eos_token, config.eos_token)
            tokenizer.eos_token = config.eos_token
        if config.mask_token is not None:
            tokenizer.mask_token = config.mask_token
        if config.lud_placeholder is not None:
            model.config.lud_placeholder_id = tokenizer.convert_tokens_to_ids(config.lud_placeholder)
        return cls(model=model, tokenizer=tokenizer, config=config, path=folder)

    @property
    def eos_token_id(self) -> int:
        """The end token every answer ends with."""
        return int(self.tokenizer.eos_token_id)

    @property
    def pad_token_id(self) -> int:
        """The token left padding is made of (the end token when the tokenizer has no pad)."""
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_token_id

    @property
    def stop_token_ids(self) -> frozenset[int]:
        """The tokens an answer stops at."""
        return frozenset({self.eos_token_id})

    @cached_property
    def query_stop_token_ids(self) -> frozenset[int]:
        """The tokens a count or mention answer stops at: the end token and every token that holds a
        line break. A mention lies on one line of its text, so a model that goes on past it with a new
        line (the autoregressive answer's format, learned beside) has said all of the mention."""
        return self.stop_token_ids | line_break_tokens(self.tokenizer)

    @property
    def device(self) -> torch.device:
        return self.model.device


#: How a vocabulary writes a line break inside a token: itself (SentencePiece), byte-level BPE's
#: mark for byte 0x0A, a byte-fallback token.
LINE_BREAK_MARKS = ("\n", "\u010a", "<0x0A>")
LINE_BREAK_MARKED = re.compile("|".join(map(re.escape, LINE_BREAK_MARKS)))


def line_break_tokens(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Every token whose text holds a line break. Only the tokens written with a line-break mark
    and the special ones are decoded, an added one read as written, not the whole vocabulary: for
    Gemma 3's 262,144 tokens a few dozen instead of all (the same set: ``tests/test_cpu_inference.py``)."""
    candidates = {index for token, index in vocabulary(tokenizer).items() if LINE_BREAK_MARKED.search(token)} | set(tokenizer.all_special_ids)
    ordered = sorted(candidates)
    decoded = {index for index, text in zip(ordered, tokenizer.batch_decode([[index] for index in ordered])) if "\n" in text}
    return frozenset(decoded | {index for text, index in tokenizer.get_added_vocab().items() if "\n" in text})  # an added token decodes as written


def load_base(base: str | Path, dtype: torch.dtype | None = None, device: str = "cpu",
              bases: SharedBases | None = None, native: bool = False) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """What an adapter is stacked on (and what training starts from): a causal LM, or another NER
    model, its own adapter merged (``dtype`` None: float32; its own base from ``bases``; ``native``:
    as :meth:`NERModel.load`)."""
    try:
        stacked = resolve_ner_model(base)
    except ModelNotFoundError:
        return load_causal_lm(base, dtype=dtype, device=device, native=native)
    inner = NERModel.load(stacked, dtype=dtype, device=device, bases=bases, native=native)
    return inner.model, inner.tokenizer


def _kept_merge(base: str, folder: Path, dtype: torch.dtype | None) -> Path | None:
    """Where the merge of ``folder``'s adapter into ``base`` is kept (:mod:`.merged_weights`): for
    a public Gemma 3 base loaded natively; None for anything else, or with the cache off."""
    from ner_service.engine import gemma3_model, merged_weights
    from ner_service.engine.model_loading import resolve_model_folder

    if not merged_weights.enabled():
        return None
    try:
        resolve_ner_model(base)
        return None  # stacked on another NER model: its merge is that model's
    except ModelNotFoundError:
        pass
    base_folder = resolve_model_folder(base)
    if not gemma3_model.supported(base_folder):
        return None
    import torch

    return merged_weights.kept_path(folder, base_folder, dtype or torch.float32)


def _read_kept_merge(kept: Path, base: str, dtype: torch.dtype | None, device: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase] | None:
    """The model and tokenizer of ``base`` with the merged weights kept in ``kept``; None where
    none are kept, or they cannot be read (removed meanwhile by another process): merge again."""
    from ner_service.engine.merged_weights import mark_used

    if not kept.is_file():
        return None
    mark_used(kept)
    try:
        return load_causal_lm(base, dtype=dtype, device=device, native=True, weights=kept)
    except Exception:  # noqa: BLE001 - whatever the reason, the merge from the adapter's files is the way back
        log.warning("the kept merge %s could not be read; merging again", kept, exc_info=True)
        return None


def base_chain(name_or_path: str | Path) -> list[str]:
    """The bases ``name_or_path`` stands on, nearest first (none for a self-contained model)."""
    chain: list[str] = []
    config = NERModelConfig.read(resolve_ner_model(name_or_path))
    while config.base != SELF_CONTAINED:
        chain.append(config.base)
        try:
            config = NERModelConfig.read(resolve_ner_model(config.base))
        except ModelNotFoundError:  # a causal LM: the end of the chain
            break
    return chain
