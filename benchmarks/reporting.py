"""Options, one-line failures, table, JSON and PNG output shared by the benchmark scripts."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

CONLL_DEV = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "conll2003" / "dev.txt"


def benchmark_parser(doc: str | None, name: str, limit: int, limit_help: str = "number of dev sentences",
                     model: str = "en-conll03", model_help: str | None = None, dtype: bool = False) -> argparse.ArgumentParser:
    """A parser with the options every benchmark takes: ``--limit``, ``--json`` (default
    ``benchmarks/results/NAME.json``), ``--model`` and ``--data`` (CoNLL-03 dev); with ``dtype``,
    ``--dtype`` of the model's weights (default ``auto``, the service's: bfloat16 where the CPU has
    bfloat16 instructions)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=limit, help=f"{limit_help} (default %(default)s)")
    parser.add_argument("--json", default=f"benchmarks/results/{name}.json")
    parser.add_argument("--model", default=model, help=model_help)
    parser.add_argument("--data", default=str(CONLL_DEV))
    if dtype:
        parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                            help="the weights' dtype (default %(default)s: the service's)")
    return parser


def dtype_name(engine) -> str:
    """The dtype ``engine``'s model runs in, as the reports write it (``bfloat16``, ``float32``)."""
    return str(engine.ner_model.model.dtype).removeprefix("torch.")


def fail(script: str, message: str) -> NoReturn:
    """End the benchmark with one line on stderr and status 2: a missing prerequisite or a wait
    that ran out is said plainly, not as a traceback."""
    print(f"{script}: {message}", file=sys.stderr)
    sys.exit(2)


def require_model(script: str, model: str, recipe: str) -> None:
    """Go on only if ``model`` names an NER model (a shipped name or a folder); otherwise
    :func:`fail`, naming the recipe that builds it (``padellm-ner train --recipe`` writes
    ``runs/RECIPE``)."""
    from ner_service.engine import ModelNotFoundError
    from ner_service.engine.ner_model import resolve_ner_model

    try:
        resolve_ner_model(model)
    except ModelNotFoundError:
        fail(script, f"model {model!r} not found: build it with "
                     f"`padellm-ner train --recipe {recipe}`, which writes runs/{recipe}, or give --model FOLDER")


def print_table(rows: Sequence[dict], columns: Sequence[str]) -> None:
    """Print ``rows`` as an aligned text table of ``columns``."""

    def cell(value: object) -> str:
        return f"{value:.2f}" if isinstance(value, float) else str(value)

    widths = [max(len(c), *(len(cell(r.get(c, ""))) for r in rows)) for c in columns]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for row in rows:
        print("  ".join(cell(row.get(c, "")).rjust(w) for c, w in zip(columns, widths)))


def write_json(path: str | Path, payload: dict) -> Path:
    """Write ``payload`` as indented JSON, creating parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def bar_plots(path: str | Path, labels: Sequence[str], panels: dict[str, Sequence[float]], title: str) -> Path:
    """One bar chart per panel (``name -> value per label``) side by side, saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for axis, (name, values) in zip(axes[0], panels.items()):
        bars = axis.bar(labels, values, color=["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3"][: len(labels)])
        axis.bar_label(bars, fmt="%.2f", fontsize=8)
        axis.set_title(name, fontsize=10)
        axis.tick_params(axis="x", labelrotation=20, labelsize=8)
    figure.suptitle(title, fontsize=11)
    return save_figure(figure, path)


def save_figure(figure, path: str | Path) -> Path:
    """Lay out ``figure``, write it to ``path`` as PNG (creating parent folders) and free it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
