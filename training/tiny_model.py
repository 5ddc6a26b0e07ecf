"""A tiny Llama trained from scratch in minutes on the CPU: a real model for fast tests.

Byte-level BPE tokenizer trained on the corpus and the prompt strings, a small Llama, full
fine-tuning in the same trainer as the shipped model. It must find entities (the tests that
compare the engine with the API, spaCy or the pipeline compare its entities), so it is trained
for whole epochs rather than a handful of steps.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from corpora import labels_of, read_corpus
from ner_service.engine import prompts
from training.configs import TinyConfig, TrainConfig
from training.trainer import train

EOS = "<eos>"


def build_tokenizer(texts: list[str], labels: list[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer for ``texts`` and the PaDeLLM prompt strings."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    extra = [prompts.prefix(""), prompts.ar_query()] + [prompts.mention_query(label, 1, 1) for label in labels]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts + extra * 50, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=EOS)


def train_tiny_model(config: TinyConfig) -> dict:
    """Build the tokenizer and a randomly initialised tiny Llama, then train it (full)."""
    examples = read_corpus(config.train)[: config.limit]
    labels = labels_of(examples)
    tokenizer = build_tokenizer([e.text for e in examples], labels)
    init = Path(config.output) / "init"
    llama = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=config.hidden_size, intermediate_size=3 * config.hidden_size,
        num_hidden_layers=config.layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    LlamaForCausalLM(llama).save_pretrained(init)
    tokenizer.save_pretrained(init)
    summary = train(TrainConfig(
        base=str(init), train=config.train, dev=config.dev, output=config.output, name=config.name, full=True, lr=config.lr,
        warmup_steps=20, epochs=config.epochs, max_steps=config.max_steps, batch_tokens=4096, limit=config.limit, eval_limit=config.eval_limit,
        seed=config.seed, device=config.device, dtype="float32",
    ))
    shutil.rmtree(init)
    shutil.rmtree(Path(config.output) / "checkpoint", ignore_errors=True)
    return summary
