"""The ``padellm-ner`` console script, run as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import TINY_DIR


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "padellm_ner.cli", *args], capture_output=True, text=True, timeout=300, env=env)


def test_extract_prints_one_json_line_per_text() -> None:
    done = run("extract", "--model", "tiny-conll03", "Peter Blackburn visited Paris .")
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    payload = json.loads(line)
    assert payload["text"] == "Peter Blackburn visited Paris ." and isinstance(payload["entities"], list)
    assert payload["stats"]["forward_passes"] > 0
    texts = ["Peter Blackburn visited Paris .", "EU rejects German call to boycott British lamb ."]
    several = subprocess.run([sys.executable, "-m", "padellm_ner.cli", "extract", "--model", "tiny-conll03"], input="\n".join(texts) + "\n",
                             capture_output=True, text=True, timeout=300)
    assert several.returncode == 0, several.stderr
    assert [json.loads(line)["text"] for line in several.stdout.splitlines()] == texts


def test_the_program_leaves_at_once_with_every_line_written_and_its_exit_code() -> None:
    """``padellm-ner extract`` ends without tearing its process down (:mod:`padellm_ner.one_shot`):
    what it printed, more than a pipe holds, must all arrive, in order, and the code must be its own."""
    texts = [f"Text {i} : Peter Blackburn visited Paris ." for i in range(200)]
    done = subprocess.run([sys.executable, "-m", "padellm_ner.cli", "extract", "--model", "tiny-conll03"], input="\n".join(texts) + "\n",
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.encode()) > 65536 and [json.loads(line)["text"] for line in done.stdout.splitlines()] == texts
    unknown = run("extract", "--model", "tiny-conll03", "--labels", "NOPE", "x")
    assert unknown.returncode == 2 and "unknown label(s) 'NOPE'" in unknown.stderr and unknown.stdout == ""


def test_a_one_shot_command_collects_no_cycles_while_it_loads_and_collects_after() -> None:
    script = """
import gc, json
from padellm_ner import one_shot
one_shot.loaded()  # not begun: nothing changes
before = [gc.isenabled(), gc.get_freeze_count()]
one_shot.begin()
during = gc.isenabled()
one_shot.loaded()
print(json.dumps({"before": before, "during": during, "after": [gc.isenabled(), gc.get_freeze_count() > 1000]}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert json.loads(done.stdout) == {"before": [True, 0], "during": False, "after": [True, True]}, done.stderr


def test_extract_threshold_drops_the_entities_scored_below_it() -> None:
    text = "Peter Blackburn visited Paris ."
    everything = json.loads(run("extract", "--model", "tiny-conll03", text).stdout)["entities"]
    assert everything, "the tiny model finds an entity here"
    top = max(e["score"] for e in everything) - 1e-6  # the printed score is rounded to 6 digits
    kept = json.loads(run("extract", "--model", "tiny-conll03", "--threshold", str(top), text).stdout)["entities"]
    assert [e["text"] for e in kept] == [e["text"] for e in everything if e["score"] >= top] and kept
    assert json.loads(run("extract", "--model", "tiny-conll03", "--threshold", "1", text).stdout)["entities"] == []
    done = run("extract", "--model", "tiny-conll03", "--threshold", "2", text)
    assert done.returncode == 2 and "threshold must be a number from 0 to 1" in done.stderr


def test_evaluate_json_report(tmp_path: Path) -> None:
    corpus = tmp_path / "dev.jsonl"
    corpus.write_text(json.dumps({"text": "Peter met Anna", "entities": [{"start": 0, "end": 5, "label": "PER"}]}) + "\n")
    done = run("evaluate", str(corpus), "--model", "tiny-conll03", "--strategy", "ar", "--json")
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


def test_models_lists_the_shipped_models_and_those_on_the_model_path() -> None:
    done = run("models")  # the suite puts tests/models, the tiny model's folder, on PADELLM_NER_MODEL_PATH
    assert done.returncode == 0 and "tiny-conll03" in done.stdout and "en-conll03 " in done.stdout
    assert "base=." not in done.stdout and "base=self-contained" in done.stdout  # the tiny model holds its own weights
    [open_line] = [line for line in done.stdout.splitlines() if line.startswith("open ")]
    assert "labels=any (default person,organization,location,miscellaneous)" in open_line  # an open model takes any names
    names = run("models", "--trained-names", "open")
    assert names.returncode == 0 and {"person", "disease", "restaurant name"} <= set(names.stdout.splitlines())
    assert "weapon" not in names.stdout.splitlines()  # a held-out corpus's name
    closed = run("models", "--trained-names", "en-conll03")
    assert closed.returncode == 1 and "lists no trained names" in closed.stderr and "LOC,MISC,ORG,PER" in closed.stderr
    unknown = run("models", "--trained-names", "nosuch")
    assert unknown.returncode != 0 and "nosuch" in unknown.stderr and "Traceback" not in unknown.stderr


TINY_BASE = str(TINY_DIR)


def test_prepare_leaves_each_base_converted_in_the_cache() -> None:
    done = run("prepare", "smollm2-135m-instruct")
    assert done.returncode == 0, done.stderr
    alias, folder = done.stdout.strip().split(": ")
    assert alias == "smollm2-135m-instruct" and (Path(folder) / "config.json").is_file() and (Path(folder) / "tokenizer.json").is_file()
    unknown = run("prepare", "gpt-5")
    assert unknown.returncode == 2 and "unknown base 'gpt-5'; bases: smollm2-135m-instruct, gemma3-270m" in unknown.stderr


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


def test_a_run_too_small_to_learn_says_so_plainly_and_one_large_enough_does_not(tmp_path: Path) -> None:
    data = tmp_path / "small.jsonl"
    data.write_text("".join(json.dumps({"text": f"Peter met Anna on day {i}", "entities": [{"start": 0, "end": 5, "label": "PER"}]}) + "\n"
                            for i in range(4)))
    done = run("train", "--train", str(data), "--output", str(tmp_path / "small"), "--base", TINY_BASE, "--epochs", "1")
    assert done.returncode == 0, done.stderr
    assert f"{data}: 4 training texts make 1 optimizer step(s) an epoch" in done.stderr and "too few to learn" in done.stderr
    assert json.loads((tmp_path / "small" / "training.json").read_text())["steps"] == 1
    enough = run("train", "--train", str(data), "--output", str(tmp_path / "enough"), "--base", TINY_BASE, "--epochs", "1",
                 "--max-steps", "2")  # steps asked for on purpose: no warning
    assert enough.returncode == 0 and "too few to learn" not in enough.stderr, enough.stderr


def test_training_runs_under_jemalloc_unless_told_otherwise(tmp_path: Path) -> None:
    from training.allocator import CHOICE_VARIABLE, STARTED_VARIABLE, jemalloc_library

    if jemalloc_library() is None:
        pytest.skip("jemalloc is not installed (Debian: libjemalloc2)")
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"text": "Peter met Anna", "entities": [{"start": 0, "end": 5, "label": "PER"}]}) + "\n")
    for choice, allocator in ((None, "jemalloc"), ("system", "system")):
        environment = {k: v for k, v in os.environ.items() if k not in (CHOICE_VARIABLE, STARTED_VARIABLE, "LD_PRELOAD")}
        output = tmp_path / allocator
        done = run("train", "--train", str(data), "--output", str(output), "--base", TINY_BASE, "--max-steps", "1",
                   env=environment | ({CHOICE_VARIABLE: choice} if choice else {}))
        assert done.returncode == 0, done.stderr
        assert json.loads((output / "training.json").read_text())["allocator"] == allocator


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


REPO = Path(__file__).resolve().parent.parent
#: Run in a fresh interpreter (pytest's has torch loaded): a command's exit code and output, and which heavy libraries it imported.
HEAVY_IMPORTS_OF = """
import contextlib, io, json, sys
from padellm_ner.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        code = main(sys.argv[1:])
    except SystemExit as done:  # --help
        code = done.code
print(json.dumps({"code": code, "stdout": out.getvalue(), "loaded": [m for m in ("torch", "transformers", "peft") if m in sys.modules]}))
"""


def test_help_models_and_recipes_do_not_load_torch() -> None:
    for argv, shows in ((["--help"], "extract"), (["models"], "en-conll03"), (["recipes"], "en-conll03-cpu")):
        done = subprocess.run([sys.executable, "-c", HEAVY_IMPORTS_OF, *argv], capture_output=True, text=True, timeout=120, cwd=REPO)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["code"] == 0 and shows in report["stdout"], report
        assert report["loaded"] == [], f"padellm-ner {' '.join(argv)} imported {report['loaded']}"


def test_a_sub_command_adds_its_options_when_called() -> None:
    done = run("extract", "--help")
    assert done.returncode == 0 and "--labels" in done.stdout and "lookahead" in done.stdout and "padellm" in done.stdout, done.stderr


@pytest.mark.slow
def test_extract_on_the_shipped_model_warns_of_nothing_the_project_calls() -> None:
    """No deprecation from the project's own code: none of transformers' warnings about the
    ``past_key_values`` keyword, and no warning raised at a file of the repository."""
    done = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-W", "always::FutureWarning", "-m", "padellm_ner.cli",
                           "extract", "--model", "en-conll03", "Angela Merkel met Emmanuel Macron in Paris ."],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert [e["text"] for e in json.loads(done.stdout)["entities"]] == ["Angela Merkel", "Emmanuel Macron", "Paris"]
    assert "past_key_values" not in done.stderr and "cache_params" not in done.stderr, done.stderr
    ours = [line for line in done.stderr.splitlines()
            if line.startswith(str(REPO)) and "site-packages" not in line and "Warning:" in line]
    assert ours == [], ours


@pytest.mark.slow
def test_a_trained_adapter_names_its_base_as_given_and_has_a_model_card(tmp_path: Path) -> None:
    data = tmp_path / "mine.jsonl"
    data.write_text(json.dumps({"text": "Take 40 mg aspirin", "entities": [{"start": 5, "end": 10, "label": "DOSE"},
                                                                          {"start": 11, "end": 18, "label": "DRUG"}]}) + "\n")
    output = tmp_path / "mine"
    done = run("train", "--train", str(data), "--output", str(output), "--name", "doses", "--base", "smollm2-135m-instruct",
               "--max-steps", "1", "--top-layers", "1", "--lora-r", "2", "--batch-tokens", "256")
    assert done.returncode == 0, done.stderr
    # the alias, not the folder it was de-quantised to on this machine
    assert json.loads((output / "adapter_config.json").read_text())["base_model_name_or_path"] == "smollm2-135m-instruct"
    card = (output / "README.md").read_text()
    assert card.startswith('---\nbase_model: "smollm2-135m-instruct"\n') and "# doses\n" in card and "`DOSE`, `DRUG`" in card
    assert '"top_layers": 1' in card and "- steps: 1," in card and "[More Information Needed]" not in card
    assert str(Path.home()) not in card and "converted" not in card
    served = run("extract", "--model", str(output), "Take 40 mg aspirin")  # the folder still loads on the alias
    assert served.returncode == 0 and json.loads(served.stdout)["stats"]["forward_passes"] > 0, served.stderr


@pytest.mark.slow
def test_the_diffusion_model_extracts_with_fast_dllm(diffusion_en_engine) -> None:
    text = "Angela Merkel met Emmanuel Macron in Paris ."
    done = run("extract", "--model", "en-conll03-diffusion", "--strategy", "fast_dllm", text)
    assert done.returncode == 0, done.stderr
    entities = [(e["start"], e["end"], e["label"]) for e in json.loads(done.stdout)["entities"]]
    [expected] = diffusion_en_engine.extract([text], strategy="fast_dllm")
    assert entities == [(e.start, e.end, e.label) for e in expected.entities] and ("Paris", "LOC") in {(e.text, e.label) for e in expected.entities}
