"""Table, JSON and PNG output shared by the benchmark scripts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


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
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
