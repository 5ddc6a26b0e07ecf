"""The ``padellm-ner train``, ``train-tiny`` and ``recipes`` sub-commands (registered through
``COMMAND_MODULES``): ``train --recipe NAME`` runs a recipe of ``training/recipes/``; without
one, ``train`` fine-tunes a causal LM with the settings given as flags."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from training.configs import DTYPE_CHOICES

#: Where ``--data`` points unless given: ``PADELLM_DATA``, else the shared data folder.
DEFAULT_DATA = os.environ.get("PADELLM_DATA", "../shared/data")
#: The flags that configure a run without a recipe (a recipe file holds these settings).
EXPLICIT_FLAGS = ("train", "dev", "name", "language", "labels", "formats", "full", "lora_r", "lora_alpha", "lr", "epochs",
                  "max_minutes", "batch_tokens", "eval_batch_size", "seed", "dtype", "base", "top_layers",
                  "kept_vocabulary", "init_adapter", "calibrate_counts")


def cmd_train(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.recipe:
        return _train_recipe(args, parser)
    if not args.train or not args.output:
        parser.error("give --recipe NAME, or --train and --output")
    from training.trainer import TrainConfig, train

    labels = [label.strip() for label in args.labels.split(",") if label.strip()] if args.labels else None
    config = TrainConfig(
        base=args.base, train=args.train, dev=args.dev, output=args.output, name=args.name, language=args.language,
        labels=labels, formats=args.formats.split(","), full=args.full, lora_r=args.lora_r, lora_alpha=args.lora_alpha, lr=args.lr,
        epochs=args.epochs, max_steps=args.max_steps, max_minutes=args.max_minutes, batch_tokens=args.batch_tokens, limit=args.limit,
        eval_batch_size=args.eval_batch_size, seed=args.seed, device=args.device or "cpu", dtype=args.dtype,
        top_layers=args.top_layers, kept_vocabulary=args.kept_vocabulary, checkpoint_minutes=args.checkpoint_minutes, resume=args.resume,
        init_adapter=args.init_adapter, calibrate_counts=args.calibrate_counts,
        **({} if args.eval_limit is None else {"eval_limit": args.eval_limit}),
    )
    summary = train(config)
    print(json.dumps({k: summary[k] for k in ("steps", "tokens", "train_seconds", "tokens_per_second", "history")}, indent=2))
    return 0


def _train_recipe(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from training.recipes import RecipeRun, load_recipe, run_recipe

    given = [f"--{flag.replace('_', '-')}" for flag in EXPLICIT_FLAGS if getattr(args, flag) != parser.get_default(flag)]
    if given:
        parser.error(f"{', '.join(given)} cannot be combined with --recipe: the recipe file holds every setting")
    recipe = load_recipe(args.recipe)
    run = RecipeRun(data=Path(args.data), output=Path(args.output or f"runs/{recipe.name}"), device=args.device,
                    limit=args.limit, max_steps=args.max_steps, eval_limit=args.eval_limit, resume=args.resume)

    def announce(index: int, config: object) -> None:
        print(f"recipe {recipe.name}: stage {index}/{len(recipe.stages)} -> {config.output}", flush=True)

    results = run_recipe(recipe, run, on_stage=announce)
    print(json.dumps([{"output": str(r.output), **{k: r.summary.get(k) for k in ("steps", "train_seconds", "tokens_per_second")}}
                      for r in results], indent=2))
    return 0


def cmd_train_tiny(args: argparse.Namespace) -> int:
    from training.tiny_model import TinyConfig, train_tiny_model

    summary = train_tiny_model(TinyConfig(train=args.train, output=args.output, dev=args.dev, epochs=args.epochs,
                                          max_steps=args.max_steps, seed=args.seed))
    print(json.dumps(summary["history"], indent=2))
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    from training.recipes import load_recipe, recipe_names

    for name in recipe_names():
        recipe = load_recipe(name)
        stages = " -> ".join(stage.trainer for stage in recipe.stages)
        print(f"{name:<22} {recipe.device:<5} {stages:<16} {recipe.description}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train``, ``train-tiny`` and ``recipes`` to the ``padellm-ner`` command line."""
    import textwrap

    # the data formats of --train/--dev, shown at the end of `padellm-ner train --help`
    epilog = textwrap.dedent("""\
    data formats (--train, --dev):
      JSONL (a .jsonl or .json file): one object per line, "entities" optional; start and
      end are character offsets into "text", end exclusive (text[start:end] is the mention);
      entities may not overlap or nest, nor start or end with whitespace:
        {"text": "40 mg aspirin", "entities": [{"start": 0, "end": 5, "label": "DOSE"}, {"start": 6, "end": 13, "label": "DRUG"}]}

      CoNLL column file (any other name): one token per line, the tag in the last column
      (other columns are ignored), a blank line between sentences, -DOCSTART- lines skipped;
      IOB1, BIO and BMES tags are detected (O, or B-, I-, M-, E-, S- and the label); tokens
      are joined by a space (by nothing for Chinese characters):
        Merkel NNP B-NP B-PER

      A file that cannot be read, or labels that do not match --labels, stop the run before
      it trains, naming the file (and line) and what is wrong.

    examples:
      padellm-ner train --train my.jsonl --dev my-dev.jsonl --output runs/mine
      padellm-ner train --train my.jsonl --labels DOSE,DRUG --output runs/mine --base HF_FOLDER --full
      padellm-ner train --recipe en-conll03          # the shipped English model, on the CPU
      padellm-ner train --recipe open --resume       # the open-label model, continued where it stopped
    """)
    trainer = sub.add_parser("train", help="train a model from a recipe (--recipe NAME), or fine-tune a causal LM for PaDeLLM-NER "
                                           "and the AR baseline with the settings given as flags",
                             description="Train a model from a recipe (--recipe NAME), or fine-tune a causal LM for\n"
                                         "PaDeLLM-NER and the AR baseline on your own data (--train FILE --output FOLDER).",
                             formatter_class=argparse.RawDescriptionHelpFormatter, epilog=epilog)
    trainer.add_argument("--recipe", default=None, help="a recipe name (padellm-ner recipes) or a .toml file")
    trainer.add_argument("--data", default=DEFAULT_DATA, help="the folder holding the corpora a recipe names (default: %(default)s)")
    trainer.add_argument("--output", default=None, help="the model folder to write (with --recipe: runs/NAME)")
    trainer.add_argument("--device", default=None, help="cpu or cuda (with --recipe: the recipe's device)")
    trainer.add_argument("--limit", type=int, default=None, help="use the first N training texts (with --recipe: in every stage)")
    trainer.add_argument("--max-steps", type=int, default=None)
    trainer.add_argument("--base", default="smollm2-135m-instruct",
                         help="base model: smollm2-135m-instruct (English), gemma3-270m (140 languages), a .gguf, a HF folder, or an NER model to continue")
    trainer.add_argument("--train", default=None, metavar="FILE",
                         help="the training data: JSONL (.jsonl/.json) or a CoNLL column file (any other name); see 'data formats' below")
    trainer.add_argument("--dev", default=None, metavar="FILE",
                         help="dev data in the same formats, scored after each epoch (the first --eval-limit texts)")
    trainer.add_argument("--name", default="padellm-ner")
    trainer.add_argument("--language", default="en")
    trainer.add_argument("--labels", default=None, metavar="A,B,...",
                         help="comma-separated labels to train (default: every label in the training data); a label of the "
                              "data missing here is an error, a label here missing from the data a warning")
    trainer.add_argument("--formats", default="padellm,ar", metavar="F,...",
                         help="comma-separated training formats: padellm (a count and one query per mention, per label) "
                              "and/or ar (all mentions in one answer, the baseline) (default: %(default)s)")
    trainer.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    trainer.add_argument("--lora-r", type=int, default=16)
    trainer.add_argument("--lora-alpha", type=int, default=32)
    trainer.add_argument("--lr", type=float, default=8e-4)
    trainer.add_argument("--epochs", type=float, default=1.0)
    trainer.add_argument("--max-minutes", type=float, default=None, help="the whole run's minutes, dev scoring and count calibration included: their time, "
                              "measured on a few dev texts first, is kept from training, and a dev set too big for a quarter of the "
                              "minutes is cut to what fits; the learning rate's cosine ends with the training minutes")
    trainer.add_argument("--batch-tokens", type=int, default=2048)
    trainer.add_argument("--eval-limit", type=int, default=None,
                         help="dev texts scored after each epoch (default: 200); with --recipe, every stage's "
                              "(0: no dev scores, as in a smoke run)")
    trainer.add_argument("--eval-batch-size", type=int, default=16)
    trainer.add_argument("--seed", type=int, default=0)
    trainer.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                         help="mixed: float32 weights, bfloat16 matrix products; auto: mixed on a CPU with bfloat16 instructions "
                              "(AVX512_BF16, AMX), float32 on other CPUs (bfloat16 runs ~25x slower there), bfloat16 on a GPU")
    trainer.add_argument("--top-layers", type=int, default=None,
                         help="train only the top N layers; the frozen layers below run once per text (default: all layers)")
    trainer.add_argument("--kept-vocabulary", action="store_true",
                         help="take the loss's softmax over the training rows' tokens and every single character only "
                              "(a large-vocabulary base such as gemma3-270m trains 1.7x faster); the model computes only their logits")
    trainer.add_argument("--init-adapter", default=None, metavar="MODEL",
                         help="start the LoRA from this NER model's adapter (shipped name or folder) to train it further; "
                              "--lora-r and --top-layers must match it")
    trainer.add_argument("--calibrate-counts", action="store_true",
                         help="after training, choose each label's PaDeLLM count bias on the whole --dev file (raises recall "
                              "where the model counts too few mentions)")
    trainer.add_argument("--checkpoint-minutes", type=float, default=10.0, help="minutes between checkpoints (default: %(default)s)")
    trainer.add_argument("--resume", action="store_true", help="continue the run in --output from its last checkpoint, exactly")
    trainer.set_defaults(func=lambda args: cmd_train(args, trainer), under_jemalloc=True)  # training.allocator

    tiny = sub.add_parser("train-tiny", help="train the tiny from-scratch Llama used by fast tests")
    tiny.add_argument("--train", required=True)
    tiny.add_argument("--dev", default=None)
    tiny.add_argument("--output", required=True)
    tiny.add_argument("--epochs", type=float, default=4.0)
    tiny.add_argument("--max-steps", type=int, default=None, help="stop after N steps if the epochs last longer")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=cmd_train_tiny)

    recipes = sub.add_parser("recipes", help="list the training recipes (padellm-ner train --recipe NAME)")
    recipes.set_defaults(func=cmd_recipes)
