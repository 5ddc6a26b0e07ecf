"""Choose the windows an open model reads (``sentence_windows``, ``window_tokens``) where its users ask.

A model that reads a long text at once under-counts its mentions (:mod:`ner_service.engine.chunking`);
how short its windows should be depends on what it was trained on. Each setting tried is scored on
the texts no figure is reported on: each held-out corpus's texts after the first ``limit`` (asked
its own names) and CoNLL-03's and Resume's choosing halves (asked by name). The setting with the
best mean of the three (the zero-shot average, CoNLL-03, Resume) is chosen and reported beside the
model's own on the rest: the first ``limit`` texts of each held-out corpus and the reporting halves.

    python -m training.open_windows open --windows 160,s64,s48,s40 [--write]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from corpora import Example
from corpora.dev_halves import dev_halves
from ner_service.engine import NEREngine
from training.evaluate import evaluate_engine
from training.open_data import SUPERVISED_NAMES, ZERO_SHOT_CORPORA
from training.open_eval import SUPERVISED_DEV, add_held_out_argument, choosing_and_reported, held_out_corpora, named, write_settings

#: The settings tried unless told: whole texts of up to 160 tokens, sentences in windows of up to 64, 48, 40.
WINDOW_GRID = "160,s64,s48,s40"
ZERO_SHOT = "zero-shot"


@dataclass(frozen=True)
class WindowSetting:
    """How a model reads a text: each sentence alone (``sentence_windows``) or not, in windows of at
    most ``window_tokens`` text tokens."""

    sentence_windows: bool
    window_tokens: int

    @classmethod
    def parse(cls, written: str) -> WindowSetting:
        """``s48``: sentences, windows of up to 48 tokens; ``160``: whole texts of up to 160 tokens."""
        sentences = written.startswith("s")
        digits = written[1:] if sentences else written
        if not digits.isdigit() or not 8 <= int(digits) <= 4096:
            raise ValueError(f"{written!r} is no window setting: a token budget of 8 to 4096, 's' before it for sentence windows (s48)")
        return cls(sentences, int(digits))

    @property
    def name(self) -> str:
        return f"{'s' if self.sentence_windows else ''}{self.window_tokens}"


def parse_window_grid(written: str) -> list[WindowSetting]:
    """``"160,s48"``: the settings, each once, in order; a :class:`ValueError` that names a bad one."""
    settings = [WindowSetting.parse(part.strip()) for part in written.split(",") if part.strip()]
    if not settings:
        raise ValueError("no window setting given")
    return list(dict.fromkeys(settings))


@dataclass(frozen=True)
class WindowChoice:
    """Micro-F1 of each setting tried on the choosing texts (per set: zero-shot average, CoNLL-03,
    Resume), the chosen setting, and the reported texts' figures under the model's own and the chosen."""

    tried: dict[WindowSetting, dict[str, float]]
    chosen: WindowSetting
    was: WindowSetting
    report: dict[str, tuple[float, float]]  # set: (the model's own setting, the chosen)

    @staticmethod
    def mean(figures: dict[str, float]) -> float:
        return statistics.fmean(figures.values())

    def table(self) -> str:
        sets = list(next(iter(self.tried.values())))
        lines = ["| windows | " + " | ".join(f"{s}, choosing texts" for s in sets) + " | mean |", "| --- |" + " --- |" * (len(sets) + 1)]
        for setting, figures in self.tried.items():
            mark = " (chosen)" if setting == self.chosen else (" (the model's)" if setting == self.was else "")
            lines.append(f"| {setting.name}{mark} | " + " | ".join(f"{figures[s]:.2f}" for s in sets) + f" | {self.mean(figures):.2f} |")
        lines += ["", f"| reported texts | the model's ({self.was.name}) | chosen ({self.chosen.name}) |", "| --- | --- | --- |"]
        lines += [f"| {name} | {before:.2f} | {after:.2f} |" for name, (before, after) in self.report.items()]
        return "\n".join(lines)


@dataclass(frozen=True)
class _AskedSet:
    name: str
    choosing: list[tuple[list[Example], list[str]]]  # (texts, labels asked) of each part
    reporting: list[tuple[list[Example], list[str]]]


def _asked_sets(data: Path, limit: int, choose_limit: int, supervised_limit: int | None, held_out: Sequence[str]) -> list[_AskedSet]:
    pairs = choosing_and_reported(data, limit, choose_limit, held_out)
    sets = [_AskedSet(ZERO_SHOT, [(c.examples, c.labels) for c, _ in pairs], [(r.examples, r.labels) for _, r in pairs])]
    for corpus, relative in SUPERVISED_DEV.items():
        halves, names = dev_halves(data / relative), SUPERVISED_NAMES[corpus]
        labels = sorted(set(names.values()))
        sets.append(_AskedSet(corpus, [(named(halves.choose[:supervised_limit], names), labels)],
                              [(named(halves.report[:supervised_limit], names), labels)]))
    return sets


def _f1(engine: NEREngine, asked: _AskedSet, parts: str, batch_size: int) -> float:
    """The set's figure: the mean micro-F1 of its corpora for the zero-shot set, else its micro-F1 (a
    corpus whose sample holds none of its many names has nothing to ask: slurp's in a sample of two)."""
    scores = [evaluate_engine(engine, texts, labels=labels, batch_size=batch_size, progress=False)["micro_f1"]
              for texts, labels in getattr(asked, parts) if labels]
    return float(statistics.fmean(scores)) if scores else 0.0


def reading(engine: NEREngine, setting: WindowSetting) -> None:
    """Make ``engine`` read texts as ``setting`` says."""
    engine.ner_model.config = replace(engine.ner_model.config, sentence_windows=setting.sentence_windows, window_tokens=setting.window_tokens)
    engine.max_window_tokens = setting.window_tokens


def choose_open_windows(engine: NEREngine, data: Path, grid: Sequence[WindowSetting], limit: int = 100, choose_limit: int = 50,
                        supervised_limit: int | None = None, batch_size: int = 16,
                        held_out: Sequence[str] = ZERO_SHOT_CORPORA) -> WindowChoice:
    """The setting of ``grid`` with the best mean figure on the choosing texts (module docstring),
    reported against the model's own on the rest; ``engine`` is left reading the model's own."""
    own_config, own_tokens = engine.ner_model.config, engine.max_window_tokens
    was = WindowSetting(own_config.sentence_windows, own_tokens)
    sets = _asked_sets(data, limit, choose_limit, supervised_limit, held_out)
    tried: dict[WindowSetting, dict[str, float]] = {}
    try:
        for setting in tqdm(list(dict.fromkeys([was, *grid])), desc="windows", unit="setting"):
            reading(engine, setting)
            tried[setting] = {s.name: _f1(engine, s, "choosing", batch_size) for s in sets}
        chosen = max(grid, key=lambda s: (WindowChoice.mean(tried[s]), s == was))  # a tie keeps the model's own
        reported: dict[WindowSetting, dict[str, float]] = {}
        for setting in dict.fromkeys([was, chosen]):
            reading(engine, setting)
            reported[setting] = {s.name: _f1(engine, s, "reporting", batch_size) for s in sets}
    finally:
        engine.ner_model.config, engine.max_window_tokens = own_config, own_tokens
    report = {s.name: (reported[was][s.name], reported[chosen][s.name]) for s in sets}
    return WindowChoice(tried, chosen, was, report)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="an open model (a shipped name or folder)")
    parser.add_argument("--data", default="../shared/data", help="the folder holding open/, conll2003/ and resume/")
    parser.add_argument("--windows", default=WINDOW_GRID, help="the settings tried: a token budget, 's' before it for sentence "
                                                               "windows (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=100, help="reported texts of each zero-shot corpus (default: %(default)s)")
    parser.add_argument("--choose-limit", type=int, default=50, help="choosing texts of each zero-shot corpus, after those "
                                                                    "(default: %(default)s)")
    parser.add_argument("--supervised-limit", type=int, default=None, help="texts of each supervised half (default: all)")
    add_held_out_argument(parser)
    parser.add_argument("--write", action="store_true", help="store the chosen setting in the model's ner_model.json")
    args = parser.parse_args(argv)
    held_out = held_out_corpora(parser, Path(args.data), args.held_out)
    try:
        grid = parse_window_grid(args.windows)
    except ValueError as error:
        parser.error(f"--windows: {error}")
    engine = NEREngine.load(args.model, dtype="auto")
    choice = choose_open_windows(engine, Path(args.data), grid, args.limit, args.choose_limit, args.supervised_limit, held_out=held_out)
    print(choice.table())
    print(f"windows: {choice.chosen.name}")
    if args.write:
        write_settings(args.model, engine, sentence_windows=choice.chosen.sentence_windows, window_tokens=choice.chosen.window_tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
