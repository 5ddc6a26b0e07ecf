"""PaDeLLM-NER against the autoregressive baseline, same model, in one run.

Variants of the same model on the same CoNLL-03 dev sentences, interleaved so that machine
noise hits them alike, at each batch size of ``--batch-sizes`` (default 1 and 16):

* ``ar_copy``, ``ar_anpd``: every label's mentions generated in one sequence (the baseline),
  with copy and with ANPD drafting; the faster one is the baseline of the speed-ups;
* ``padellm_greedy``: PaDeLLM with greedy answers and no speculation (one token per forward
  after the prefix: the reference the others must equal);
* ``padellm_copy``: copy-drafted answers, no speculation (the engine's default on a CPU);
* ``padellm_speculating``: copy drafting, the mention queries of a count of 1 speculated in
  the prefix forward, and each known mention token followed by the text it is copied from
  (``speculated_counts=(1,)``, the default on a GPU; ``ner_service/engine/engine.py``);
* ``padellm_reencode`` (batch 1 only): PaDeLLM re-encoding the text for every query, the
  reference implementation's way (:mod:`benchmarks.reencoding`);
* ``padellm_floor`` (with ``--past-count-floor P`` on a model trained past its counts): copy
  drafting, the mention past a count asked only where the model gives a further mention at least
  ``P`` (``past_count_floor``), against ``padellm_copy`` with the model's own floor;
* ``padellm_quantile`` (with ``--count-quantile Q``): copy drafting, each count the largest the
  model gives at least probability ``Q`` of being reached (``count_quantile``), against
  ``padellm_copy`` with the model's own count rule.

Per variant: micro-F1, latency per text (mean, p50, p90 at batch 1), texts per second, forward
passes and tokens fed per text, speed-up over the faster AR, and whether its entities are those
of ``padellm_greedy`` (or of ``ar_copy`` for AR). At batch 1 a stacked bar per variant shows
where a text's time goes: PaDeLLM's phases (prefix+count, mention, repair) and AR's prefill
(its first forward) and decoding; ``other`` is windowing, alignment and conflicts.

On an open model (any labels at call time), ``--label-counts 4,12,24`` asks each of those
numbers of labels: the file's own labels by name (CoNLL-03's PER as "person", ...) and then
types the file does not hold (:data:`FILLER_LABELS`), so that the cost of more labels shows;
F1 is of the file's labels.

Usage: python benchmarks/padellm_vs_ar.py [--limit N] [--json PATH] [--model NAME] [--data FILE]
       [--batch-sizes 1,16] [--label-counts 4,12,24] [--past-count-floor P] [--count-quantile Q] [--device cpu|cuda]
       [--dtype auto|float32|bfloat16]
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.reencoding import reencoding_padellm  # noqa: E402
from benchmarks.reporting import bar_plots, benchmark_parser, dtype_name, print_table, save_figure, write_json  # noqa: E402
from ner_service.engine import NEREngine, Strategy  # noqa: E402
from corpora import read_corpus  # noqa: E402
from training.evaluate import span_f1  # noqa: E402
from training.open_data import SUPERVISED_NAMES  # noqa: E402

PHASES = ("prefill", "prefix+count", "mention", "repair", "answer", "other")
#: Entity types asked of an open model besides the file's own, to reach ``--label-counts``.
FILLER_LABELS = ("date", "money", "product", "event", "law", "language", "disease", "drug", "gene", "chemical", "species",
                 "software", "vehicle", "weapon", "food", "sport", "quantity", "time", "award", "facility", "religion",
                 "programming language", "protein", "medical procedure")


@dataclass
class Variant:
    """One way to run the engine, and what it measured."""

    engine: NEREngine
    strategy: str | Strategy
    decoder: str
    reference: str
    seconds: list[float] = field(default_factory=list)  # per call
    texts: int = 0
    forwards: int = 0
    fed: int = 0
    phase_ms: dict[str, float] = field(default_factory=dict)
    spans: list[list[tuple[int, int, str]]] = field(default_factory=list)


class ForwardMeter:
    """Counts the tokens every forward of the model's decoder stack feeds, and times them."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.tokens, self.durations = 0, []
        self._began = 0.0
        model.register_forward_pre_hook(self._before, with_kwargs=True)
        model.register_forward_hook(self._after)

    def _before(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids")
        self.tokens += ids.numel() if ids is not None else 0
        self._began = time.perf_counter()

    def _after(self, module: torch.nn.Module, args: tuple, output: object) -> None:
        self.durations.append(time.perf_counter() - self._began)

    def reset(self) -> None:
        self.tokens, self.durations = 0, []


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def variants(engine: NEREngine, batch_size: int, past_count_floor: float | None = None,
             count_quantile: float | None = None) -> dict[str, Variant]:
    plain = NEREngine(engine.ner_model, speculated_counts=(), max_batch_texts=batch_size)
    speculating = NEREngine(engine.ner_model, speculated_counts=(1,), max_batch_texts=batch_size)
    found = {
        "ar_copy": Variant(plain, "ar", "copy", "ar_copy"),
        "ar_anpd": Variant(plain, "ar", "anpd", "ar_copy"),
        "padellm_greedy": Variant(plain, "padellm", "greedy", "padellm_greedy"),
        "padellm_copy": Variant(plain, "padellm", "copy", "padellm_greedy"),
        "padellm_speculating": Variant(speculating, "padellm", "copy", "padellm_greedy"),
    }
    if past_count_floor is not None and engine.ner_model.config.answers_past_count:
        floored = NEREngine(engine.ner_model, speculated_counts=(), max_batch_texts=batch_size, past_count_floor=past_count_floor)
        found["padellm_floor"] = Variant(floored, "padellm", "copy", "padellm_greedy")
    if count_quantile is not None:
        quantiled = NEREngine(engine.ner_model, speculated_counts=(), max_batch_texts=batch_size, count_quantile=count_quantile)
        found["padellm_quantile"] = Variant(quantiled, "padellm", "copy", "padellm_greedy")
    if batch_size == 1:
        found["padellm_reencode"] = Variant(plain, reencoding_padellm(plain), "copy", "padellm_greedy")
    return found


def asked_labels(file_labels: list[str], count: int) -> dict[str, str]:
    """``count`` label names to ask an open model, each with the file label it stands for (a
    filler type stands for none: ``""``): the file's own by their plain names first."""
    names = {**SUPERVISED_NAMES["conll2003"], **SUPERVISED_NAMES["resume"]}
    asked = {names.get(label, label): label for label in file_labels}
    for filler in FILLER_LABELS:
        if len(asked) >= count:
            break
        asked.setdefault(filler, "")
    if len(asked) < count:
        raise SystemExit(f"--label-counts: at most {len(asked)} labels for this file")
    return dict(list(asked.items())[:count])


def measure(engine: NEREngine, texts: list[str], batch_size: int, meter: ForwardMeter,
            labels: dict[str, str] | None = None, past_count_floor: float | None = None,
            count_quantile: float | None = None) -> dict[str, Variant]:
    """Run every variant over ``texts`` in batches, interleaved batch by batch (asking
    ``labels``' names when given, each entity kept under the file label its name stands for)."""
    runs = variants(engine, batch_size, past_count_floor, count_quantile)
    asked = list(labels) if labels else None
    for run in runs.values():  # untimed warm-up
        run.engine.extract(texts[:batch_size], asked, strategy=run.strategy, decoder=run.decoder)
    for start in tqdm(range(0, len(texts), batch_size), desc=f"batch {batch_size}", unit="batch"):
        batch = texts[start:start + batch_size]
        for run in runs.values():
            meter.reset()
            began = time.perf_counter()
            results = run.engine.extract(batch, asked, strategy=run.strategy, decoder=run.decoder)
            run.seconds.append(time.perf_counter() - began)
            stats = results[0].stats
            run.texts += len(batch)
            run.forwards += stats.forward_passes
            run.fed += meter.tokens
            run.spans += [[(e.start, e.end, labels[e.label] if labels else e.label) for e in r.entities
                           if not labels or labels[e.label]] for r in results]
            phases = dict(stats.phase_ms)
            if "answer" in phases and meter.durations:  # AR: its first forward encodes the prompt
                phases["prefill"] = 1000 * meter.durations[0]
                phases["answer"] -= phases["prefill"]
            phases["other"] = stats.latency_ms - sum(phases.values())
            for phase, ms in phases.items():
                run.phase_ms[phase] = run.phase_ms.get(phase, 0.0) + ms
    return runs


def rows_of(runs: dict[str, Variant], gold: list[list[tuple[int, int, str]]], batch_size: int) -> list[dict]:
    baseline = min(("ar_copy", "ar_anpd"), key=lambda name: sum(runs[name].seconds))
    rows = []
    for name, run in runs.items():
        per_text = [1000 * s / batch_size for s in run.seconds] if batch_size > 1 else [1000 * s for s in run.seconds]
        rows.append({
            "batch": batch_size,
            "variant": name,
            "f1": span_f1(gold, run.spans)["micro_f1"],
            "ms_per_text": 1000 * sum(run.seconds) / run.texts,
            "p50_ms": percentile(per_text, 0.5),
            "p90_ms": percentile(per_text, 0.9),
            "texts_per_s": run.texts / sum(run.seconds),
            "forwards_per_text": run.forwards / run.texts,
            "tokens_fed_per_text": run.fed / run.texts,
            "speedup_vs_ar": sum(runs[baseline].seconds) / sum(run.seconds),
            "identical": run.spans == runs[run.reference].spans,
            "phase_ms_per_text": {phase: ms / run.texts for phase, ms in run.phase_ms.items()},
        })
    return rows


def phase_plot(path: Path, rows: list[dict], title: str) -> Path:
    """Stacked bars: a text's time by phase, per variant (batch 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4))
    several = len({r["labels"] for r in rows}) > 1
    names = [f"{r['variant']} {r['labels']}l" if several else r["variant"] for r in rows]
    bottom = [0.0] * len(rows)
    for phase in PHASES:
        values = [max(r["phase_ms_per_text"].get(phase, 0.0), 0.0) for r in rows]
        if any(values):
            axis.bar(names, values, bottom=bottom, label=phase)
            bottom = [b + v for b, v in zip(bottom, values)]
    axis.set_ylabel("ms per text")
    axis.set_title(title, fontsize=10)
    axis.tick_params(axis="x", labelrotation=20, labelsize=8)
    axis.legend(fontsize=8)
    return save_figure(figure, path)


def speedups_by_labels(rows: list[dict], variant: str) -> dict[str, float]:
    """``variant``'s speed-up over the faster AR, keyed by batch size and number of labels asked."""
    return {f"batch {r['batch']}, {r['labels']} labels": r["speedup_vs_ar"] for r in rows if r["variant"] == variant}


def main() -> None:
    parser = benchmark_parser(__doc__, "padellm_vs_ar", limit=100, dtype=True)
    parser.add_argument("--batch-sizes", default="1,16", help="comma-separated (default %(default)s)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--label-counts", default=None, help="an open model: comma-separated numbers of labels to ask (e.g. 4,12,24)")
    parser.add_argument("--past-count-floor", type=float, default=None, metavar="P",
                        help="also run padellm_floor: the mention past a count asked only where a further one has probability >= P")
    parser.add_argument("--count-quantile", type=float, default=None, metavar="Q",
                        help="also run padellm_quantile: each count the largest the model gives probability >= Q of being reached")
    args = parser.parse_args()

    examples = [e for e in read_corpus(args.data) if e.text.strip()][: args.limit]
    texts = [e.text for e in examples]
    gold = [[(s.start, s.end, s.label) for s in e.spans] for e in examples]
    engine = NEREngine.load(args.model, dtype=args.dtype, device=args.device)
    meter = ForwardMeter(engine.ner_model.model.get_decoder())
    label_sets: list[dict[str, str] | None] = [None]
    if args.label_counts:
        if not engine.ner_model.config.open_labels:
            parser.error(f"--label-counts needs an open model (any labels at call time); {args.model} knows its own labels only")
        file_labels = sorted({s.label for e in examples for s in e.spans})
        label_sets = [asked_labels(file_labels, int(n)) for n in args.label_counts.split(",")]
    rows = []
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        for labels in label_sets:
            found = rows_of(measure(engine, texts, batch_size, meter, labels, args.past_count_floor, args.count_quantile), gold, batch_size)
            rows += [{**row, "labels": len(labels) if labels else len(engine.ner_model.config.labels)} for row in found]
    where = f"{args.device}" + ("" if args.device != "cpu" else f", {torch.get_num_threads()} threads")
    dtype = dtype_name(engine)
    print(f"\n{args.model} on {len(examples)} sentences of {args.data}, {dtype}, {where}")
    print_table(rows, ["batch", "labels", "variant", "f1", "ms_per_text", "p50_ms", "p90_ms", "texts_per_s", "forwards_per_text",
                       "tokens_fed_per_text", "speedup_vs_ar", "identical"])
    path = write_json(args.json, {"benchmark": "padellm_vs_ar", "model": args.model, "n_sentences": len(examples),
                                  "dtype": dtype, "device": args.device, "results": rows,
                                  "padellm_speedup_by_labels": speedups_by_labels(rows, "padellm_copy"),
                                  **({"padellm_floor_speedup_by_labels": speedups_by_labels(rows, "padellm_floor")}
                                     if args.past_count_floor is not None else {}),
                                  **({"padellm_quantile_speedup_by_labels": speedups_by_labels(rows, "padellm_quantile")}
                                     if args.count_quantile is not None else {})})
    labels = [f"b{r['batch']} {r['labels']}l {r['variant']}" for r in rows]
    png = bar_plots(path.with_suffix(".png"), labels, {
        "ms per text": [r["ms_per_text"] for r in rows],
        "speed-up over the faster AR": [r["speedup_vs_ar"] for r in rows],
        "forwards per text": [r["forwards_per_text"] for r in rows],
    }, f"PaDeLLM vs AR, {args.model}, {len(examples)} dev sentences, {where}")
    first = [r for r in rows if r["batch"] == min(r["batch"] for r in rows)]
    phases = phase_plot(path.with_name(path.stem + "_phases.png"), first, f"Where a text's time goes, batch {first[0]['batch']}, {where}")
    print(f"wrote {path}, {png} and {phases}")


if __name__ == "__main__":
    main()
