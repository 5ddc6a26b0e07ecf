"""The ``padellm-ner train-lud`` sub-command (registered through ``COMMAND_MODULES``)."""

from __future__ import annotations

import argparse
import json

from training.configs import DTYPE_CHOICES, LUDConfig


def cmd_train_lud(args: argparse.Namespace) -> int:
    import torch

    from training.lexical_units import train_lud

    if args.threads:
        torch.set_num_threads(args.threads)
    config = LUDConfig(
        model=args.model, train=args.train, output=args.output, name=args.name, formats=args.formats.split(","),
        unit_size=args.unit_size, placeholder=args.placeholder, lora_r=args.lora_r, lora_alpha=args.lora_alpha, lr=args.lr,
        warmup_steps=args.warmup_steps, epochs=args.epochs, top_layers=args.top_layers, batch_tokens=args.batch_tokens,
        max_steps=args.max_steps, max_minutes=args.max_minutes, checkpoint_minutes=args.checkpoint_minutes, limit=args.limit,
        seed=args.seed, device=args.device, dtype=args.dtype, resume=args.resume,
    )
    summary = train_lud(config)
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=2))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train-lud`` to the ``padellm-ner`` command line."""
    defaults = LUDConfig(model="", train="", output="")
    parser = sub.add_parser("train-lud", help="fine-tune an NER model for lexical-unit decoding (--decoder lud)")
    parser.add_argument("--model", default="en-conll03", help="the NER model to fine-tune (name or folder)")
    parser.add_argument("--train", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--name", default=defaults.name)
    parser.add_argument("--formats", default=",".join(defaults.formats))
    parser.add_argument("--unit-size", type=int, default=defaults.unit_size, help="longest unit, in tokens")
    parser.add_argument("--placeholder", default=defaults.placeholder, help="an existing vocabulary token used as placeholder")
    parser.add_argument("--lora-r", type=int, default=defaults.lora_r)
    parser.add_argument("--lora-alpha", type=int, default=defaults.lora_alpha)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--warmup-steps", type=int, default=defaults.warmup_steps)
    parser.add_argument("--epochs", type=float, default=defaults.epochs)
    parser.add_argument("--top-layers", type=int, default=defaults.top_layers,
                        help="train the top N layers (the frozen layers below run once per row)")
    parser.add_argument("--batch-tokens", type=int, default=defaults.batch_tokens)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--max-minutes", type=float, default=None)
    parser.add_argument("--limit", type=int, default=None, help="use the first N training texts")
    parser.add_argument("--checkpoint-minutes", type=float, default=defaults.checkpoint_minutes)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--dtype", default=defaults.dtype, choices=DTYPE_CHOICES,
                        help="auto: mixed (bfloat16 products) on a CPU with bfloat16 instructions, float32 on other CPUs, bfloat16 on a GPU")
    parser.add_argument("--resume", action="store_true", help="continue the run in --output from its last checkpoint, exactly")
    parser.add_argument("--device", default=defaults.device)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.set_defaults(func=cmd_train_lud, under_jemalloc=True)
