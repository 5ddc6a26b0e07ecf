"""Score an open-label model, or a snapshot of an open run, on labels it never trained on.

The zero-shot dev is :data:`training.open_data.ZERO_SHOT_CORPORA` (``--held-out``: those a run held
out): whole corpora of other domains and languages, each asked every name of its own label set, lower-cased; the supervised sets are
CoNLL-03 and Resume dev asked their labels by plain name. ``python -m training.open_eval`` scores
a model folder, or every snapshot of a run (quality against training minutes), and appends one
JSON line per scored model to ``--json``. ``--calibrate`` fits an open model's score map where it
will be used, on labels it never trained on (:func:`calibrate_open_model`). ``--seen`` scores
corpora it trained on, asked the same way: what its zero-shot figures are measured against.
The zero-shot answers are also scored apart by the names asked (``by_name``): names the model
trained on, in other domains, and names it never read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from corpora import Example, Span, read_corpus
from corpora.dev_halves import dev_halves
from ner_service.engine import NEREngine, NERModel
from training.count_calibration import QUANTILE_GRID, EntitiesByCounts, best_quantile, count_scores
from training.evaluate import evaluate_engine, prf
from training.open_data import SUPERVISED_NAMES, ZERO_SHOT_CORPORA, Catalogue, ZeroShotSet, seen_corpora_problem, trained_names, zero_shot_sets

SUPERVISED_DEV = {"conll2003": "conll2003/dev.txt", "resume": "resume/dev.txt"}


def named(examples: list[Example], names: dict[str, str]) -> list[Example]:
    """``examples`` with their spans under the names a query writes (spans of other labels dropped)."""
    return [Example(e.text, [Span(s.start, s.end, names[s.label]) for s in e.spans if s.label in names]) for e in examples]


def score_open_model(engine: NEREngine, data: Path, limit: int, supervised_limit: int, batch_size: int = 16,
                     described: str | None = None, flat_ner: bool = True, skip: int = 0,
                     held_out: Sequence[str] = ZERO_SHOT_CORPORA) -> dict:
    """Micro-F1 (precision, recall) of each zero-shot corpus (its ``limit`` texts after the first
    ``skip``: 0 the reported texts, 100 the choosing ones) and of each supervised dev (first
    ``supervised_limit`` texts; None: all), and the zero-shot average; ``described`` "all": the
    zero-shot labels asked with their definitions from labels.tsv as descriptions, where they have
    one, "new": only the names the model never trained on; ``flat_ner`` False: overlapping entities kept;
    ``held_out``: the corpora the model never trained on, the zero-shot ones."""
    trained = trained_names(data / "open", held_out)
    held_outs = [replace(h, examples=h.examples[skip:]) for h in zero_shot_sets(data / "open", skip + limit, corpora=held_out)]
    asked = [(h.corpus, h.examples, h.asked(described is not None, bare=trained if described == "new" else ()), h.split)
             for h in held_outs]
    for corpus, relative in SUPERVISED_DEV.items():
        examples = named(read_corpus(str(data / relative))[:supervised_limit], SUPERVISED_NAMES[corpus])
        asked.append((corpus, examples, sorted(set(SUPERVISED_NAMES[corpus].values())), "dev"))
    scores = _scores(engine, asked, batch_size, flat_ner)
    zero_shot = statistics.fmean(scores[h.corpus]["micro_f1"] for h in held_outs)
    return {"zero_shot_average": round(zero_shot, 2), "by_name": by_name(scores, held_outs, trained), "scores": scores}


def by_name(scores: dict[str, dict], held_outs: Sequence[ZeroShotSet], trained: set[str]) -> dict[str, dict]:
    """Micro precision, recall and F1 over every zero-shot corpus, apart for the labels asked by a
    name the model trained on (in another domain: "person", "disease") and by one it never read
    ("weapon", "river"): what the zero-shot average holds of each."""
    totals: dict[str, Counter[str]] = {"trained names": Counter(), "new names": Counter()}
    for held_out in held_outs:  # its labels are lower-cased, as trained names are
        for label in held_out.labels:
            totals["trained names" if label in trained else "new names"].update(scores[held_out.corpus]["per_label"].get(label, {}))
    return {kind: {key: round(value, 2) for key, value in prf(counts["tp"], counts["fp"], counts["fn"]).items()}
            for kind, counts in totals.items()}


def score_seen_corpora(engine: NEREngine, data: Path, corpora: Sequence[str], limit: int, batch_size: int = 16,
                       flat_ner: bool = True) -> dict:
    """Micro-F1 of corpora the model trained on, their first ``limit`` dev texts asked as the
    zero-shot corpora are asked (every name of the corpus): the same questions on labels it has
    seen, what its zero-shot average is measured against."""
    sets = zero_shot_sets(data / "open", limit, corpora=corpora)
    scores = _scores(engine, [(s.corpus, s.examples, s.labels, s.split) for s in sets], batch_size, flat_ner)
    return {"seen_average": round(statistics.fmean(score["micro_f1"] for score in scores.values()), 2), "scores": scores}


def _scores(engine: NEREngine, asked: list[tuple[str, list[Example], list, str]], batch_size: int, flat_ner: bool = True) -> dict[str, dict]:
    """Micro-F1, precision and recall of each (corpus, examples, labels asked, split)."""
    scores: dict[str, dict] = {}
    with tqdm(total=sum(len(examples) for _, examples, _, _ in asked), desc="open eval", unit="text") as bar:
        for corpus, examples, labels, split in asked:
            bar.set_postfix_str(corpus)
            report = evaluate_engine(engine, examples, labels=labels, batch_size=batch_size, progress=False, flat_ner=flat_ner)
            scores[corpus] = {"micro_f1": round(report["micro_f1"], 2), "precision": round(report["precision"], 2),
                              "recall": round(report["recall"], 2), "texts": len(examples), "split": split,
                              "per_label": {label: {k: found[k] for k in ("tp", "fp", "fn")} for label, found in report["per_label"].items()}}
            bar.update(len(examples))
    return scores


def choosing_and_reported(data: Path, limit: int, choose_limit: int,
                          held_out: Sequence[str] = ZERO_SHOT_CORPORA) -> list[tuple[ZeroShotSet, ZeroShotSet]]:
    """Per held-out corpus: the texts a setting is chosen on (the ``choose_limit`` after the first
    ``limit``) and the first ``limit``, the reported ones, asked as :func:`score_open_model` asks them
    (a corpus of more names than one request takes is asked those its sample holds)."""
    reported = {part.corpus: part for part in zero_shot_sets(data / "open", limit, corpora=held_out)}
    return [(replace(part, examples=part.examples[limit:]), reported[part.corpus])
            for part in zero_shot_sets(data / "open", limit + choose_limit, corpora=held_out)]


def calibrate_open_model(engine: NEREngine, data: Path, limit: int, batch_size: int = 16, held_out: Sequence[str] = ZERO_SHOT_CORPORA):
    """The PaDeLLM score map of an open model (an engine giving raw scores), fitted where its users
    ask: on each zero-shot corpus's texts ``limit`` to ``2 * limit`` and the first ``limit`` texts of
    CoNLL-03's and Resume's choosing halves, each asked its own names; measured on what the scores
    are reported on, each zero-shot corpus's first ``limit`` texts and the reporting halves'. A map
    that makes the reporting texts' ECE worse is not kept (:func:`training.score_calibration.fit_where_it_carries`)."""
    from training.score_calibration import measured_calibration, scored_mentions

    asked = [(h.examples[limit:], h.examples[:limit], h.labels) for h in zero_shot_sets(data / "open", 2 * limit, corpora=held_out)]
    for corpus, relative in SUPERVISED_DEV.items():
        halves = dev_halves(data / relative)
        asked.append((named(halves.choose[:limit], SUPERVISED_NAMES[corpus]), named(halves.report[:limit], SUPERVISED_NAMES[corpus]),
                      sorted(set(SUPERVISED_NAMES[corpus].values()))))
    choose, report, gold = [], [], 0
    for choosing, reporting, labels in asked:
        options = engine.options(labels)
        choose += scored_mentions(engine, choosing, options, batch_size, "choose")[0]
        found, total = scored_mentions(engine, reporting, options, batch_size, "report")
        report, gold = report + found, gold + total
    return measured_calibration("padellm", choose, report, gold)


@dataclass(frozen=True)
class OpenQuantileChoice:
    """One count quantile for an open model, chosen where its users ask it labels it never saw: the
    zero-shot average micro-F1 on each held-out corpus's texts after the first ``limit`` under each
    quantile tried (``tried``) and under the model's own rule (``choose_before``), and on the first
    ``limit`` texts, the ones reported, under the chosen quantile and the model's rule (per corpus)."""

    tried: dict[float, float]
    chosen: float
    was: float | None
    choose_before: float
    report: dict[str, tuple[float, float]]  # corpus: (the model's rule, the chosen quantile)

    @property
    def report_before(self) -> float:
        return statistics.fmean(before for before, _ in self.report.values())

    @property
    def report_after(self) -> float:
        return statistics.fmean(after for _, after in self.report.values())

    @property
    def carried(self) -> bool:
        return self.report_after > self.report_before

    def setting(self) -> float | None:
        """The model's ``count_quantile`` after this choice: the chosen one where it carries."""
        return self.chosen if self.carried else self.was

    def table(self) -> str:
        was = "its count bias" if self.was is None else f"count quantile {self.was:g}"
        lines = ["| count quantile | zero-shot average, choosing texts |", "| --- | --- |", f"| the model's ({was}) | {self.choose_before:.2f} |"]
        lines += [f"| {q:g}{' (chosen)' if q == self.chosen else ''} | {f1:.2f} |" for q, f1 in self.tried.items()]
        lines += ["", f"| reported texts | the model's rule | count quantile {self.chosen:g} |", "| --- | --- | --- |"]
        lines += [f"| {corpus} | {before:.2f} | {after:.2f} |" for corpus, (before, after) in self.report.items()]
        lines += [f"| **average** | **{self.report_before:.2f}** | **{self.report_after:.2f}** |", "",
                  "kept" if self.carried else "not kept: it does not carry to the reported texts"]
        return "\n".join(lines)


def choose_open_quantile(engine: NEREngine, data: Path, limit: int, choose_limit: int | None = None, batch_size: int = 16,
                         grid: Sequence[float] = QUANTILE_GRID, held_out: Sequence[str] = ZERO_SHOT_CORPORA) -> OpenQuantileChoice:
    """The count quantile of ``grid`` with the best zero-shot average on the ``choose_limit`` texts
    (None: ``limit``) after each held-out corpus's first ``limit`` (asked its own names), scored on
    those first ``limit`` against the model's own rule (:class:`OpenQuantileChoice`). A text's
    entities follow from its counts, so each quantile runs the engine only on the texts whose
    counts it changes."""
    pairs = choosing_and_reported(data, limit, limit if choose_limit is None else choose_limit, held_out)
    choosing: dict[str, dict[float | None, float]] = {}
    reporting: list[tuple[str, EntitiesByCounts, dict[str, float]]] = []
    with tqdm(total=len(pairs) * (len(grid) + 1), desc="count quantile", unit="try") as bar:
        for pair in pairs:
            parts = []
            for part in pair:
                scores = count_scores(engine, part.examples, batch_size, progress=False, labels=part.labels)
                parts.append((EntitiesByCounts(engine, part.examples, scores, batch_size, part.labels),
                              {label: engine.count_bias.for_label(label) for label in part.labels}))
            corpus = pair[0].corpus
            choosing[corpus] = {}
            for quantile in (engine.count_quantile, *grid):
                choosing[corpus][quantile] = float(parts[0][0].f1(parts[0][1], quantile=quantile)["micro_f1"])
                bar.update(1)
            reporting.append((corpus, *parts[1]))
    tried = {q: statistics.fmean(f1s[q] for f1s in choosing.values()) for q in grid}
    chosen = best_quantile(tried)
    choose_before = statistics.fmean(f1s[engine.count_quantile] for f1s in choosing.values())
    report = {corpus: (float(found.f1(biases, quantile=engine.count_quantile)["micro_f1"]), float(found.f1(biases, quantile=chosen)["micro_f1"]))
              for corpus, found, biases in tqdm(reporting, desc="reported texts", unit="corpus")}
    return OpenQuantileChoice(tried, chosen, engine.count_quantile, choose_before, report)


def snapshot_engine(run_output: Path, snapshot: Path | None, count_quantile: float | None = None) -> tuple[NEREngine, dict]:
    """The engine of a run's snapshot: the run's starting model with the snapshot's trained weights
    (None: the starting model as it is, asked as an open model: the baseline that never saw open
    labels, or for a run that trains an adapter further, that adapter as the run began), counting
    by ``count_quantile`` where given (0: the count bias) and by the run's model's rule otherwise."""
    import torch

    from ner_service.engine.ner_model import load_base
    from training.configs import OpenTrainConfig
    from training.loss import inner_model
    from training.model_merge import add_model_changes
    from training.open_trainer import open_ner_config
    from training.trainer import prepare_model

    config = OpenTrainConfig(**json.loads((run_output / "run_config.json").read_text(encoding="utf-8")))
    if config.full:
        model, tokenizer = load_base(config.base)
        add_model_changes(model, config.base, config.merged_with)
    else:  # a LoRA run: its snapshots hold the adapter's weights, under the names of the model it wraps
        model, tokenizer, _ = prepare_model(replace(config, device="cpu", resume=False))
    saved = {"seconds": 0, "step": 0}
    if snapshot is not None:
        saved = torch.load(snapshot, weights_only=False)
        missing = set(saved["params"]) - {name for name, _ in inner_model(model).named_parameters()}
        if missing:
            raise ValueError(f"{snapshot}: weights the model lacks: {sorted(missing)[:3]}")
        inner_model(model).load_state_dict({name: value.float() for name, value in saved["params"].items()}, strict=False)
    if not config.full:
        model = model.merge_and_unload()
    return NEREngine(NERModel(model.eval(), tokenizer, open_ner_config(config, tokenizer), run_output), count_quantile=count_quantile), saved


def add_held_out_argument(parser: argparse.ArgumentParser) -> None:
    """``--held-out``: the corpora a model never trained on, scored as its zero-shot dev."""
    parser.add_argument("--held-out", default=",".join(ZERO_SHOT_CORPORA), metavar="CORPUS,...",
                        help="the corpora of open/ the model never trained on, its zero-shot dev (default: the recipe's, %(default)s)")


def held_out_corpora(parser: argparse.ArgumentParser, data: Path, written: str) -> list[str]:
    """The corpora of ``--held-out``; a clear exit 2 unless each is a corpus of ``data``/open."""
    held_out = [name.strip() for name in written.split(",") if name.strip()]
    unknown = sorted(set(held_out) - set(Catalogue.read(data / "open").corpora())) if (data / "open").is_dir() else []
    if not held_out:
        parser.error(f"--held-out: name at least one corpus of {data / 'open'}")
    if unknown:
        parser.error(f"--held-out: corpora of {data / 'open'}, not {unknown}")
    return held_out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="an open model (a shipped name or folder), or a run's output folder with snapshots/")
    parser.add_argument("--data", default="../shared/data", help="the folder holding open/, conll2003/ and resume/")
    parser.add_argument("--limit", type=int, default=100, help="texts of each zero-shot corpus (default: %(default)s)")
    parser.add_argument("--supervised-limit", type=int, default=None, help="texts of each supervised dev (default: all)")
    parser.add_argument("--snapshot", default=None, help="score only this snapshot of the run (default: every one not yet in --json)")
    parser.add_argument("--baseline", action="store_true", help="score the run's starting model instead, asked as an open model")
    parser.add_argument("--json", default=None, help="append one JSON line per scored model to this file")
    parser.add_argument("--seen", default=None, metavar="CORPUS,...", help="score these corpora trained on instead (their dev texts, "
                                                                           "asked as the zero-shot corpora are: labels seen in training)")
    parser.add_argument("--described", nargs="?", const="all", choices=("all", "new"), default=None,
                        help="ask each zero-shot label with its one-line definition from labels.tsv as its description (where it "
                             "has one); 'new': only the names the model never trained on")
    parser.add_argument("--skip", type=int, default=0, help="score each zero-shot corpus's --limit texts after the first SKIP "
                                                            "(100 with --limit 50: the texts settings are chosen on)")
    parser.add_argument("--flat-ner", action=argparse.BooleanOptionalAction, default=True,
                        help="entities never overlap (default); --no-flat-ner keeps every label's, as corpora that nest them "
                             "or give a span two labels are annotated (sofc_exp, gum)")
    parser.add_argument("--calibrate", action="store_true", help="fit the model's score map instead (zero-shot texts --limit to twice "
                                                                 "that and the supervised choosing halves; measured on the texts scored)")
    parser.add_argument("--choose-quantile", action="store_true", help="choose the model's count quantile instead, on the "
                                                                       "--choose-limit zero-shot texts after the first --limit; reported on those")
    parser.add_argument("--choose-limit", type=int, default=None, help="with --choose-quantile: texts of each corpus it is chosen on "
                                                                      "(default: --limit)")
    parser.add_argument("--quantiles", default=",".join(map(str, QUANTILE_GRID)), help="with --choose-quantile: those tried "
                                                                                        "(default: %(default)s)")
    parser.add_argument("--count-quantile", type=float, default=None, metavar="Q",
                        help="score (or compare with) this count quantile in place of the model's rule (0: its count bias)")
    add_held_out_argument(parser)
    parser.add_argument("--write", action="store_true", help="with --calibrate or --choose-quantile: write the map or the quantile "
                                                             "into the model's ner_model.json")
    args = parser.parse_args(argv)
    if args.skip < 0:
        parser.error(f"--skip: a number of texts, 0 or more, not {args.skip}")
    data, target = Path(args.data), Path(args.model)
    held_out = held_out_corpora(parser, data, args.held_out)

    def load_model() -> NEREngine:
        return NEREngine.load(args.model, dtype="auto", count_quantile=args.count_quantile)

    if args.seen:
        corpora = [name.strip() for name in args.seen.split(",") if name.strip()]
        problem = seen_corpora_problem(data / "open", corpora, held_out)
        if problem:
            parser.error(f"--seen: {problem}")
        scores = score_seen_corpora(load_model(), data, corpora, args.limit, flat_ner=args.flat_ner)
        print(json.dumps({"model": str(target), "flat_ner": args.flat_ner, **scores}, ensure_ascii=False), flush=True)
        return 0
    if args.calibrate:
        return _calibrate(args.model, data, args.limit, args.write, held_out)
    if args.choose_quantile:
        from ner_service.engine.count_bias import parse_quantiles

        try:
            grid = parse_quantiles(args.quantiles)
        except ValueError as error:
            parser.error(f"--quantiles: {error}")
        return _choose_quantile(args.model, data, args.limit, args.choose_limit, grid, args.count_quantile, args.write, held_out)
    done = set()
    if args.json and Path(args.json).is_file():
        done = {json.loads(line).get("snapshot") for line in Path(args.json).read_text(encoding="utf-8").splitlines() if line.strip()}
    if args.baseline:
        jobs = [(None, lambda: snapshot_engine(target, None, args.count_quantile))]
    elif (target / "snapshots").is_dir():
        snapshots = [Path(args.snapshot)] if args.snapshot else sorted((target / "snapshots").glob("snapshot-*.pt"))
        jobs = [(s, lambda s=s: snapshot_engine(target, s, args.count_quantile)) for s in snapshots if s.name not in done]
    else:
        jobs = [(None, lambda: (load_model(), {}))]
    for snapshot, load in jobs:
        began = time.perf_counter()
        engine, saved = load()
        result = {"model": str(target), "snapshot": snapshot.name if snapshot else ("baseline" if args.baseline else None),
                  "train_minutes": round(saved.get("seconds", 0) / 60, 1) if saved else None, "step": saved.get("step") if saved else None,
                  "described": args.described, "flat_ner": args.flat_ner,
                  "skip": args.skip, **score_open_model(engine, data, args.limit, args.supervised_limit, described=args.described,
                                                        flat_ner=args.flat_ner, skip=args.skip, held_out=held_out),
                  "eval_seconds": round(time.perf_counter() - began)}
        print(json.dumps(result, ensure_ascii=False), flush=True)
        if args.json:
            with open(args.json, "a", encoding="utf-8") as out:
                out.write(json.dumps(result, ensure_ascii=False) + "\n")
    return 0


def write_settings(model: str, engine: NEREngine, **settings: object) -> None:
    """Store chosen ``settings`` in the model's ``ner_model.json`` (its config as ``engine`` read it, with them)."""
    from ner_service.engine.ner_model import resolve_ner_model

    folder = resolve_ner_model(model)
    replace(engine.ner_model.config, **settings).write(folder)
    print(f"written to {folder / 'ner_model.json'}")


def _chosen(model: str, engine: NEREngine, field: str, setting: object, write: bool) -> int:
    """Print a chosen setting and, with ``write``, store it in the model's ``ner_model.json``."""
    print(f"{field}: {json.dumps(setting)}")
    if write:
        write_settings(model, engine, **{field: setting})
    return 0


def _calibrate(model: str, data: Path, limit: int, write: bool, held_out: Sequence[str]) -> int:
    from training.score_calibration import calibration_setting, calibration_table

    engine = NEREngine.load(model, dtype="auto", calibrated_scores=False)
    found = calibrate_open_model(engine, data, limit, held_out=held_out)
    print(calibration_table([found]))
    return _chosen(model, engine, "score_calibration", calibration_setting(engine.ner_model.config.score_calibration, [found]), write)


def _choose_quantile(model: str, data: Path, limit: int, choose_limit: int | None, grid: list[float], count_quantile: float | None,
                     write: bool, held_out: Sequence[str]) -> int:
    engine = NEREngine.load(model, dtype="auto", count_quantile=count_quantile)
    choice = choose_open_quantile(engine, data, limit, choose_limit, grid=grid, held_out=held_out)
    print(choice.table())
    return _chosen(model, engine, "count_quantile", choice.setting(), write)


if __name__ == "__main__":
    raise SystemExit(main())
