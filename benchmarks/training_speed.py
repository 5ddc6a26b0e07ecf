"""CPU training throughput of the LM trainer, lever by lever, and what it buys in dev F1.

For the issue "Training on two CPU cores". Part 1 times training steps of ``training/trainer.py``
on the first ``--limit`` CoNLL-03 train texts, every arm on the same ``--steps`` batches
(``--batch-tokens`` padded tokens each), the arms interleaved step by step in one process so
that machine noise hits them alike (after small untimed warm-up steps; each step starts with
another arm):

* ``baseline``: today's settings, LoRA r=32 on all layers, float32, torch's default threads;
* ``bfloat16``: the baseline in bfloat16 (a CPU without bfloat16 instructions emulates them:
  about 25x slower, so there only ``--bf16-steps`` of the batches are timed, as for ``mixed``);
* ``topN`` (N in ``--top-layers``, 15,10,6): LoRA on the top N layers only; the frozen layers
  below run once per text into a file-backed cache (:mod:`training.top_layers`), a one-off
  pass timed on its own (``build_tok_s``) and counted in ``one_off_s``;
* ``threadsN``: the baseline with ``torch.set_num_threads(N)`` (``--threads``, default 1);
* ``compile``: the default arm with its trained layers under ``torch.compile``; compiling and
  its steps get ``--compile-budget`` seconds (0: skipped), and a failure is reported in the
  table, not raised; the compile time counts in ``one_off_s``;
* ``default``: the en-conll03-cpu recipe's setting, read from the recipe (today full fine-tuning
  of the top 15 layers at its learning rate, float32; a frozen pass it shares with a ``topN`` arm
  of the same layers);
* ``mixed``: the default in mixed precision: float32 weights, bfloat16 matrix products
  (``torch.autocast``, :mod:`training.precision`), its own frozen pass in mixed precision; what
  ``dtype = "auto"`` picks on a CPU with bfloat16 instructions (AVX512_BF16, AMX).

A top-layer count is clamped to the model's layers minus one (the tiny test model has 2).
Per arm: tokens/s and texts/s of the steps, speed-up over the baseline on the same batches,
one-off seconds, and the tokens/s of a 3-epoch run over the ``--limit`` texts including the
one-off work: 3*tokens / (one_off_s + 3*tokens/step_tok_s).

Part 2 (unless ``--skip-curve``): the baseline and the default each train for ``--minutes`` of
training time (``train()`` called with ``resume`` in four increments, alternating the arms; the
frozen pass counts in the default's minutes; the learning-rate schedule is stretched over the
steps that the measured throughput fits in ``--minutes``). After each increment the saved model
is loaded and scored on the first ``--eval-limit`` dev sentences, PaDeLLM and AR micro-F1.

Writes the table(s), ``--json`` and a PNG next to it (left: tokens/s per arm; right: dev F1
against training minutes). Exits with one line and status 2 if the corpus or the base model is
missing.

Usage: python benchmarks/training_speed.py [--limit 400] [--json PATH] [--base smollm2-135m-instruct]
       [--data ../shared/data] [--steps 6] [--minutes 20] [--eval-limit 300] [--skip-curve]
       [--batch-tokens 4096] [--bf16-steps 1] [--top-layers 15,10,6] [--threads 1] [--compile-budget 300]
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.reporting import CONLL_DEV, print_table, save_figure, write_json  # noqa: E402
from corpora import labels_of, read_corpus  # noqa: E402
from ner_service.engine import NEREngine  # noqa: E402
from ner_service.engine.model_loading import ModelNotFoundError, resolve_model_folder  # noqa: E402
from ner_service.engine.ner_model import resolve_ner_model  # noqa: E402
from training.batching import length_batches  # noqa: E402
from training.evaluate import evaluate_engine  # noqa: E402
from training.examples import build_row  # noqa: E402
from training.loss import answer_loss, inner_model, optimizer_step  # noqa: E402
from training.precision import PRECISIONS, cpu_has_bfloat16  # noqa: E402
from training.recipes.recipe import load_recipe  # noqa: E402
from training.top_layers import FrozenHidden, layer_count  # noqa: E402
from training.trainer import TrainConfig, prepare_model, train  # noqa: E402

DATA = Path(os.environ.get("PADELLM_DATA", CONLL_DEV.parent.parent))
#: The settings every arm shares (the en-conll03 recipes').
LORA_R, LORA_ALPHA, LR = 32, 32, 1e-3
#: The recipe whose setting is the ``default`` arm (the CPU default).
CPU_RECIPE = "en-conll03-cpu"
EPOCHS_FOR_EFFECTIVE = 3


class Missing(Exception):
    """Something the benchmark needs is not there (one line for the user)."""


@dataclass(frozen=True)
class RecipeSetting:
    """How an arm trains: its top layers (None: all), full fine-tuning or LoRA, its learning rate."""

    top_layers: int | None
    full: bool
    lr: float


def recipe_setting() -> RecipeSetting:
    """The setting of the CPU recipe's first stage (the ``default`` arm)."""
    settings = load_recipe(CPU_RECIPE).stages[0].settings
    return RecipeSetting(settings.get("top_layers"), bool(settings.get("full", False)), float(settings.get("lr", LR)))


class OverBudget(Exception):
    pass


@dataclass
class Arm:
    """One way to train, and what its steps measured."""

    name: str
    settings: str
    top_layers: int | None = None
    dtype: str = "float32"  # a name of training.precision.PRECISIONS
    threads: int | None = None  # None: torch's default
    full: bool = False  # full fine-tuning of the trained layers instead of LoRA
    lr: float = LR
    compile: bool = False
    steps: int = 0
    status: str = "ok"
    model: torch.nn.Module | None = None
    trainable: list = field(default_factory=list)
    optimizer: torch.optim.Optimizer | None = None
    first_layer: int = 0
    frozen: FrozenHidden | None = None
    build_seconds: float = 0.0
    warmup_seconds: float = 0.0
    compile_seconds: float = 0.0
    spent: float = 0.0  # compile arm: seconds of its budget used
    seconds: dict[int, float] = field(default_factory=dict)  # batch number -> seconds


def fail(message: str) -> None:
    print(f"training_speed: {message}", file=sys.stderr)
    sys.exit(2)


def check_inputs(data: Path, base: str) -> tuple[Path, Path, str]:
    """The train and dev files, and the base as the trainer should get it (a path made absolute)."""
    for path in (data / "conll2003" / "train.txt", data / "conll2003" / "dev.txt"):
        if not path.is_file():
            raise Missing(f"{path} not found: the CoNLL-03 corpus is read from ../shared/data next to the repository, or give --data FOLDER")
    try:
        resolve_ner_model(base)
    except ModelNotFoundError:
        try:
            resolve_model_folder(base)
        except ModelNotFoundError as error:
            raise Missing(f"base model {base!r} not found ({error}); install it with `make install`") from None
    if Path(base).expanduser().exists():
        base = str(Path(base).expanduser().resolve())
    return data / "conll2003" / "train.txt", data / "conll2003" / "dev.txt", base


def arms_for(layers: int, args: argparse.Namespace) -> list[Arm]:
    """The arms of the throughput table, for a model of ``layers`` decoder layers."""

    def clamp(top: int) -> int:
        return max(1, min(top, layers - 1))

    found = [Arm("baseline", f"LoRA all {layers} layers, float32"),
             Arm("bfloat16", "baseline in bfloat16", dtype="bfloat16")]
    seen = set()
    for top in args.top_layers:
        if clamp(top) not in seen:
            seen.add(clamp(top))
            found.append(Arm(f"top{clamp(top)}", f"LoRA top {clamp(top)}/{layers} layers", top_layers=clamp(top)))
    for threads in args.threads:
        found.append(Arm(f"threads{threads}", f"baseline, {threads} torch thread(s)", threads=threads))
    recipe = recipe_setting()
    default = clamp(recipe.top_layers or layers)
    how = "full fine-tuning" if recipe.full else "LoRA"
    found.append(Arm("compile", f"default + torch.compile of the top {default} layers", top_layers=default, compile=True,
                     full=recipe.full, lr=recipe.lr))
    found.append(Arm("default", f"recipe {CPU_RECIPE}: {how} of the top {default}/{layers} layers, lr {recipe.lr:g}, float32",
                     top_layers=default, full=recipe.full, lr=recipe.lr))
    found.append(Arm("mixed", "default, float32 weights, bfloat16 products", top_layers=default, full=recipe.full, lr=recipe.lr,
                     dtype="mixed"))
    return found


def run_step(arm: Arm, rows: list, batch: list[int], pad: int) -> float:
    """One training step of ``arm`` on ``batch``; its seconds."""
    default_threads = torch.get_num_threads()
    if arm.threads:
        torch.set_num_threads(arm.threads)
    try:
        began = time.perf_counter()
        hidden = arm.frozen.padded(batch) if arm.frozen is not None else None
        with PRECISIONS[arm.dtype].autocast("cpu"):
            loss = answer_loss(arm.model, [rows[i] for i in batch], pad, hidden, arm.first_layer)
        optimizer_step(loss, arm.trainable, arm.optimizer)
        return time.perf_counter() - began
    finally:
        torch.set_num_threads(default_threads)


def budgeted_step(arm: Arm, rows: list, batch: list[int], pad: int, budget: float) -> float:
    """``run_step``, but the compile arm stops with :class:`OverBudget` past its budget."""
    if not arm.compile:
        return run_step(arm, rows, batch, pad)
    left = budget - arm.spent
    if left < 1:
        raise OverBudget(f"over the {budget:.0f} s compile budget")

    def alarm(signum: int, frame: object) -> None:
        raise OverBudget(f"over the {budget:.0f} s compile budget")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, left)
    began = time.perf_counter()
    try:
        return run_step(arm, rows, batch, pad)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        arm.spent += time.perf_counter() - began


def prepare(arm: Arm, base: str, args: argparse.Namespace, rows: list, pad: int, frozen_by_layer: dict, work: Path) -> None:
    """Load ``arm``'s model and optimizer; build (or share) its frozen-layer cache."""
    config = TrainConfig(base=base, train="-", output=str(work), lora_r=LORA_R, lora_alpha=LORA_ALPHA, full=arm.full,
                         top_layers=arm.top_layers, batch_tokens=args.batch_tokens, dtype=arm.dtype)
    arm.model, _, arm.first_layer = prepare_model(config)
    arm.trainable = [p for p in arm.model.parameters() if p.requires_grad]
    arm.optimizer = torch.optim.AdamW(arm.trainable, lr=arm.lr, weight_decay=0.0)
    if arm.first_layer > 0:
        key = (arm.first_layer, PRECISIONS[arm.dtype].products)
        if key not in frozen_by_layer:
            began = time.perf_counter()
            with PRECISIONS[arm.dtype].autocast("cpu"):
                frozen = FrozenHidden.build(inner_model(arm.model), [r.tree for r in rows], arm.first_layer,
                                            work / f"frozen{arm.first_layer}-{arm.dtype}", pad, args.batch_tokens)
            frozen_by_layer[key] = (frozen, time.perf_counter() - began)
        arm.frozen, arm.build_seconds = frozen_by_layer[key]
    if arm.compile:
        decoder = inner_model(arm.model).get_decoder()
        for index in range(arm.first_layer, layer_count(inner_model(arm.model))):
            decoder.layers[index].compile(dynamic=True)


def measure(arms: list[Arm], rows: list, batches: list[list[int]], pad: int, args: argparse.Namespace) -> None:
    """Warm every arm up, then time the batches, interleaved arm by arm at each step."""
    by_length = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    # two rows, three of middle length, one alone: the compile arm meets batch sizes above 1 and of 1
    warmups = [by_length[:2], by_length[len(by_length) // 2:len(by_length) // 2 + 3] or by_length[:3], by_length[:1]]
    for arm in arms:
        if arm.status != "ok":
            continue
        try:
            for number, warmup in enumerate(warmups):
                if number == 0 or arm.compile or arm.name == "default":  # compile sees two shapes; default times them uncompiled
                    arm.warmup_seconds += budgeted_step(arm, rows, warmup, pad, args.compile_budget)
        except Exception as error:  # noqa: BLE001 - a lever that does not work is a result
            fail_arm(arm, error)
    default = next(a for a in arms if a.name == "default")
    for step, batch in enumerate(batches):
        for arm in arms[step % len(arms):] + arms[: step % len(arms)]:  # each step starts with another arm
            if arm.status == "ok" and step < arm.steps:
                try:
                    arm.seconds[step] = budgeted_step(arm, rows, batch, pad, args.compile_budget)
                except Exception as error:  # noqa: BLE001
                    fail_arm(arm, error)
        print(f"step {step + 1}/{len(batches)}: " + ", ".join(f"{a.name} {a.seconds[step]:.1f}s" for a in arms if step in a.seconds),
              file=sys.stderr)
    for arm in arms:
        if arm.compile and arm.status == "ok":
            plain = default.warmup_seconds if default.status == "ok" else 0.0
            arm.compile_seconds = max(0.0, arm.warmup_seconds - plain)


def fail_arm(arm: Arm, error: BaseException) -> None:
    reason = " ".join(str(error).split())[:120] or type(error).__name__
    arm.status = f"failed: {type(error).__name__}: {reason}" if not isinstance(error, OverBudget) else f"failed: {reason}"
    arm.seconds.clear()
    arm.model = arm.optimizer = None
    arm.trainable = []
    if arm.compile:
        torch._dynamo.reset()


def throughput_rows(arms: list[Arm], rows: list, batches: list[list[int]]) -> list[dict]:
    lengths = [len(r) for r in rows]
    total = sum(lengths)
    baseline = next(a for a in arms if a.name == "baseline")
    base_effective = None
    found = []
    for arm in arms:
        row = {"arm": arm.name, "settings": arm.settings, "top_layers": arm.top_layers, "dtype": arm.dtype,
               "threads": arm.threads or torch.get_num_threads(), "compile": arm.compile, "status": arm.status}
        if arm.status == "ok" and arm.seconds:
            timed = sorted(arm.seconds)
            seconds = sum(arm.seconds[s] for s in timed)
            tokens = sum(lengths[i] for s in timed for i in batches[s])
            texts = sum(len(batches[s]) for s in timed)
            step_tok_s = tokens / seconds
            one_off = arm.build_seconds + arm.compile_seconds
            effective = EPOCHS_FOR_EFFECTIVE * total / (one_off + EPOCHS_FOR_EFFECTIVE * total / step_tok_s)
            common = [s for s in timed if s in baseline.seconds]
            row.update({
                "steps": len(timed), "tokens": tokens, "seconds": seconds, "tokens_per_s": step_tok_s, "texts_per_s": texts / seconds,
                "speedup": sum(baseline.seconds[s] for s in common) / sum(arm.seconds[s] for s in common) if common else None,
                "one_off_s": one_off, "build_s": arm.build_seconds, "compile_s": arm.compile_seconds,
                "build_tok_s": total / arm.build_seconds if arm.build_seconds else None,
                "epoch3_tok_s": effective, "seconds_per_step": [arm.seconds[s] for s in timed],
            })
            if arm.name == "baseline":
                base_effective = effective
        found.append(row)
    for row in found:
        if base_effective and row.get("epoch3_tok_s"):
            row["epoch3_speedup"] = row["epoch3_tok_s"] / base_effective
    return found


def evaluate_saved(output: Path, dev: list, batch_size: int) -> dict:
    engine = NEREngine.load(output)
    return {strategy: evaluate_engine(engine, dev, strategy=strategy, batch_size=batch_size, progress=False)["micro_f1"]
            for strategy in ("padellm", "ar")}


def quality_curve(base: str, train_path: Path, dev_path: Path, args: argparse.Namespace, speeds: dict[str, dict],
                  tokens_per_step: float, work: Path) -> list[dict]:
    """Train the baseline and the default for ``--minutes`` each, in four resumed parts, scoring
    dev after each."""
    dev = read_corpus(dev_path)[: args.eval_limit]
    recipe = recipe_setting()
    settings = {"baseline": RecipeSetting(None, False, LR), "default": RecipeSetting(speeds["default"]["top_layers"], recipe.full, recipe.lr)}
    found = []
    for part in range(1, 5):
        for name, setting in settings.items():
            speed = speeds[name]
            budget = 60 * args.minutes - speed.get("build_s", 0.0)
            max_steps = max(1, math.ceil(1.1 * budget * speed["tokens_per_s"] / tokens_per_step))
            config = TrainConfig(base=base, train=str(train_path), output=str(work / f"curve-{name}"), lora_r=LORA_R, lora_alpha=LORA_ALPHA,
                                 full=setting.full, lr=setting.lr, max_steps=max_steps, max_minutes=args.minutes * part / 4, batch_tokens=args.batch_tokens,
                                 limit=args.limit, top_layers=setting.top_layers, dtype="float32", checkpoint_minutes=1e9, resume=part > 1, seed=0)
            summary = train(config)
            scores = evaluate_saved(work / f"curve-{name}", dev, batch_size=16)
            found.append({"arm": name, "part": part, "minutes": summary["train_seconds"] / 60, "steps": summary["steps"],
                          "max_steps": max_steps, "tokens": summary["tokens"], "tokens_per_s": summary["tokens_per_second"],
                          "padellm_f1": scores["padellm"], "ar_f1": scores["ar"]})
            print(f"curve {name} part {part}/4: {found[-1]['minutes']:.1f} min, step {summary['steps']}, "
                  f"PaDeLLM F1 {scores['padellm']:.3f}, AR F1 {scores['ar']:.3f}", file=sys.stderr)
    return found


def plot(path: Path, throughput: list[dict], curve: list[dict], title: str) -> Path:
    """Left: tokens/s per arm (steps, and a 3-epoch run with the one-off work); right: dev F1
    against training minutes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    measured = [r for r in throughput if r.get("tokens_per_s")]
    names = [r["arm"] for r in measured]
    x = range(len(measured))
    steps = left.bar([i - 0.2 for i in x], [r["tokens_per_s"] for r in measured], width=0.4, label="training steps")
    effective = left.bar([i + 0.2 for i in x], [r["epoch3_tok_s"] for r in measured], width=0.4, label="3 epochs incl. one-off")
    left.bar_label(steps, fmt="%.0f", fontsize=7)
    left.bar_label(effective, fmt="%.0f", fontsize=7)
    left.set_xticks(list(x), names, rotation=20, fontsize=8)
    left.set_ylabel("tokens / s")
    left.set_title("training throughput", fontsize=10)
    left.legend(fontsize=8)
    if curve:
        for name, color in (("baseline", "#4c72b0"), ("default", "#dd8452")):
            points = [r for r in curve if r["arm"] == name]
            minutes = [r["minutes"] for r in points]
            right.plot(minutes, [r["padellm_f1"] for r in points], "o-", color=color, label=f"{name} PaDeLLM")
            right.plot(minutes, [r["ar_f1"] for r in points], "s--", color=color, label=f"{name} AR")
        right.set_xlabel("training minutes (CPU)")
        right.set_ylabel("dev micro-F1")
        right.legend(fontsize=8)
    else:
        right.text(0.5, 0.5, "quality curve skipped", ha="center", va="center")
        right.set_axis_off()
    right.set_title("dev F1 against training time", fontsize=10)
    figure.suptitle(title, fontsize=10)
    return save_figure(figure, path)


def numbers(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=400, help="training texts used (default %(default)s)")
    parser.add_argument("--json", default="benchmarks/results/training_speed.json")
    parser.add_argument("--base", default="smollm2-135m-instruct", help="the model trained (default %(default)s)")
    parser.add_argument("--data", default=str(DATA), help="folder holding conll2003/{train,dev}.txt (default %(default)s)")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per throughput arm (default %(default)s)")
    parser.add_argument("--bf16-steps", type=int, default=1,
                        help="timed steps of the bfloat16 and mixed arms on a CPU without bfloat16 instructions (default %(default)s)")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per step (default %(default)s)")
    parser.add_argument("--top-layers", type=numbers, default=[15, 10, 6], help="top-layer arms (default 15,10,6)")
    parser.add_argument("--threads", type=numbers, default=[1], help="torch thread counts tried on the baseline (default 1)")
    parser.add_argument("--compile-budget", type=float, default=300, help="seconds for torch.compile and its steps; 0 skips it (default %(default)s)")
    parser.add_argument("--minutes", type=float, default=20, help="training minutes per arm of the quality curve (default %(default)s)")
    parser.add_argument("--eval-limit", type=int, default=300, help="dev sentences scored on the curve (default %(default)s)")
    parser.add_argument("--skip-curve", action="store_true", help="only the throughput table")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    try:
        train_path, dev_path, base = check_inputs(Path(args.data), args.base)
    except Missing as missing:
        fail(str(missing))
    load_start = os.getloadavg()

    examples = read_corpus(train_path)[: args.limit]
    labels = labels_of(examples)
    with tempfile.TemporaryDirectory(prefix="training_speed-") as folder:
        work = Path(folder)
        probe = TrainConfig(base=base, train="-", output=str(work), lora_r=LORA_R, lora_alpha=LORA_ALPHA)
        model, tokenizer, _ = prepare_model(probe)
        layers = layer_count(inner_model(model))
        del model
        rows = [build_row(e, labels, tokenizer) for e in examples]
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        lengths = [len(r) for r in rows]
        batches = length_batches(lengths, args.batch_tokens, 0)[: args.steps]
        tokens_per_step = sum(lengths) / len(length_batches(lengths, args.batch_tokens, 0))

        arms = arms_for(layers, args)
        frozen_by_layer: dict = {}
        for arm in arms:
            emulated = PRECISIONS[arm.dtype].products == torch.bfloat16 and not cpu_has_bfloat16()
            arm.steps = min(args.bf16_steps, len(batches)) if emulated else len(batches)
            if arm.steps < 1:
                arm.status = "skipped (--bf16-steps 0)"
                continue
            if arm.compile and args.compile_budget <= 0:
                arm.status = "skipped (--compile-budget 0)"
                continue
            try:
                prepare(arm, base, args, rows, pad, frozen_by_layer, work)
            except Exception as error:  # noqa: BLE001
                fail_arm(arm, error)
        measure(arms, rows, batches, pad, args)
        throughput = throughput_rows(arms, rows, batches)
        for arm in arms:
            arm.model = arm.optimizer = arm.frozen = None
        frozen_by_layer.clear()

        curve = []
        if not args.skip_curve:
            speeds = {r["arm"]: r for r in throughput}
            if not all(speeds[name].get("tokens_per_s") for name in ("baseline", "default")):
                fail("the quality curve needs the baseline and default arms, and one of them failed")
            curve = quality_curve(base, train_path, dev_path, args, speeds, tokens_per_step, work)

    machine = {"cpu_count": os.cpu_count(), "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
               "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "cpu_bfloat16": cpu_has_bfloat16()}
    where = (f"{args.base}, {len(rows)} texts, {machine['cpu_count']} CPUs ({'with' if machine['cpu_bfloat16'] else 'without'} "
             f"bfloat16 instructions), {machine['torch_threads']} torch threads")
    print(f"\nTraining throughput: {where}, {args.batch_tokens} padded tokens per step, "
          f"load average {load_start[0]:.1f} -> {machine['loadavg_end'][0]:.1f}")
    shown = [{k: "" if v is None else v for k, v in r.items()} for r in throughput]
    print_table(shown, ["arm", "settings", "tokens_per_s", "texts_per_s", "speedup", "one_off_s", "build_tok_s",
                        "epoch3_tok_s", "epoch3_speedup", "status"])
    if curve:
        print(f"\nDev micro-F1 against training minutes ({min(args.eval_limit, len(read_corpus(dev_path)))} dev sentences)")
        print_table(curve, ["arm", "part", "minutes", "steps", "tokens_per_s", "padellm_f1", "ar_f1"])
    settings = {"limit": args.limit, "n_texts": len(rows), "base": args.base, "data": args.data, "steps": args.steps,
                "bf16_steps": args.bf16_steps, "batch_tokens": args.batch_tokens, "lora_r": LORA_R, "lora_alpha": LORA_ALPHA,
                "lr": LR, "model_layers": layers, "top_layers": args.top_layers, "threads": args.threads,
                "compile_budget": args.compile_budget, "minutes": args.minutes, "eval_limit": args.eval_limit,
                "skip_curve": args.skip_curve, "texts_tokens": sum(lengths)}
    path = write_json(args.json, {"benchmark": "training_speed", "settings": settings, "machine": machine,
                                  "throughput": throughput, "curve": curve})
    png = plot(path.with_suffix(".png"), throughput, curve, f"Training on the CPU: {where}")
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
