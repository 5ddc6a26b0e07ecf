"""The ``padellm-ner`` console script, run as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "padellm_ner.cli", *args], capture_output=True, text=True, timeout=300)


def test_extract_prints_json() -> None:
    done = run("extract", "--model", "tiny-conll03", "Peter Blackburn visited Paris .")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["text"] == "Peter Blackburn visited Paris ." and isinstance(payload["entities"], list)
    assert payload["stats"]["forward_passes"] > 0


def test_evaluate_json_report(tmp_path: Path) -> None:
    corpus = tmp_path / "dev.jsonl"
    corpus.write_text(json.dumps({"text": "Peter met Anna", "entities": [{"start": 0, "end": 5, "label": "PER"}]}) + "\n")
    done = run("evaluate", str(corpus), "--model", "tiny-conll03", "--decoder", "ar", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    for key in ("micro_f1", "precision", "recall", "per_label", "n_sentences", "latency_ms", "forward_passes_mean"):
        assert key in report
    assert set(report["latency_ms"]) >= {"mean", "p50", "p90"} and report["n_sentences"] == 1


def test_errors_are_one_clear_line_and_exit_2(tmp_path: Path) -> None:
    done = run("extract", "--model", "tiny-conll03", "--labels", "PER,DISEASE", "x")
    assert done.returncode == 2 and "unknown label(s) 'DISEASE'" in done.stderr and "Traceback" not in done.stderr
    broken = tmp_path / "broken.txt"
    broken.write_bytes(b"a b c O\nd O\n")
    done = run("evaluate", str(broken), "--model", "tiny-conll03")
    assert done.returncode == 2 and f"{broken}:2: expected 4 columns" in done.stderr


def test_models_lists_the_shipped_models() -> None:
    done = run("models")
    assert done.returncode == 0 and "tiny-conll03" in done.stdout
