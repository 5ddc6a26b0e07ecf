"""The benchmark scripts run end to end at a tiny size (tiny model, a few texts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "ner_service" / "shipped_models" / "tiny-conll03"


def _training_speed(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "training_speed.py"), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def test_training_speed_measures_the_arms_and_draws_the_curve(tmp_path: Path, data_dir: Path) -> None:
    out = tmp_path / "training_speed.json"
    done = _training_speed("--base", str(TINY), "--data", str(data_dir), "--limit", "8", "--steps", "1", "--bf16-steps", "0",
                           "--compile-budget", "0", "--threads", "", "--minutes", "0.02", "--eval-limit", "4", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.is_file() and out.with_suffix(".png").is_file()
    report = json.loads(out.read_text())
    arms = {row["arm"]: row for row in report["throughput"]}
    for name in ("baseline", "default"):
        assert arms[name]["status"] == "ok" and arms[name]["tokens_per_s"] > 0
    assert arms["default"]["top_layers"] == 1 and arms["default"]["one_off_s"] > 0  # clamped to the tiny model's 2 layers
    assert arms["compile"]["status"].startswith("skipped")
    assert report["machine"]["cpu_count"] >= 1 and len(report["machine"]["loadavg_start"]) == 3
    assert {(row["arm"], row["part"]) for row in report["curve"]} == {(a, p) for a in ("baseline", "default") for p in range(1, 5)}
    assert all(0 <= row["padellm_f1"] <= 1 and row["minutes"] > 0 for row in report["curve"])


def _exit_line(monkeypatch, capsys, *args: str) -> str:
    """Run the script's ``main`` in this process (no second start-up) and return the one line
    it exits with, status 2."""
    from benchmarks import training_speed

    monkeypatch.setattr(sys, "argv", ["training_speed.py", *args])
    with pytest.raises(SystemExit) as exited:
        training_speed.main()
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_training_speed_without_the_corpus_says_so_in_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    line = _exit_line(monkeypatch, capsys, "--data", str(tmp_path / "nowhere"), "--base", str(TINY), "--json", str(tmp_path / "x.json"))
    assert "conll2003/train.txt" in line and "--data" in line
    assert not (tmp_path / "x.json").exists()


def test_training_speed_without_the_base_model_says_how_to_install_it(tmp_path: Path, data_dir: Path, monkeypatch, capsys) -> None:
    line = _exit_line(monkeypatch, capsys, "--data", str(data_dir), "--base", str(tmp_path / "no-model"), "--json", str(tmp_path / "x.json"))
    assert "no-model" in line and "make install" in line
