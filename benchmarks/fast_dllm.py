"""Fast-dLLM against LLaDA's baseline sampler on the masked-diffusion NER model, in one run.

Variants, each at every block size: ``baseline`` (fixed steps per block, one token per step,
no cache), ``+cache`` (prefix or dual KV cache, same steps), ``+parallel`` (confidence
threshold, or the factor rule, no cache), ``+both`` (dual cache and threshold) and ``+both (left
to right)`` (dual cache, the threshold over the run after the first masked position: the engine's
default). All run through the engine (``decoder="fast_dllm"``) on the same CoNLL-03 dev
batches, interleaved, so that load on the machine hits every variant alike. Per variant: span micro-F1,
generated answer tokens per second, texts per second, forward passes per text and the
speed-up over the baseline sampler of the same block size. Optionally the PaDeLLM model
(en-conll03) is scored on the same texts for reference.

Usage: python benchmarks/fast_dllm.py [--limit N] [--json PATH] [--model FOLDER] [--data FILE]
       [--block-sizes 4,8,16] [--thresholds 0.7,0.8,0.9,0.95] [--full-forward-every 3,first] [--variants '+both (left']
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.reporting import benchmark_parser, dtype_name, print_table, require_model, save_figure, write_json  # noqa: E402
from general_decoding.diffusion import (  # noqa: E402
    BlockDiffusionSampler,
    FactorUnmasking,
    ThresholdUnmasking,
    fast_dllm_sampler,
    llada_sampler,
)
from ner_service.engine import NEREngine  # noqa: E402
from corpora import read_corpus  # noqa: E402
from training.evaluate import evaluate_engine, span_f1  # noqa: E402

BLOCK_SIZES = (4, 8, 16)
THRESHOLDS = (0.7, 0.8, 0.9, 0.95)
FACTOR = 1.0
RECIPE = "en-conll03-diffusion"


@dataclass(frozen=True)
class Variant:
    """One sampler configuration of the benchmark."""

    variant: str
    block_size: int
    sampler: BlockDiffusionSampler
    threshold: float | None = None
    factor: float | None = None


def variants(block_sizes: list[int], thresholds: list[float], full_forward_every: Sequence[int | None] = ()) -> list[Variant]:
    """Every configuration: baseline, +cache, +parallel, +both, over block sizes and thresholds;
    for each of ``full_forward_every``, left to right with a full forward only every that many
    blocks (None: the first), the others started from the cache of the block before."""
    out = []
    for size in block_sizes:
        baseline = llada_sampler(size)
        out.append(Variant("baseline", size, baseline))
        for cache in ("prefix", "dual"):
            out.append(Variant(f"+cache ({cache})", size, BlockDiffusionSampler(size, baseline.unmasking, cache=cache)))
        for threshold in thresholds:
            out.append(Variant("+parallel", size, BlockDiffusionSampler(size, ThresholdUnmasking(threshold)), threshold=threshold))
            out.append(Variant("+both", size, BlockDiffusionSampler(size, ThresholdUnmasking(threshold), cache="dual"), threshold=threshold))
            out.append(Variant("+both (left to right)", size, fast_dllm_sampler(size, threshold, "dual", left_to_right=True), threshold=threshold))
            for every in full_forward_every:
                name = f"+both (left to right, full forward {'first block only' if every is None else f'every {every} blocks'})"
                out.append(Variant(name, size, fast_dllm_sampler(size, threshold, "dual", left_to_right=True, full_forward_every=every),
                                   threshold=threshold))
        out.append(Variant("+both (prefix)", size, BlockDiffusionSampler(size, ThresholdUnmasking(0.9), cache="prefix"), threshold=0.9))
        out.append(Variant("+parallel (factor)", size, BlockDiffusionSampler(size, FactorUnmasking(FACTOR)), factor=FACTOR))
        out.append(Variant("+both (factor)", size, BlockDiffusionSampler(size, FactorUnmasking(FACTOR), cache="dual"), factor=FACTOR))
    return out


def plot(path: Path, results: list[dict], reference_f1: float | None, title: str) -> Path:
    """Speed-up over the baseline against F1, one marker per variant, one colour per block size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 5))
    markers = {"baseline": "o", "+cache": "s", "+parallel": "^", "+both": "*", "left to right": "P"}
    colours = dict(zip(BLOCK_SIZES, ["#4c72b0", "#dd8452", "#55a868"]))
    for row in results:
        kind = "left to right" if "left to right" in row["variant"] else row["variant"].split(" ")[0]
        axis.scatter(row["speedup"], row["f1"], marker=markers[kind], color=colours[row["block_size"]], s=70 if kind in ("+both", "left to right") else 40)
        if kind == "left to right":  # several per block size: say which
            every = row.get("full_forward_every", 1)
            label = f"{row['threshold']}" + ("" if every == 1 else ", first block full" if every is None else f", full every {every}")
            axis.annotate(label, (row["speedup"], row["f1"]), textcoords="offset points", xytext=(5, 4), fontsize=7)
    for kind, marker in markers.items():
        axis.scatter([], [], marker=marker, color="grey", label=kind)
    for size, colour in colours.items():
        axis.scatter([], [], marker="o", color=colour, label=f"block {size}")
    if reference_f1 is not None:
        axis.axhline(reference_f1, color="#c44e52", linestyle="--", linewidth=1, label="PaDeLLM en-conll03")
    axis.set_xscale("log")
    axis.set_xlabel("speed-up over the baseline sampler (tokens/s ratio, log scale)")
    axis.set_ylabel("span micro-F1")
    axis.legend(fontsize=8, ncol=2)
    axis.set_title(title, fontsize=10)
    return save_figure(figure, path)


def main() -> None:
    parser = benchmark_parser(__doc__, "fast_dllm", 200, model=RECIPE,
                              model_help=f"a diffusion NER model, from padellm-ner train --recipe {RECIPE} or train-diffusion", dtype=True)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--padellm", default="en-conll03", help="PaDeLLM model scored on the same texts ('' to skip)")
    parser.add_argument("--block-sizes", default=",".join(map(str, BLOCK_SIZES)))
    parser.add_argument("--thresholds", default=",".join(map(str, THRESHOLDS)))
    parser.add_argument("--full-forward-every", default="",
                        help="also left to right with a full forward only every N blocks, for each N given ('first': only the first block)")
    parser.add_argument("--variants", default="", help="only the variants whose names start with these (comma-separated; "
                                                         "the baseline always runs), e.g. '+both (left'")
    args = parser.parse_args()
    require_model("fast_dllm", args.model, RECIPE)

    engine = NEREngine.load(args.model, dtype=args.dtype)
    examples = [e for e in read_corpus(args.data) if e.text.strip()][: args.limit]
    configs = variants([int(b) for b in args.block_sizes.split(",")], [float(t) for t in args.thresholds.split(",")],
                       [None if every == "first" else int(every) for every in args.full_forward_every.split(",") if every])
    if args.variants:
        wanted = [name.strip() for name in args.variants.split(",")]
        configs = [c for c in configs if c.variant == "baseline" or any(c.variant.startswith(name) for name in wanted)]
    seconds = [0.0] * len(configs)
    tokens = [0] * len(configs)
    forwards = [0] * len(configs)
    predicted: list[list[list[tuple[int, int, str]]]] = [[] for _ in configs]
    batches = [examples[i:i + args.batch_size] for i in range(0, len(examples), args.batch_size)]
    for batch in tqdm(batches, desc="batches", unit="batch"):
        texts = [e.text for e in batch]
        for index, config in enumerate(configs):  # interleaved: noise hits every variant alike
            engine.diffusion_sampler = config.sampler
            began = time.perf_counter()
            results = engine.extract(texts, strategy="fast_dllm")
            seconds[index] += time.perf_counter() - began
            tokens[index] += results[0].stats.generated_tokens
            forwards[index] += results[0].stats.forward_passes
            predicted[index].extend([(e.start, e.end, e.label) for e in r.entities] for r in results)
    gold = [[(s.start, s.end, s.label) for s in e.spans] for e in examples]
    baseline_speed = {c.block_size: tokens[i] / seconds[i] for i, c in enumerate(configs) if c.variant == "baseline"}
    results = []
    for index, config in enumerate(configs):
        speed = tokens[index] / seconds[index]
        results.append({
            "variant": config.variant, "block_size": config.block_size, "threshold": config.threshold, "factor": config.factor,
            "full_forward_every": config.sampler.full_forward_every,
            "tokens_per_s": speed, "texts_per_s": len(examples) / seconds[index], "speedup": speed / baseline_speed[config.block_size],
            "forwards_per_text": forwards[index] / len(examples), "f1": span_f1(gold, predicted[index])["micro_f1"],
        })
    reference = None
    if args.padellm:
        report = evaluate_engine(NEREngine.load(args.padellm, dtype=args.dtype), examples, strategy="padellm", batch_size=args.batch_size)
        reference = {"model": args.padellm, "strategy": "padellm", "f1": report["micro_f1"], "texts_per_s": len(examples) / report["seconds"]}
    dtype = dtype_name(engine)
    print(f"\n{args.model} on {len(examples)} CoNLL-03 dev sentences, batches of {args.batch_size}, {dtype}, "
          f"{torch.get_num_threads()} threads; speed-up over the baseline sampler of the same block size")
    print_table(results, ["variant", "block_size", "threshold", "factor", "tokens_per_s", "texts_per_s", "speedup", "forwards_per_text", "f1"])
    if reference:
        print(f"reference: {reference['model']} (PaDeLLM) F1 {reference['f1']:.2f} at {reference['texts_per_s']:.2f} texts/s on the same texts")
    path = write_json(args.json, {"benchmark": "fast_dllm", "model": args.model, "n_sentences": len(examples),
                                  "dtype": dtype,
                                  "batch_size": args.batch_size, "threads": torch.get_num_threads(), "reference": reference,
                                  "results": results})
    png = plot(path.with_suffix(".png"), results, reference["f1"] if reference else None,
               f"Fast-dLLM vs LLaDA baseline sampler, {args.model}, {len(examples)} CoNLL-03 dev sentences")
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
