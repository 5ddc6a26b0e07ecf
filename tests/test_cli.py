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
    assert "base=." not in done.stdout and "base=self-contained" in done.stdout  # the tiny model holds its own weights


TINY_BASE = str(Path(__file__).resolve().parent.parent / "ner_service" / "shipped_models" / "tiny-conll03")


def test_bad_training_data_stops_before_training_with_file_line_and_reason(tmp_path: Path) -> None:
    overlap = tmp_path / "overlap.jsonl"
    overlap.write_text(json.dumps({"text": "Paris is nice"}) + "\n" + json.dumps(
        {"text": "New York City", "entities": [{"start": 0, "end": 8, "label": "LOC"}, {"start": 4, "end": 13, "label": "LOC"}]}) + "\n")
    tags = tmp_path / "tags.txt"
    tags.write_text("Peter B-PER\nmet O\nAnna B_PER\n")
    labels = tmp_path / "labels.jsonl"
    labels.write_text(json.dumps({"text": "Peter met Anna in Paris", "entities": [
        {"start": 0, "end": 5, "label": "PER"}, {"start": 10, "end": 14, "label": "PER"}, {"start": 18, "end": 23, "label": "LOC"}]}) + "\n")
    for data, extra, message in [
        (overlap, [], f"{overlap}:2: entity [4, 13) LOC 'York City' overlaps entity [0, 8) LOC 'New York'"),
        (tags, [], f"{tags}:3: impossible tag 'B_PER'"),
        (labels, ["--labels", "PER,ORG"], f"{labels}: holds entities of label(s) LOC (1) that --labels PER,ORG leaves out"),
    ]:
        output = tmp_path / f"model-{data.stem}"
        done = run("train", "--train", str(data), "--output", str(output), "--base", TINY_BASE, "--max-steps", "1", *extra)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines() == [f"padellm-ner: error: {done.stderr.split('error: ', 1)[1].strip()}"]
        assert message in done.stderr and "Traceback" not in done.stderr
        assert not output.exists()  # nothing trained, nothing written


def test_train_help_documents_the_data_formats_with_examples_that_read(tmp_path: Path) -> None:
    from corpora import read_conll, read_jsonl

    done = run("train", "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    for phrase in ("data formats (--train, --dev)", "end exclusive", "-DOCSTART- lines skipped", "IOB1, BIO and BMES",
                   "the tag in the last column", "default: every label in the training data", "(default: padellm,ar)"):
        assert phrase in text, phrase
    [jsonl_line] = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith('{"text"')]
    (tmp_path / "example.jsonl").write_text(jsonl_line + "\n")
    [example] = read_jsonl(tmp_path / "example.jsonl")
    assert [(example.text[s.start:s.end], s.label) for s in example.spans] == [("40 mg", "DOSE"), ("aspirin", "DRUG")]
    [column_line] = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("Merkel ")]
    (tmp_path / "example.txt").write_text(column_line + "\n")
    [sentence] = read_conll(tmp_path / "example.txt")
    assert [(sentence.text[s.start:s.end], s.label) for s in sentence.spans] == [("Merkel", "PER")]
