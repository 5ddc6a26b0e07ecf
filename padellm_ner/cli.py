"""The ``padellm-ner`` command line: extract, evaluate, models, prepare (and the commands of
the API, the pipeline and the trainers, registered from their own modules)."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from padellm_ner import one_shot

#: Modules that add sub-commands: each defines ``register(subparsers)``, whose ``add_parser``
#: takes ``options=``, a function adding the sub-command's options when it is called (:class:`CommandParser`).
COMMAND_MODULES: list[str] = [
    "pipeline.cli", "padellm_ner.serve", "training.train_cli", "training.diffusion_cli", "training.lud_cli",
]


class CommandParser(argparse.ArgumentParser):
    """An argument parser that adds its options (``options``, a function of the parser) when it
    first parses. Every command imports what it needs when it runs, and a sub-command whose
    options need torch to be described (the decoders and strategies of ``extract``) adds them
    only when it is called: ``padellm-ner --help``, ``models`` or ``recipes`` do not load torch."""

    def __init__(self, *args: Any, options: Callable[[argparse.ArgumentParser], None] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._add_options = options

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        if self._add_options is not None:
            add, self._add_options = self._add_options, None
            add(self)
        return super().parse_known_args(args, namespace)


def _engine(args: argparse.Namespace):
    from ner_service.engine import NEREngine
    from ner_service.engine.cpu import configure_threads

    configure_threads(args.threads)
    engine = NEREngine.load(args.model, dtype=args.dtype, device=args.device, count_bias=_count_bias(args),
                            repair_duplicates=args.repair_duplicates, repair_unaligned=args.repair_unaligned,
                            document_consistency=args.document_consistency, restricted_output=not args.whole_output_layer,
                            past_count_rounds=args.past_count_rounds, past_count_floor=args.past_count_floor,
                            count_quantile=args.count_quantile)
    one_shot.loaded()
    return engine


def _count_bias(args: argparse.Namespace):
    """The model's count bias with ``--count-bias`` applied (None: the model's as it is)."""
    from ner_service.engine import NERModelConfig
    from ner_service.engine.count_bias import CountBias
    from ner_service.engine.ner_model import resolve_ner_model

    if args.count_bias is None:
        return None
    config = NERModelConfig.read(resolve_ner_model(args.model))
    return CountBias.of(config.count_bias).overridden(args.count_bias, config.labels)


def _options(args: argparse.Namespace):
    """The run's :class:`ExtractOptions`, validated against the model."""
    from ner_service.engine import ExtractOptions, NERModelConfig
    from ner_service.engine.ner_model import resolve_ner_model

    labels = _labels(args)
    options = ExtractOptions(args.model, tuple(labels) if labels is not None else None, args.strategy, args.decoder,
                             flat_ner=args.flat_ner)
    return options.validated(NERModelConfig.read(resolve_ner_model(args.model)))


def _add_engine_options(parser: argparse.ArgumentParser) -> None:
    from general_decoding import available_decoders
    from ner_service.engine import DEFAULT_DECODER, DEFAULT_MODEL, DEFAULT_STRATEGY, available_strategies
    from ner_service.engine.defaults import PAST_COUNT_ROUNDS

    parser.add_argument("--model", default=DEFAULT_MODEL, help="shipped model name or model folder (default: %(default)s)")
    parser.add_argument("--strategy", default=None, help=f"how the model is asked (default {DEFAULT_STRATEGY}): {', '.join(available_strategies())}")
    parser.add_argument("--decoder", default=None, help=f"how the answers' tokens are produced (default {DEFAULT_DECODER}): "
                                                        f"{', '.join(available_decoders())}")
    parser.add_argument("--labels", default=None,
                        help="comma-separated subset of the model's labels; an open-label model takes any names, also as a JSON list "
                             'of names and {"name": ..., "description": ...} objects (default: the model\'s labels)')
    parser.add_argument("--flat-ner", action=argparse.BooleanOptionalAction, default=True,
                        help="entities never overlap (default); --no-flat-ner keeps every label's: spans may nest and one span "
                             "may carry several labels (for corpora annotated so)")
    parser.add_argument("--device", default="cpu")
    _add_cpu_options(parser)
    parser.add_argument("--whole-output-layer", action="store_true",
                        help="PaDeLLM: compute count and mention logits over the whole vocabulary, as before issue 78 (default: over the "
                             "tokens an answer may take: digits and stops, the text's own tokens and stops)")
    parser.add_argument("--count-bias", default=None,
                        help="PaDeLLM: favour larger counts by this much log-probability per unit of a count, for every label (0.5) "
                             "or some (ORG=1,MISC=0.75; the others keep the model's) (default: the model's count_bias)")
    parser.add_argument("--count-quantile", type=float, default=None, metavar="Q",
                        help="PaDeLLM: each count is the largest the model gives at least probability Q of being reached, for "
                             "every label, in place of the count bias (0: the count bias; default: the model's count_quantile)")
    parser.add_argument("--no-repair-duplicates", dest="repair_duplicates", action="store_false",
                        help="PaDeLLM: keep a mention answered more often than the text holds it instead of re-asking it")
    parser.add_argument("--repair-unaligned", action=argparse.BooleanOptionalAction, default=None,
                        help="PaDeLLM: re-ask a mention that is not in the text, restricted to the text's spans (default: the model's)")
    parser.add_argument("--past-count-rounds", type=int, default=PAST_COUNT_ROUNDS, metavar="N",
                        help="PaDeLLM on a model trained past its counts: ask up to N more mentions past a count, one after another, "
                             "while the model answers a new one (0: only the one past it; default: %(default)s)")
    parser.add_argument("--past-count-floor", type=float, default=None, metavar="P",
                        help="PaDeLLM on a model trained past its counts: ask the mention past a label's count only where the model "
                             "gives a further mention at least this probability (0: always; default: the model's past_count_floor)")
    parser.add_argument("--document-consistency", action=argparse.BooleanOptionalAction, default=None,
                        help="a name found in a text keeps one label throughout it and is tagged wherever it recurs (default: the model's)")


def _add_cpu_options(parser: argparse.ArgumentParser) -> None:
    from ner_service.engine.cpu import DTYPES, configured_dtype

    parser.add_argument("--dtype", default=configured_dtype(), choices=DTYPES,
                        help="auto: bfloat16 on a CPU with bfloat16 instructions (AVX512_BF16 or AMX) or a GPU, else float32 "
                             "(default: NER_DTYPE, else auto)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: NER_THREADS, else the CPUs this process may use: its affinity and cgroup quota)")


def _labels(args: argparse.Namespace) -> list[object] | None:
    """``--labels``: comma-separated names, or a JSON list of names and ``{"name", "description"}`` objects."""
    if not args.labels:
        return None
    if args.labels.lstrip().startswith("["):
        try:
            entries = json.loads(args.labels)
        except json.JSONDecodeError as error:
            raise SystemExit(f"error: --labels is not a valid JSON list: {error.msg}") from None
        if not isinstance(entries, list):
            raise SystemExit("error: --labels as JSON must be a list")
        return entries
    return [label.strip() for label in args.labels.split(",") if label.strip()]


def cmd_extract(args: argparse.Namespace) -> int:
    """One JSON line per text (``{"text", "entities", "stats"}``), in the order given, however
    many texts: the output of one text and of a thousand is read the same way. Without
    ``--model``, a Chinese text goes to the Chinese model, and stderr says so."""
    from ner_service.engine.languages import guess_language
    from ner_service.engine.ner_model import DEFAULT_MODEL, default_model_for_language
    from ner_service.engine.results import checked_threshold

    threshold = checked_threshold(args.threshold)
    texts = args.text or [line.rstrip("\n") for line in sys.stdin]
    if args.model is None:
        chinese = default_model_for_language("zh")
        models = [chinese if guess_language(text) == "zh" else DEFAULT_MODEL for text in texts] or [DEFAULT_MODEL]
        if chinese in models:
            print(f"padellm-ner: {models.count(chinese)} of {len(texts)} text(s) in Chinese: model {chinese} "
                  f"(the others {DEFAULT_MODEL}; --model chooses one)", file=sys.stderr)
    else:
        models = [args.model] * len(texts)
    results: dict[int, object] = {}
    for model in dict.fromkeys(models):
        args.model = model
        options, engine = _options(args), _engine(args)
        _note_unfamiliar(model, options.unfamiliar_labels(engine.ner_model.config))
        indices = [i for i, m in enumerate(models) if m == model]
        results.update(zip(indices, engine.extract_with(options, [texts[i] for i in indices])))
    for index, text in enumerate(texts):
        print(json.dumps({"text": text, **results[index].above(threshold).to_dict()}, ensure_ascii=False))
    return 0


def _note_unfamiliar(model: str, names: list[str]) -> None:
    """Tell stderr which labels an open model never trained on (:func:`ner_service.engine.labels.unfamiliar_names`)."""
    from ner_service.engine.labels import unfamiliar_note

    if names:
        print(f"padellm-ner: {unfamiliar_note(model, names)}", file=sys.stderr)


def _asked_as(args: argparse.Namespace, examples: list) -> list:
    """An open-label model is asked the file's own labels (all of them unless ``--labels`` names
    some), each under the name ``--ask-as`` gives it (``PER=person``): the examples come back with
    their spans under the names asked, and ``args.labels`` names them."""
    from corpora import Example, Span, labels_of
    from ner_service.engine import NERModelConfig
    from ner_service.engine.ner_model import resolve_ner_model

    if not NERModelConfig.read(resolve_ner_model(args.model)).open_labels:
        if args.ask_as:
            raise SystemExit(f"error: --ask-as is for open-label models; {args.model} answers its own labels only")
        return examples
    renamed: dict[str, str] = {}
    for pair in (args.ask_as or "").split(","):
        if pair.strip():
            label, equals, name = pair.partition("=")
            if not equals or not label.strip() or not name.strip():
                raise SystemExit(f"error: --ask-as takes LABEL=name pairs, got {pair.strip()!r}")
            renamed[label.strip()] = name.strip()
    scored = [str(label) for label in _labels(args) or labels_of(examples)]
    args.labels = ",".join(renamed.get(label, label) for label in scored)
    args.asked_as = renamed
    return [Example(e.text, [Span(s.start, s.end, renamed.get(s.label, s.label)) for s in e.spans if s.label in scored], e.source)
            for e in examples]


def _annotated_by_source(args: argparse.Namespace, examples: list) -> dict[str, list[str]] | None:
    """The labels each source of the file annotates, under the names asked (``sources.json`` beside a
    JSONL file of several sources), so that a record is scored on its own source's labels only."""
    from corpora import read_sources

    sources = read_sources(args.path)
    if not sources or len({tuple(labels) for labels in sources.values()}) < 2:
        return None  # one list for every record: asking all the labels is asking each its own
    renamed = getattr(args, "asked_as", {})
    unlisted = sorted({e.source or "(none)" for e in examples} - set(sources))
    if unlisted:
        raise SystemExit(f"error: {args.path}: records of source(s) {', '.join(unlisted[:5])} that sources.json does not list")
    if not args.json:
        print(f"each record asked the labels its own source annotates ({len(sources)} sources in sources.json)", file=sys.stderr)
    return {source: [renamed.get(label, label) for label in labels] for source, labels in sources.items()}


def cmd_evaluate(args: argparse.Namespace) -> int:
    from corpora import read_conll_documents, read_corpus
    from corpora.dev_halves import dev_halves
    from training.evaluate import evaluate_engine

    separator = {"newline": "\n", "space": " "}.get(args.documents)
    if args.half and separator:
        raise SystemExit("error: --half reads sentences; it cannot be combined with --documents")
    examples = (read_conll_documents(args.path, separator) if separator else
                dev_halves(args.path, nested=True).half(args.half) if args.half else read_corpus(args.path, nested=True))[: args.limit]
    examples = _asked_as(args, examples)
    options = _options(args)
    engine = _engine(args)
    sources = _annotated_by_source(args, examples)
    report = evaluate_engine(engine, examples, strategy=options.strategy, decoder=options.decoder, batch_size=args.batch_size,
                             labels=options.labels, sources=sources, flat_ner=options.flat_ner)
    report["model"] = engine.name
    breakdown = None
    if args.errors:
        from training.error_analysis import padellm_errors

        breakdown = padellm_errors(engine, examples, options, batch_size=max(args.batch_size, 16))
        report["errors"] = breakdown.to_dict()
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
        return 0
    print(f"{engine.name} {options.strategy}/{options.decoder}: micro-F1 {report['micro_f1']:.2f} "
          f"(P {report['precision']:.2f}, R {report['recall']:.2f}) on {report['n_sentences']} texts; "
          f"latency mean {report['latency_ms']['mean']:.0f} ms per batch of {args.batch_size}")
    for label, s in report["per_label"].items():
        print(f"  {label:>10}: P {s['precision']:6.2f}  R {s['recall']:6.2f}  F1 {s['f1']:6.2f}")
    if breakdown is not None:
        print(breakdown.table())
    return 0


def cmd_calibrate_counts(args: argparse.Namespace) -> int:
    from ner_service.engine import NEREngine
    from ner_service.engine.cpu import configure_threads
    from ner_service.engine.count_bias import parse_quantiles
    from training.count_calibration import QUANTILE_GRID, calibrate_on_halves, calibrate_quantile_on_halves

    configure_threads(args.threads)
    grid = parse_quantiles(args.quantiles) if args.quantiles else QUANTILE_GRID  # a bad one: a ValueError, exit 2 (main)
    engine = NEREngine.load(args.model, dtype=args.dtype, device=args.device, count_bias=_count_bias(args), count_quantile=args.count_quantile)
    if args.quantile:  # one number for every label, chosen on one half, reported on the other
        quantile = calibrate_quantile_on_halves(engine, args.path, args.batch_size, args.limit, grid=grid)
        print(quantile.table())
        return _chosen_setting(args, engine, "count_quantile", quantile.setting())
    if engine.count_quantile is not None:
        raise SystemExit(f"error: model {engine.name!r} reads its counts by count quantile {engine.count_quantile:g}: choose biases "
                         "with --count-quantile 0, or a quantile with --quantile")
    calibration = calibrate_on_halves(engine, args.path, args.batch_size, args.limit)  # chosen on one half, reported on the other
    setting = calibration.setting()
    print(calibration.table())
    return _chosen_setting(args, engine, "count_bias", setting)


def cmd_calibrate_scores(args: argparse.Namespace) -> int:
    from ner_service.engine import NEREngine
    from ner_service.engine.cpu import configure_threads
    from training.score_calibration import calibrate_on_halves, calibration_setting, calibration_table

    configure_threads(args.threads)
    engine = NEREngine.load(args.model, dtype=args.dtype, device=args.device, calibrated_scores=False)
    strategies = args.strategies.split(",") if args.strategies else [engine.options().strategy]
    found = calibrate_on_halves(engine, args.path, strategies, args.batch_size, args.limit)  # fitted on one half, measured on both
    print(calibration_table(found))
    setting = calibration_setting(engine.ner_model.config.score_calibration, found)
    return _chosen_setting(args, engine, "score_calibration", setting)


def _chosen_setting(args: argparse.Namespace, engine: Any, field: str, setting: object) -> int:
    """Print a calibration's setting and, with ``--write``, store it in the model's ``ner_model.json``."""
    from dataclasses import replace

    from ner_service.engine.ner_model import resolve_ner_model

    print(f"{field}: {json.dumps(setting)}")
    if args.write:
        folder = resolve_ner_model(args.model)
        replace(engine.ner_model.config, **{field: setting}).write(folder)
        print(f"written to {folder / 'ner_model.json'}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from ner_service.engine.model_metrics import dev_scores, ms_per_text
    from ner_service.engine.ner_model import SELF_CONTAINED, NERModelConfig, named_model_names, resolve_ner_model

    if args.trained_names is not None:
        config = NERModelConfig.read(resolve_ner_model(args.trained_names))
        if not config.trained_names:
            raise SystemExit(f"error: {args.trained_names} lists no trained names (an open model does; this one "
                             f"{'was trained before they were listed' if config.open_labels else 'answers its own labels: ' + ','.join(config.labels)})")
        print("\n".join(config.trained_names))
        return 0
    for name in named_model_names():
        config = NERModelConfig.read(resolve_ner_model(name))
        base = "self-contained" if config.base == SELF_CONTAINED else config.base
        scores, ms = dev_scores(config.metrics), ms_per_text(config.metrics)
        labels = f"any (default {','.join(config.labels)})" if config.open_labels else ",".join(config.labels)
        print(f"{name:<22} {config.language}  labels={labels}  base={base}"
              + (f"  dev_f1={scores[1]['micro_f1']:.2f} ({scores[0]})" if scores else "")
              + (f"  {ms:,.0f} ms/text" if ms is not None else ""))
    return 0

def cmd_prepare(args: argparse.Namespace) -> int:
    from ner_service.engine.model_loading import WHEEL_BASES, cached_tokenizer, resolve_model_folder

    unknown = [alias for alias in args.bases if alias not in WHEEL_BASES]
    if unknown:  # before converting any: a typo costs no minute of work
        raise ValueError(f"unknown base {unknown[0]!r}; bases: {', '.join(WHEEL_BASES)}")
    for alias in args.bases or WHEEL_BASES:
        folder = resolve_model_folder(alias)
        from transformers import AutoTokenizer

        cached_tokenizer(folder, AutoTokenizer.from_pretrained)  # the first extract reads it back instead of building it
        print(f"{alias}: {folder}")
    return 0


def _extract_options(extract: argparse.ArgumentParser) -> None:
    extract.add_argument("text", nargs="*", help="texts to tag (none: each line of stdin is a text)")
    extract.add_argument("--threshold", type=float, default=0.0,
                         help="drop entities whose score (the probability the model gave them) is below this, 0 to 1 "
                              "(default: %(default)s, all)")
    _add_engine_options(extract)
    extract.set_defaults(model=None)  # no --model: the default model of each text's language (cmd_extract)


def _evaluate_options(evaluate: argparse.ArgumentParser) -> None:
    evaluate.add_argument("path", help="a column file or a JSONL file of texts and character-offset entities; a JSONL "
                                       "file's entities may nest or share a span under two labels: each is scored")
    evaluate.add_argument("--limit", type=int, default=None)
    evaluate.add_argument("--batch-size", type=int, default=1)
    evaluate.add_argument("--json", action="store_true", help="print one JSON object")
    evaluate.add_argument("--documents", choices=["newline", "space"], default=None,
                          help="send each -DOCSTART- document of a column file as one text, its sentences joined by a "
                               "newline or a space (users send paragraphs, not sentences); --limit counts documents")
    evaluate.add_argument("--half", choices=["choose", "report"], default=None,
                          help="score one fixed half of a dev file: choose (where settings are chosen) or report (where "
                               "they are only reported; corpora/dev_halves.py)")
    evaluate.add_argument("--ask-as", default=None, metavar="LABEL=name,...",
                          help="an open-label model: ask the file's label LABEL under this name (default: the file's own "
                               "label names, all of them unless --labels names some)")
    evaluate.add_argument("--errors", action="store_true",
                          help="then run again, putting each missed and false entity down to its cause: the label's count, "
                               "a boundary, another label, or the mention its query named (the padellm strategy)")
    _add_engine_options(evaluate)


def _calibration_options(calibrate: argparse.ArgumentParser, path_help: str, limit_help: str, written: str) -> None:
    """What every calibration command takes: a dev file, how much of it, the model, and ``--write``."""
    from ner_service.engine import DEFAULT_MODEL

    calibrate.add_argument("path", help=path_help)
    calibrate.add_argument("--limit", type=int, default=None, help=limit_help)
    calibrate.add_argument("--batch-size", type=int, default=16)
    calibrate.add_argument("--write", action="store_true", help=f"write {written} into the model's ner_model.json")
    calibrate.add_argument("--model", default=DEFAULT_MODEL, help="shipped model name or model folder (default: %(default)s)")
    calibrate.add_argument("--device", default="cpu")
    _add_cpu_options(calibrate)


def _calibrate_scores_options(calibrate: argparse.ArgumentParser) -> None:
    _calibration_options(calibrate, "a dev corpus file (never the training file): fitted on its choosing half, measured on both",
                         "the first N texts of each half", "the fitted maps")
    calibrate.add_argument("--strategies", default="padellm,ar", help="comma-separated (default: %(default)s; empty: the model's default)")


def _calibrate_counts_options(calibrate: argparse.ArgumentParser) -> None:
    _calibration_options(calibrate, "a dev corpus file (never the training file)", "the first N texts", "the chosen biases")
    calibrate.add_argument("--count-bias", default=None, help="the bias to compare with, as for evaluate (default: the model's)")
    calibrate.add_argument("--count-quantile", type=float, default=None, metavar="Q",
                           help="the count quantile to compare with, as for evaluate (0: the count bias; default: the model's)")
    calibrate.add_argument("--quantile", action="store_true",
                           help="choose one count quantile for every label instead of per-label biases (written as count_quantile)")
    calibrate.add_argument("--quantiles", default=None, help="with --quantile: the count quantiles tried, comma-separated "
                                                             "(default: 0.5 down to 0.05 in steps of 0.05)")


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="padellm-ner", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    extract = sub.add_parser("extract", help="print the entities of each TEXT (or stdin line) as one JSON line", options=_extract_options)
    extract.set_defaults(func=cmd_extract, one_shot=True)

    evaluate = sub.add_parser("evaluate", help="span micro-F1 and latency on a corpus file", options=_evaluate_options)
    evaluate.set_defaults(func=cmd_evaluate, one_shot=True)

    calibrate = sub.add_parser("calibrate-counts", help="choose each label's PaDeLLM count bias (or, with --quantile, one count "
                                                        "quantile) on a dev file's choose half, reported on its other half",
                               options=_calibrate_counts_options)
    calibrate.set_defaults(func=cmd_calibrate_counts)

    scores = sub.add_parser("calibrate-scores", help="fit the map from a model's mention scores to the probability that a "
                                                     "mention is right, on a dev file's choosing half", options=_calibrate_scores_options)
    scores.set_defaults(func=cmd_calibrate_scores)

    models = sub.add_parser("models", help="list the models chosen by name: the shipped ones, then those in PADELLM_NER_MODEL_PATH")
    models.add_argument("--trained-names", metavar="MODEL", default=None,
                        help="print the label names an open model trained on instead, one a line (those it finds best)")
    models.set_defaults(func=cmd_models)

    prepare = sub.add_parser("prepare", help="assemble and de-quantise the bases of the wheels into the cache now "
                                             "(once; otherwise the first model that needs one waits for it)")
    prepare.add_argument("bases", nargs="*", help="base aliases (default: every base)")
    prepare.set_defaults(func=cmd_prepare)

    for module in COMMAND_MODULES:
        try:
            importlib.import_module(module).register(sub)
        except ModuleNotFoundError as missing:  # an optional extra ([api], [pipeline]) is not installed
            logging.getLogger(__name__).debug("commands of %s unavailable: %s", module, missing)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if argv is None and getattr(args, "under_jemalloc", False):  # a training command started from a shell, not a call from Python
        from training.allocator import run_under_jemalloc

        run_under_jemalloc()
    from ner_service.engine.model_loading import ModelNotFoundError

    started_from_shell = argv is None and getattr(args, "one_shot", False)  # the padellm-ner program, not a call from Python
    if started_from_shell:
        one_shot.begin()
    try:
        code = args.func(args)
    except (ModelNotFoundError, ValueError) as error:  # an unknown label, decoder or strategy, or bad data, is a ValueError
        print(f"padellm-ner: error: {error}", file=sys.stderr)
        code = 2
    if started_from_shell:
        one_shot.finish(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
