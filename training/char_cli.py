"""The ``padellm-ner train-char`` sub-command (registered through ``COMMAND_MODULES``)."""

from __future__ import annotations

import argparse
import json


def cmd_train_char(args: argparse.Namespace) -> int:
    import torch

    from training.char_model import CharConfig, train_char_model

    torch.set_num_threads(args.threads)
    summary = train_char_model(CharConfig(
        train=args.train, output=args.output, name=args.name, dev=args.dev, language=args.language, chinese_labels=args.chinese_labels,
        init=args.init, epochs=args.epochs, max_steps=args.max_steps, max_minutes=args.max_minutes, lr=args.lr,
        batch_tokens=args.batch_tokens, eval_limit=args.eval_limit, limit=args.limit, seed=args.seed, device=args.device,
    ))
    print(json.dumps({k: summary[k] for k in ("steps", "tokens", "train_seconds", "tokens_per_second", "characters_added", "history")}, indent=2))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train-char`` to the ``padellm-ner`` command line."""
    parser = sub.add_parser("train-char", help="train a character-level Llama from scratch (the Chinese base) in both formats")
    parser.add_argument("--train", required=True)
    parser.add_argument("--dev", default=None)
    parser.add_argument("--output", required=True)
    parser.add_argument("--name", required=True, help="model name written to ner_model.json")
    parser.add_argument("--language", default="zh")
    parser.add_argument("--chinese-labels", action="store_true", help="write labels in Chinese in the prompts (NAME -> 人名)")
    parser.add_argument("--init", default=None, help="continue training this char model folder instead of a random one")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--max-minutes", type=float, default=None, help="stop after this many minutes of training steps")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--eval-limit", type=int, default=200, help="dev texts scored after each epoch")
    parser.add_argument("--limit", type=int, default=None, help="use the first N training texts")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=cmd_train_char)
