"""The settings of each trainer (saved in its ``training.json``) and the values they take, in a
module without torch: reading a recipe (``padellm-ner recipes``) or building the command line
checks settings against these dataclasses without loading a model's libraries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from training.open_data import ZERO_SHOT_CORPORA

#: The training formats: PaDeLLM (a count and one query per mention, per label) and AR (all mentions in one answer).
FORMATS = ("padellm", "ar")
#: The kinds of query a row holds; the loss can weigh their answers differently.
QUERY_KINDS = ("count", "mention", "ar")
#: The starting points of a diffusion model besides an NER model (name or folder) to adapt.
INITS = ("scratch", "smollm2")
#: What a run's ``dtype`` may name (``training.precision``): ``mixed`` is float32 weights with bfloat16 matrix products.
Dtype = Literal["auto", "float32", "bfloat16", "mixed"]
DTYPE_CHOICES: tuple[str, ...] = get_args(Dtype)


@dataclass
class TrainConfig:
    """Everything a training run needs; saved next to the result for the model card."""

    base: str
    train: str
    output: str
    name: str = "padellm-ner"
    #: NER models on ``base``'s public base whose change from it is added to ``base`` before training
    #: (:mod:`training.model_merge`): a run that must learn their tasks starts from all of them.
    merged_with: list[str] = field(default_factory=list)
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
    #: Minutes of training (frozen pass included, dev scoring not); the learning rate's cosine ends
    #: with them when they end before ``epochs`` do.
    max_minutes: float | None = None
    batch_tokens: int = 2048
    limit: int | None = None
    eval_limit: int | None = 200
    eval_batch_size: int = 16
    #: Train only the top N decoder layers (None: all); the frozen layers below run once per row.
    top_layers: int | None = None
    #: Minutes of wall time between checkpoints (one is also written at the end of each epoch).
    checkpoint_minutes: float = 10.0
    seed: int = 0
    device: str = "cpu"
    #: "auto": float32 on the CPU, "mixed" (bfloat16 products) on one with bfloat16 instructions, bfloat16 on a GPU.
    dtype: Dtype = "auto"
    resume: bool = False
    #: Weight of each query kind's answer tokens in the loss (count, mention, ar; missing: 1).
    loss_weights: dict[str, float] = field(default_factory=dict)
    #: Texts with a label of at least ``hard_count_min`` mentions are seen this many times an epoch.
    hard_count_repeat: int = 1
    hard_count_min: int = 3
    #: Also ask each label for the mention one past the count its query states: under a count
    #: one short its last mention, under its count nothing (:func:`training.examples.query_answers`);
    #: the engine then asks it of every count (``answers_past_count`` in ``ner_model.json``).
    past_count_queries: bool = False
    #: The loss's softmax spans only the tokens of the training rows and single characters
    #: (saved as ``kept_vocabulary.json``): Gemma 3's 262k-token head is most of a step otherwise.
    kept_vocabulary: bool = False
    #: Start the LoRA from this NER model's adapter (a shipped name or a folder) instead of zeros,
    #: to train a model further: its rank and layers must be the run's (an adapter that ``low_rank``
    #: stored keeps its rank per layer, which must lie in the layers the run trains).
    init_adapter: str | None = None
    #: The longest window the model reads, in text tokens (``window_tokens`` in ``ner_model.json``;
    #: None: the engine's); document windows are cut to it.
    window_tokens: int | None = None
    #: Also train on this many windows of the training documents that are no single sentence
    #: (:mod:`training.document_windows`): texts shaped like what the engine reads from a document.
    document_windows: int = 0
    #: After training, choose each label's PaDeLLM count bias on the whole ``dev`` file
    #: (:mod:`training.count_calibration`) and write it in ``ner_model.json``.
    calibrate_counts: bool = False
    #: Whether the engine keeps a name's label throughout a text (``document_consistency`` in
    #: ``ner_model.json``); None: as the model this run trains further has it, else off.
    document_consistency: bool | None = None


@dataclass
class OpenTrainConfig(TrainConfig):
    """An open-label run (:mod:`training.open_trainer`): ``train`` is the folder of the open
    corpora (``open/``), the supervised corpora of ``supervised_shares`` lie beside it; every
    record is asked for label names of its own (:mod:`training.open_data`). ``labels`` are the
    model's default labels, answered when a caller names none."""

    labels: list[str] | None = field(default_factory=lambda: ["person", "organization", "location", "miscellaneous"])
    records: int = 60000
    temperature: float = 0.5
    supervised_shares: dict[str, float] = field(default_factory=lambda: {"conll2003/train.txt": 0.2, "resume/train.txt": 0.12})
    keep_label_min: float = 0.5
    absent_keep: float = 1.0
    negatives_max: int = 3
    description_rate: float = 0.1
    synonym_rate: float = 0.1
    variant_rate: float = 0.0
    chinese_names_rate: float = 0.3
    ar_rate: float = 0.25
    #: Texts longer than this many characters are left out (the engine reads windows of a few sentences),
    #: or, with ``cut_long_records``, cut into pieces of whole sentences of at most that many.
    max_text_chars: int = 700
    cut_long_records: bool = False
    #: The model reads each sentence as a window of its own (``sentence_windows`` in ``ner_model.json``),
    #: long ones cut at ``window_tokens``.
    sentence_windows: bool = False
    #: Minutes of training between snapshots of the trained weights (the points of a quality curve).
    snapshot_minutes: float = 30.0
    #: Whole corpora of ``open/`` never trained on: the zero-shot dev (``python -m training.open_eval --held-out``).
    held_out: list[str] = field(default_factory=lambda: list(ZERO_SHOT_CORPORA))


@dataclass
class LowRankConfig:
    """A fine-tuned model (``model``: a folder or shipped name) stored as a LoRA adapter over
    ``base``, the model its tuning started from, in at most ``max_megabytes`` (:mod:`training.low_rank`)."""

    model: str
    base: str
    output: str
    name: str = "padellm-ner"
    max_megabytes: float = 25.0
    dev: str | None = None
    eval_limit: int | None = 300
    device: str = "cpu"
    calibrate_counts: bool = False  # each label's count bias chosen on the whole dev file for its F1, as the lm trainer's
    eval_batch_size: int = 16


@dataclass
class TinyConfig:
    """A tiny-model training run: a new tokenizer and a small Llama (``layers`` decoder layers,
    ``hidden_size`` wide), fully trained for ``epochs`` (or ``max_steps`` steps, if fewer)."""

    train: str
    output: str
    name: str = "tiny-conll03"
    dev: str | None = None
    hidden_size: int = 128
    layers: int = 4
    epochs: float = 4.0
    max_steps: int | None = None
    lr: float = 3e-3
    limit: int | None = None
    eval_limit: int | None = 100
    seed: int = 0
    device: str = "cpu"


@dataclass
class DiffusionConfig:
    """A diffusion training run; saved in ``training.json`` for the model card."""

    train: str
    output: str
    name: str = "en-conll03-diffusion"
    init: str = "scratch"  # "scratch", "smollm2", or an NER model (name or folder) to adapt with LoRA
    base: str = "smollm2-135m-instruct"
    answer_tokens: int = 64
    vocab_size: int = 4096
    hidden_size: int = 256
    layers: int = 4
    heads: int = 8
    lr: float = 2e-3
    lora_r: int = 16  # adapter rank when ``init`` is an NER model
    lora_alpha: int = 32
    lora_layers: int | None = None  # adapt only the top N layers (backward stops below them); None: all
    #: a diffusion model adapted from ``init`` whose adapter this run trains further (its rank and layers)
    init_adapter: str | None = None
    mask_token: str = "<empty_output>"  # an existing token an adapted model without a mask token uses as its mask
    #: "uniform" (LLaDA: any subset of the answer masked) or "blockwise" (a clean prefix, a
    #: partly masked block of ``block_size``, the rest masked: what block-wise decoding meets)
    mask_schedule: Literal["uniform", "blockwise"] = "uniform"
    block_size: int = 8
    warmup_steps: int = 100
    batch_rows: int = 32
    max_steps: int | None = None
    max_minutes: float | None = None
    limit: int | None = None
    save_minutes: float = 10.0
    resume: bool = False
    seed: int = 0
    device: str = "cpu"


@dataclass
class LUDConfig:
    """A lexical-unit fine-tuning run (saved as ``training.json`` beside the adapter): a LoRA
    adapter on the top ``top_layers`` layers of ``model``, applied at placeholder columns only."""

    model: str
    train: str
    output: str
    name: str = "en-conll03-lud"
    formats: list[str] = field(default_factory=lambda: list(FORMATS))
    unit_size: int = 4
    placeholder: str = "<empty_output>"
    lora_r: int = 16
    lora_alpha: int = 32
    lr: float = 1e-3
    warmup_steps: int = 30
    epochs: float = 1.0
    #: Train only the top N decoder layers (None: all); the frozen layers below run once per row.
    top_layers: int | None = 15
    batch_tokens: int = 2048
    max_steps: int | None = None
    max_minutes: float | None = None
    checkpoint_minutes: float = 10.0
    limit: int | None = None
    seed: int = 0
    device: str = "cpu"
    #: "auto": float32 on the CPU, "mixed" (bfloat16 products) on one with bfloat16 instructions, bfloat16 on a GPU.
    dtype: Dtype = "auto"
    resume: bool = False
