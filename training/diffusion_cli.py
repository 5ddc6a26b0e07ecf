"""The ``padellm-ner train-diffusion`` sub-command (registered through ``COMMAND_MODULES``)."""

from __future__ import annotations

import argparse
import json

from training.configs import INITS, DiffusionConfig


def cmd_train_diffusion(args: argparse.Namespace) -> int:
    import torch

    from training.diffusion import train_diffusion

    if args.threads:
        torch.set_num_threads(args.threads)
    config = DiffusionConfig(
        train=args.train, output=args.output, name=args.name, init=args.init, base=args.base, answer_tokens=args.answer_tokens,
        vocab_size=args.vocab_size, hidden_size=args.hidden_size, layers=args.layers, heads=args.heads, lr=args.lr,
        lora_r=args.lora_r, lora_alpha=args.lora_alpha, lora_layers=args.lora_layers, init_adapter=args.init_adapter, mask_token=args.mask_token,
        mask_schedule=args.mask_schedule, block_size=args.block_size, warmup_steps=args.warmup_steps, batch_rows=args.batch_rows,
        max_steps=args.max_steps, max_minutes=args.max_minutes, limit=args.limit, save_minutes=args.save_minutes, resume=args.resume,
        seed=args.seed, device=args.device,
    )
    summary = train_diffusion(config)
    print(json.dumps({k: summary[k] for k in ("steps", "tokens", "train_seconds", "tokens_per_second")}, indent=2))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train-diffusion`` to the ``padellm-ner`` command line."""
    defaults = DiffusionConfig(train="", output="")
    parser = sub.add_parser("train-diffusion", help="train a masked-diffusion NER model (LLaDA objective) for decoder fast_dllm")
    parser.add_argument("--train", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--name", default=defaults.name)
    parser.add_argument("--init", default=defaults.init,
                        help=f"{' or '.join(INITS)} (a new small Llama, or SmolLM2-135M made bidirectional), or an NER model "
                             "(name or folder, e.g. en-conll03) adapted with a LoRA adapter")
    parser.add_argument("--base", default=defaults.base, help="the model --init smollm2 starts from")
    parser.add_argument("--answer-tokens", type=int, default=defaults.answer_tokens, help="fixed answer length (end-padded)")
    parser.add_argument("--vocab-size", type=int, default=defaults.vocab_size)
    parser.add_argument("--hidden-size", type=int, default=defaults.hidden_size)
    parser.add_argument("--layers", type=int, default=defaults.layers)
    parser.add_argument("--heads", type=int, default=defaults.heads)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--lora-r", type=int, default=defaults.lora_r, help="adapter rank (--init with an NER model)")
    parser.add_argument("--lora-alpha", type=int, default=defaults.lora_alpha)
    parser.add_argument("--lora-layers", type=int, default=None, help="adapt only the top N layers (faster: backward stops below them)")
    parser.add_argument("--init-adapter", default=None,
                        help="a diffusion model adapted from --init (e.g. en-conll03-diffusion) whose adapter this run trains further")
    parser.add_argument("--mask-token", default=defaults.mask_token, help="existing token used as the mask when adapting an NER model")
    parser.add_argument("--mask-schedule", choices=["uniform", "blockwise"], default=defaults.mask_schedule,
                        help="uniform: LLaDA's (any subset masked); blockwise: a clean prefix, a partly masked block, the rest masked")
    parser.add_argument("--block-size", type=int, default=defaults.block_size, help="the block of --mask-schedule blockwise")
    parser.add_argument("--warmup-steps", type=int, default=defaults.warmup_steps)
    parser.add_argument("--batch-rows", type=int, default=defaults.batch_rows)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--max-minutes", type=float, default=None, help="stop after this wall time (the schedule follows it)")
    parser.add_argument("--limit", type=int, default=None, help="use the first N training texts")
    parser.add_argument("--save-minutes", type=float, default=defaults.save_minutes,
                        help="a checkpoint (for --resume) and a snapshot (snapshots/minute-N) every this many minutes")
    parser.add_argument("--resume", action="store_true", help="continue the run in --output from its last checkpoint")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--device", default=defaults.device)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: one per core)")
    parser.set_defaults(func=cmd_train_diffusion, under_jemalloc=True)
