"""A masked-diffusion NER model in the LLaDA style, trained from scratch or from SmolLM2.

One row per text: the prompt is the text and the all-entities query
(:func:`prompts.prefix` + :func:`prompts.ar_query`), the answer is every mention in reading
order as ``"\\nLABEL: mention"`` lines (:func:`prompts.ar_answer`), closed and padded with
the end token to a fixed length. One answer for all labels (rather than one query per
label as PaDeLLM does) keeps one row per text, so the prompt is encoded once instead of
once per label, at training and at inference, and the answer is long enough for
block-wise decoding to matter.

The objective (LLaDA SFT): per row draw a mask ratio ``t ~ U(eps, 1)``, replace each answer
token by the mask token with probability ``t``, and take the cross-entropy on the masked
tokens weighted by ``1 / t`` and averaged over the answer length. Attention is
bidirectional (:func:`general_decoding.diffusion.layout.bidirectional_mask`).

Three starting points (``init``): a small Llama from scratch, SmolLM2-135M made
bidirectional, or a trained NER model (``en-conll03``): the AR-to-diffusion adaptation of
Dream and DiffuLLaMA, which keeps the model's next-token head (column ``i - 1`` predicts the
token at ``i``, ``shift``) and trains a LoRA adapter stacked on the model, with one of its
unused special tokens as the mask, so that it saves as a small adapter. The adapted model
keeps its prompt causal (``causal_prompt``): only the answer attends bidirectionally, so the
prompt is read exactly as the model learnt to read it.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from general_decoding.base import left_pad
from general_decoding.diffusion.layout import bidirectional_mask, causal_prompt_mask
from ner_service.engine import NERModelConfig, prompts
from ner_service.engine.model_loading import load_causal_lm, own_tokenizer
from ner_service.engine.ner_model import NERModel
from corpora import Example, labels_of, read_corpus
from training.configs import INITS, DiffusionConfig
from training.tiny_model import build_tokenizer
from training.checkpoints import CheckpointClock, load_checkpoint, save_checkpoint
from training.loss import optimizer_step
from training.trainer import AdapterShape, continued_adapter, save_adapter

MASK = "<mask>"
EPS = 1e-3
#: the linear layers of a Llama-style decoder layer that an adapter adapts
LINEAR_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class DiffusionRow:
    """Prompt tokens and the answer tokens, end-padded to the fixed answer length."""

    prompt: list[int]
    answer: list[int]


def answer_text(example: Example, labels: list[str]) -> list[str]:
    """The answer lines of ``example`` (reading order, only ``labels``)."""
    return [prompts.ar_answer([(s.label, example.text[s.start:s.end])]) for s in example.spans if s.label in labels]


def build_row(example: Example, labels: list[str], tokenizer: PreTrainedTokenizerBase, answer_tokens: int) -> DiffusionRow:
    """Tokenise prompt and answer separately; whole lines that do not fit are dropped."""
    prompt = tokenizer(prompts.prefix(example.text)).input_ids + tokenizer(prompts.ar_query(), add_special_tokens=False).input_ids
    answer: list[int] = []
    for line in answer_text(example, labels):
        ids = tokenizer(line, add_special_tokens=False).input_ids
        if len(answer) + len(ids) >= answer_tokens:  # room for at least one end token
            break
        answer.extend(ids)
    eos = int(tokenizer.eos_token_id)
    return DiffusionRow(prompt, answer + [eos] * (answer_tokens - len(answer)))


@dataclass(frozen=True)
class Noise:
    """Which answer tokens a training row feeds as the mask token, and the loss weight of each
    (zero where a token is not a target)."""

    masked: torch.Tensor  # [batch, length] bool
    weights: torch.Tensor  # [batch, length] float


def uniform_noise(lengths: torch.Size, generator: torch.Generator) -> Noise:
    """LLaDA's schedule: per row a ratio ``t ~ U(eps, 1)``, each answer token masked with
    probability ``t`` and weighted ``1 / t`` (averaged over the answer length)."""
    batch, length = lengths
    t = (1 - EPS) * torch.rand(batch, 1, generator=generator) + EPS
    masked = torch.rand(batch, length, generator=generator) < t
    return Noise(masked, masked / (t * batch * length))


def blockwise_noise(answers: torch.Tensor, eos_id: int, block_size: int, generator: torch.Generator) -> Noise:
    """The states block-wise decoding meets: per row a block start ``c`` (up to the first end
    token), the tokens before it clean, each token of ``[c, c + block_size)`` masked with
    probability ``t ~ U(eps, 1)`` (``c`` itself always), every token after the block masked.
    Only the block's masked tokens are targets, equally weighted: the sampler never commits a
    token outside its block, so predicting those is not what it needs of the model."""
    batch, length = answers.shape
    columns = torch.arange(length)
    first_end = torch.where(answers == eos_id, columns, length).min(-1).values
    start = (torch.rand(batch, generator=generator) * (first_end.clamp(max=length - 1) + 1)).long()[:, None]
    t = (1 - EPS) * torch.rand(batch, 1, generator=generator) + EPS
    in_block = (columns >= start) & (columns < start + block_size)
    targets = in_block & ((torch.rand(batch, length, generator=generator) < t) | (columns == start))
    masked = targets | (columns >= start + block_size)
    return Noise(masked, targets / targets.sum())


def diffusion_loss(model: PreTrainedModel, rows: list[DiffusionRow], noise: Noise, mask_id: int, pad_id: int,
                   shift: bool = False, causal_prompt: bool = False) -> torch.Tensor:
    """The weighted cross-entropy of the masked answer tokens that ``noise`` makes targets (with
    ``shift``, each answer token is predicted from the column before it; with ``causal_prompt``,
    only the answer attends bidirectionally)."""
    ids, attention = left_pad([r.prompt for r in rows], pad_id)
    answer_start = ids.shape[1]
    answers = torch.tensor([r.answer for r in rows])
    length = answers.shape[1]
    noisy = torch.where(noise.masked, torch.full_like(answers, mask_id), answers)
    ids = torch.cat([ids, noisy], dim=1)
    attention = torch.cat([attention, torch.ones_like(answers)], dim=1)
    device = model.device
    dtype = next(model.parameters()).dtype
    hidden = model.get_decoder()(
        input_ids=ids.to(device),
        attention_mask=(causal_prompt_mask(attention, dtype, answer_start) if causal_prompt else bidirectional_mask(attention, dtype)).to(device),
        position_ids=(attention.cumsum(-1) - 1).clamp(min=0).to(device),
    ).last_hidden_state[:, ids.shape[1] - length - int(shift):ids.shape[1] - int(shift)]
    targets = (noise.weights > 0).to(device)
    logits = model.get_output_embeddings()(hidden[targets]).float()
    losses = torch.nn.functional.cross_entropy(logits, answers.to(device)[targets], reduction="none")
    return (losses * noise.weights.to(device)[targets]).sum()


@dataclass
class _Start:
    """The model to train and how: ``adapted_from`` names the NER model a LoRA adapter is stacked on."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    adapted_from: NERModelConfig | None = None
    shift: bool = False
    causal_prompt: bool = False


def _init_model(config: DiffusionConfig, examples: list[Example], labels: list[str]) -> _Start:
    """A from-scratch Llama with its own BPE tokenizer, SmolLM2 (attention made bidirectional by
    the mask), or an NER model with a LoRA adapter to train (:func:`_adapt`)."""
    if config.init not in INITS:
        return _adapt(config)
    if config.init == "smollm2":
        model, tokenizer = load_causal_lm(config.base)
        if tokenizer.mask_token is None:
            tokenizer = own_tokenizer(tokenizer)  # the base's other models keep their vocabulary
            tokenizer.add_special_tokens({"mask_token": MASK})
            model.resize_token_embeddings(len(tokenizer))
    else:
        tokenizer = build_tokenizer([e.text for e in examples], labels, vocab_size=config.vocab_size)
        tokenizer.add_special_tokens({"mask_token": MASK})
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=config.hidden_size, intermediate_size=3 * config.hidden_size,
            num_hidden_layers=config.layers, num_attention_heads=config.heads, num_key_value_heads=config.heads // 2,
            max_position_embeddings=1024, tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.eos_token_id, bos_token_id=None,
        ))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return _Start(model.float().train(), tokenizer)


def _adapt(config: DiffusionConfig) -> _Start:
    """The NER model ``init`` (merged) under a fresh LoRA adapter; its mask is its own mask token,
    else the existing token ``mask_token`` (an unused special token of SmolLM2 by default), so the
    vocabulary (and the base's embeddings) stay as they are. An autoregressive model keeps its
    next-token head (``shift``)."""
    from peft import LoraConfig, get_peft_model

    ner = NERModel.load(config.init)
    tokenizer = ner.tokenizer
    if tokenizer.mask_token is None:
        if tokenizer.convert_tokens_to_ids(config.mask_token) in (None, tokenizer.unk_token_id):
            raise ValueError(f"model {config.init!r} has no mask token and no {config.mask_token!r} token to use as one (--mask-token)")
        tokenizer.mask_token = config.mask_token
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    adapted = ner.config.mask_token is None  # an autoregressive model, not a diffusion model to continue
    shift = True if adapted else ner.config.diffusion_shift
    causal_prompt = True if adapted else ner.config.diffusion_causal_prompt
    layers = ner.model.config.num_hidden_layers
    top = None if config.lora_layers is None else list(range(max(0, layers - config.lora_layers), layers))
    if config.init_adapter:
        model = continued_adapter(ner.model.float(), config.init_adapter,
                                  AdapterShape(config.init, config.lora_r, config.lora_alpha, top))
    else:
        lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, target_modules=LINEAR_MODULES, layers_to_transform=top,
                          task_type="CAUSAL_LM")
        model = get_peft_model(ner.model.float(), lora)
    return _Start(model.train(), tokenizer, ner.config, shift, causal_prompt)


def save_diffusion_model(start: _Start, config: DiffusionConfig, labels: list[str], folder: Path, summary: dict) -> None:
    """A Hugging Face folder with ``ner_model.json`` (``max_ar_tokens`` = answer length): the whole
    model with its tokenizer, or an adapter (float16) stacked on the NER model it adapted."""
    start.model.eval()
    inner = start.adapted_from
    if inner is None:
        start.model.save_pretrained(folder)
        start.tokenizer.save_pretrained(folder)
    else:
        save_adapter(start.model, config.init, folder)
    diffusion = {"name": config.name, "max_ar_tokens": config.answer_tokens, "eos_token": start.tokenizer.eos_token,
                 "mask_token": start.tokenizer.mask_token, "diffusion_shift": start.shift, "diffusion_causal_prompt": start.causal_prompt,
                 "metrics": {"decoder": "fast_dllm"}}
    if inner is None:
        NERModelConfig(labels=labels, **diffusion).write(folder)
    else:  # the windows, label names and language of the model it adapted
        replace(inner, base=config.init, lud_placeholder=None, lud_unit_size=None, **diffusion).write(folder)
    (folder / "training.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    start.model.train()


def train_diffusion(config: DiffusionConfig) -> dict:
    """Train until ``max_steps`` or ``max_minutes`` (cosine schedule over whichever ends first) and
    save; every ``save_minutes`` a checkpoint that ``resume`` continues exactly, and a loadable
    snapshot in ``snapshots/minute-N`` (the model's curve)."""
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    examples = read_corpus(config.train)[: config.limit]
    labels = labels_of(examples)
    start = _init_model(config, examples, labels)
    start.model.to(config.device)
    model, tokenizer = start.model, start.tokenizer
    if start.adapted_from is not None:
        labels = start.adapted_from.labels or labels
    rows = [build_row(e, labels, tokenizer, config.answer_tokens) for e in tqdm(examples, desc="build rows", unit="text")]
    mask_id, pad_id, eos_id = int(tokenizer.mask_token_id), int(tokenizer.pad_token_id), int(tokenizer.eos_token_id)
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=config.lr, weight_decay=0.01, betas=(0.9, 0.98))
    budget = config.max_minutes * 60 if config.max_minutes else math.inf
    max_steps = config.max_steps or 10**9
    output = Path(config.output)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].prompt))  # similar prompt lengths share a batch
    run = _RunState(batches=[order[i:i + config.batch_rows] for i in range(0, len(order), config.batch_rows)])
    random.shuffle(run.batches)
    if config.resume and (saved := load_checkpoint(output / "checkpoint", model, optimizer, None)) is not None:
        run = _RunState(**saved["run"])
        generator.set_state(saved["generator"])
    clock = CheckpointClock(config.save_minutes)
    began = time.perf_counter() - run.seconds

    def progress(step: int) -> float:
        return min(1.0, max(step / max_steps, (time.perf_counter() - began) / budget))

    def learning_rate(step: int) -> float:
        if step < config.warmup_steps:
            return config.lr * (step + 1) / config.warmup_steps
        return config.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress(step))))

    bar = tqdm(total=100, initial=round(100 * progress(run.step), 1), desc="train-diffusion", unit="%",
               bar_format="{l_bar}{bar}| {n:.1f}/{total}% [{elapsed}<{remaining}{postfix}]")  # steps or minutes, whichever ends first
    while progress(run.step) < 1.0:
        batch = [rows[i] for i in run.batches[run.position]]
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(run.step)
        answers = torch.tensor([r.answer for r in batch])
        noise = (blockwise_noise(answers, eos_id, config.block_size, generator) if config.mask_schedule == "blockwise"
                 else uniform_noise(answers.shape, generator))
        loss = diffusion_loss(model, batch, noise, mask_id, pad_id, start.shift, start.causal_prompt)
        optimizer_step(loss, parameters, optimizer)
        run.step += 1
        run.tokens += sum(len(r.prompt) + config.answer_tokens for r in batch)
        run.position += 1
        if run.position == len(run.batches):
            run.position = 0
            random.shuffle(run.batches)
        run.seconds = time.perf_counter() - began
        bar.update(round(100 * progress(run.step), 1) - bar.n)
        bar.set_postfix(step=run.step, loss=f"{loss.item():.4f}", tok_s=f"{run.tokens / run.seconds:.0f}")
        if run.step % 50 == 0:
            run.history.append({"step": run.step, "loss": round(loss.item(), 4), "minutes": round(run.seconds / 60, 2)})
        if clock.due() and progress(run.step) < 1.0:
            save_checkpoint(output / "checkpoint", model, optimizer, None, {"run": asdict(run), "generator": generator.get_state()})
            save_diffusion_model(start, config, labels, output / "snapshots" / f"minute-{round(run.seconds / 60)}", _summary(config, run))
            clock.reset()
    bar.close()
    summary = _summary(config, run)
    save_diffusion_model(start, config, labels, output, summary)
    shutil.rmtree(output / "checkpoint", ignore_errors=True)
    return summary


@dataclass
class _RunState:
    """Where a run stands: what a checkpoint keeps besides the weights and the optimizer."""

    batches: list[list[int]]
    position: int = 0
    step: int = 0
    tokens: int = 0
    seconds: float = 0.0
    history: list[dict] = field(default_factory=list)


def _summary(config: DiffusionConfig, run: _RunState) -> dict:
    return {"config": asdict(config), "steps": run.step, "tokens": run.tokens, "train_seconds": round(run.seconds, 1),
            "tokens_per_second": round(run.tokens / max(run.seconds, 1e-9), 1), "threads": torch.get_num_threads(),
            "history": run.history}
