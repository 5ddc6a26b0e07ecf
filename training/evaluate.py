"""Span-level micro-F1 (exact start, end and label) and engine evaluation on a corpus."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from tqdm import tqdm

from ner_service.engine import ExtractOptions, NEREngine
from corpora import Example, Span

SpanKey = tuple[int, int, str]


def prf(tp: int, fp: int, fn: int) -> dict[str, float]:
    """Precision, recall and F1 (in %) of these counts, with the counts."""
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": 100 * precision, "recall": 100 * recall, "f1": 100 * f1, "tp": tp, "fp": fp, "fn": fn}


def span_f1(gold: Iterable[Iterable[SpanKey]], predicted: Iterable[Iterable[SpanKey]]) -> dict[str, object]:
    """Micro precision/recall/F1 (in %) over exact ``(start, end, label)`` matches, with per-label scores."""
    tp: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    for gold_spans, predicted_spans in zip(gold, predicted, strict=True):
        g, p = set(gold_spans), set(predicted_spans)
        for span in g & p:
            tp[span[2]] += 1
        for span in p - g:
            fp[span[2]] += 1
        for span in g - p:
            fn[span[2]] += 1
    labels = sorted(set(tp) | set(fp) | set(fn))
    micro = prf(sum(tp.values()), sum(fp.values()), sum(fn.values()))
    return {
        "micro_f1": micro["f1"],
        "precision": micro["precision"],
        "recall": micro["recall"],
        "per_label": {label: prf(tp[label], fp[label], fn[label]) for label in labels},
    }


def _key(span: Span) -> SpanKey:
    return (span.start, span.end, span.label)


@dataclass
class Predictions:
    """What an engine found in each example, and what it cost per batch."""

    entities: list[list[SpanKey]] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    forward_passes: list[int] = field(default_factory=list)
    unmatched_mentions: int = 0
    seconds: float = 0.0


def predict(engine: NEREngine, examples: Sequence[Example], options: ExtractOptions, batch_size: int = 1,
            progress: bool = True, deadline: float | None = None) -> Predictions:
    """Run the engine over ``examples`` in batches of ``batch_size`` texts; with ``deadline`` (a
    ``time.perf_counter()`` time), no batch starts after it but the first: the predictions are
    those of the first texts only (``len(entities)`` of them)."""
    out = Predictions()
    began = time.perf_counter()
    with tqdm(total=len(examples), desc=f"evaluate {options.strategy}/{options.decoder}", unit="text", disable=not progress) as bar:
        for start in range(0, len(examples), batch_size):
            if start and deadline is not None and time.perf_counter() >= deadline:
                break
            batch = examples[start:start + batch_size]
            results = engine.extract_with(options, [e.text for e in batch])
            out.entities.extend([(e.start, e.end, e.label) for e in r.entities] for r in results)
            out.latencies_ms.append(results[0].stats.latency_ms)  # the batch's, shared by its texts
            out.forward_passes.append(results[0].stats.forward_passes)
            out.unmatched_mentions += results[0].stats.unmatched_mentions
            bar.update(len(batch))
    out.seconds = time.perf_counter() - began
    return out


def _asked_of(options: ExtractOptions, example: Example, sources: Mapping[str, Collection[str]] | None) -> ExtractOptions:
    """``options`` with only the labels ``example``'s source annotates, where ``sources`` lists it."""
    if not sources or example.source not in sources:
        return options
    annotated = set(sources[example.source])
    kept = tuple(label for label in options.labels or () if label in annotated)
    return replace(options, labels=kept, descriptions=tuple(d for d in options.descriptions if d[0] in annotated))


def predict_asked(engine: NEREngine, examples: Sequence[Example], asked: Sequence[ExtractOptions], batch_size: int = 1,
                  progress: bool = True, deadline: float | None = None) -> Predictions:
    """:func:`predict` where each example has its own options (its source's labels): the examples of
    equal options run together, in batches of ``batch_size``; an example asked no label finds none
    (a ``deadline`` needs one set of options for all)."""
    if len(set(asked)) <= 1:
        return predict(engine, examples, asked[0], batch_size, progress, deadline) if examples else Predictions()
    if deadline is not None:
        raise ValueError("a deadline cuts the examples in order: it needs the same options for all of them")
    groups: dict[ExtractOptions, list[int]] = {}
    for index, options in enumerate(asked):
        groups.setdefault(options, []).append(index)
    out = Predictions(entities=[[] for _ in examples])
    for options, indices in groups.items():
        if not options.labels:
            continue
        found = predict(engine, [examples[i] for i in indices], options, batch_size, progress, deadline)
        for index, entities in zip(indices, found.entities):
            out.entities[index] = entities
        out.latencies_ms += found.latencies_ms
        out.forward_passes += found.forward_passes
        out.unmatched_mentions += found.unmatched_mentions
        out.seconds += found.seconds
    return out


def evaluate_engine(
    engine: NEREngine,
    examples: Sequence[Example],
    strategy: str | None = None,
    decoder: str | None = None,
    batch_size: int = 1,
    labels: Sequence[str] | None = None,
    progress: bool = True,
    deadline: float | None = None,
    sources: Mapping[str, Collection[str]] | None = None,
    flat_ner: bool = True,
) -> dict[str, object]:
    """Run the engine over ``examples`` and score it; latency is per batch of ``batch_size`` texts.
    ``labels``, ``strategy`` and ``decoder`` are validated by :meth:`NEREngine.options` (None: the default);
    ``deadline``: see :func:`predict` (``n_sentences`` says how many texts were scored); ``sources``:
    the labels each source annotates, under the names asked (a corpus's ``sources.json``): a
    record of a listed source is asked, and scored on, only those of the labels asked;
    ``flat_ner`` False: overlapping entities kept, for corpora that nest them."""
    options = engine.options(labels, strategy, decoder, flat_ner)
    asked = [_asked_of(options, e, sources) for e in examples]
    found = predict_asked(engine, examples, asked, batch_size, progress, deadline)
    scored = examples[: len(found.entities)]
    wanted = [set(each.labels or ()) for each in asked]
    gold = [[_key(s) for s in e.spans if s.label in labels] for e, labels in zip(scored, wanted)]
    scores = span_f1(gold, found.entities)
    ordered = sorted(found.latencies_ms) or [0.0]
    return {
        **scores,
        "n_sentences": len(scored),
        "strategy": options.strategy,
        "decoder": options.decoder,
        "batch_size": batch_size,
        "latency_ms": {
            "mean": statistics.fmean(ordered),
            "p50": ordered[len(ordered) // 2],
            "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        },
        "forward_passes_mean": statistics.fmean(found.forward_passes) if found.forward_passes else 0.0,
        "unmatched_mentions": found.unmatched_mentions,
        "seconds": found.seconds,
    }


def dev_scores(engine: NEREngine, dev: Sequence[Example], strategies: Iterable[str], batch_size: int = 16,
               progress: bool = False, deadline: float | None = None) -> dict[str, dict[str, float]]:
    """Micro-F1, precision, recall and the number of texts of each strategy on ``dev`` (those
    scored by ``deadline``, see :func:`predict`): what a training run records of the model it made."""
    scores = {strategy: evaluate_engine(engine, dev, strategy=strategy, batch_size=batch_size, progress=progress, deadline=deadline)
              for strategy in strategies}
    return {strategy: {key: result[key] for key in ("micro_f1", "precision", "recall", "n_sentences")} for strategy, result in scores.items()}
