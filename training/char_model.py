"""A character-level Llama trained from scratch: the small base for Chinese NER on a CPU.

One token per character (vocabulary: the training texts, the prompt strings, printable
ASCII, an unknown and an end token), so ``decode(encode(text)) == text`` for every known
character and a generated mention maps back to exact character offsets. A 4-layer,
256-wide Llama is trained in full by :mod:`training.trainer` in both formats (PaDeLLM and
AR) and saved in bfloat16.
"""

from __future__ import annotations

import shutil
import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from ner_service.engine import prompts
from ner_service.engine.ner_model import NERModelConfig, resolve_ner_model
from corpora import labels_of, read_corpus
from training.configs import CharConfig, TrainConfig
from training.trainer import train

EOS = "<eos>"
UNK = "<unk>"
#: Decoding limits in characters (= tokens): Resume has ORG mentions of 60+ characters and
#: AR answers of 300+ characters.
MAX_MENTION_CHARS = 48
MAX_AR_CHARS = 320

#: Chinese display names of the Resume and Weibo labels, for prompts in Chinese.
CHINESE_LABEL_NAMES: dict[str, str] = {
    "NAME": "人名", "ORG": "机构", "TITLE": "职位", "EDU": "学历", "CONT": "国籍", "PRO": "专业", "RACE": "民族", "LOC": "地名",
    "PER.NAM": "人名", "PER.NOM": "人称", "ORG.NAM": "机构名", "ORG.NOM": "机构称", "LOC.NAM": "地名", "LOC.NOM": "地点称",
    "GPE.NAM": "行政区", "GPE.NOM": "行政称",
}


def prompt_strings(names: list[str]) -> list[str]:
    """Every fixed string the prompts can contain for these label display names."""
    strings = [prompts.prefix(""), prompts.ar_query(), string.printable]
    for name in names:
        strings += [prompts.count_query(name), prompts.mention_query(name, 10, 10), prompts.ar_answer([(name, "")])]
    return strings


def build_char_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """A tokenizer with one token per character of ``texts``; other characters become ``<unk>``."""
    characters = sorted({char for text in texts for char in text})
    return _char_tokenizer({EOS: 0, UNK: 1} | {char: i + 2 for i, char in enumerate(characters)})


def extend_char_vocabulary(folder: Path, texts: list[str]) -> int:
    """Give the char model in ``folder`` a token for every character of ``texts`` it lacks:
    new ids after the known ones, each with a new embedding row drawn around the mean of the
    known rows (``mean_resizing``: a new character starts as an average one). Saves the model in
    float32 and the tokenizer back to ``folder``; returns how many characters were added."""
    vocab = PreTrainedTokenizerFast.from_pretrained(folder).get_vocab()
    missing = sorted({char for text in texts for char in text} - set(vocab))
    if not missing:
        return 0
    extended = vocab | {char: len(vocab) + i for i, char in enumerate(missing)}
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.resize_token_embeddings(len(extended), mean_resizing=True)
    model.save_pretrained(folder)
    _char_tokenizer(extended).save_pretrained(folder)
    return len(missing)


def _char_tokenizer(vocab: dict[str, int]) -> PreTrainedTokenizerFast:
    """One token per character of ``vocab`` (ids as given), unknown ones ``<unk>``."""
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOS, pad_token=EOS, unk_token=UNK, clean_up_tokenization_spaces=False
    )


def char_llama_config(vocab_size: int, eos_token_id: int, layers: int = 4, hidden: int = 256) -> LlamaConfig:
    """The small Llama: ``layers`` blocks of width ``hidden``, tied embeddings."""
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, max_position_embeddings=1024,
        tie_word_embeddings=True, eos_token_id=eos_token_id, pad_token_id=eos_token_id, bos_token_id=None,
    )


def train_char_model(config: CharConfig) -> dict:
    """Build the character tokenizer and a random small Llama (or continue ``config.init``), train
    it in full, save it in bf16. Returns the trainer's summary and ``characters_added``."""
    torch.manual_seed(config.seed)
    examples = read_corpus(config.train)[: config.limit]
    labels = labels_of(examples)
    label_names = {label: CHINESE_LABEL_NAMES[label] for label in labels} if config.chinese_labels else {}
    names = [label_names.get(label, label) for label in labels]
    output = Path(config.output)
    start = output / "init"
    added = 0
    if config.init is None:
        tokenizer = build_char_tokenizer([e.text for e in examples] + prompt_strings(names))
        LlamaForCausalLM(char_llama_config(len(tokenizer), tokenizer.eos_token_id)).save_pretrained(start)
        tokenizer.save_pretrained(start)
    else:
        shutil.copytree(resolve_ner_model(config.init), start, dirs_exist_ok=True)
        added = extend_char_vocabulary(start, [e.text for e in examples] + prompt_strings(names))
    summary = train(TrainConfig(
        base=str(start), train=config.train, dev=config.dev, output=config.output, name=config.name, labels=labels,
        label_names=label_names, language=config.language, full=True, lr=config.lr, warmup_steps=30, epochs=config.epochs,
        max_steps=config.max_steps, max_minutes=config.max_minutes, batch_tokens=config.batch_tokens, limit=config.limit,
        eval_limit=config.eval_limit, seed=config.seed, device=config.device, dtype="float32",
    ))
    shutil.rmtree(start)
    shutil.rmtree(output / "checkpoint", ignore_errors=True)
    model = LlamaForCausalLM.from_pretrained(output, dtype=torch.float32)
    model.to(torch.bfloat16).save_pretrained(output)
    ner_config = NERModelConfig.read(output)
    ner_config.max_mention_tokens, ner_config.max_ar_tokens = MAX_MENTION_CHARS, MAX_AR_CHARS
    ner_config.write(output)
    return summary | {"characters_added": added}

