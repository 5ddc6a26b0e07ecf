"""Every benchmark script runs end to end at a tiny size (tiny model, a few texts), as CI runs
them; a script whose model is missing ends with one line and status 2."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import TINY_DIR

REPO = Path(__file__).resolve().parent.parent
TINY = TINY_DIR
# the local Redis, but not db 13: the pipeline tests flush that one
BENCH_REDIS = "redis://127.0.0.1:6379/12"


def _run(script: str, *args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run ``benchmarks/SCRIPT`` as a user does, from the repository root unless ``cwd`` says otherwise."""
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def _report(done: subprocess.CompletedProcess, path: Path) -> dict:
    """The JSON report of a run that succeeded, with its PNG beside it."""
    assert done.returncode == 0, done.stderr[-3000:]
    assert path.with_suffix(".png").is_file()
    return json.loads(path.read_text())


def _one_line_exit(done: subprocess.CompletedProcess) -> str:
    """The one line a script ended with, status 2 and no traceback."""
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_padellm_vs_ar_times_every_variant_at_each_batch_size(tmp_path: Path, data_dir: Path) -> None:
    out = tmp_path / "padellm_vs_ar.json"
    report = _report(_run("padellm_vs_ar.py", "--model", "tiny-conll03", "--limit", "2", "--batch-sizes", "1,2",
                          "--data", str(data_dir / "conll2003" / "dev.txt"), "--json", str(out)), out)
    assert report["n_sentences"] == 2 and {r["batch"] for r in report["results"]} == {1, 2}
    variants = {r["variant"] for r in report["results"]}
    assert {"ar_anpd", "padellm_copy", "padellm_greedy"} <= variants
    assert all(r["ms_per_text"] > 0 and r["identical"] for r in report["results"])
    assert out.with_name("padellm_vs_ar_phases.png").is_file()


def test_padellm_vs_ar_asks_an_open_model_more_labels_and_a_closed_one_refuses(tmp_path: Path, data_dir: Path) -> None:
    import shutil

    model = shutil.copytree(TINY, tmp_path / "tiny-open")
    config = json.loads((model / "ner_model.json").read_text())
    (model / "ner_model.json").write_text(json.dumps({**config, "open_labels": True, "answers_past_count": True}))
    out = tmp_path / "labels.json"
    dev = str(data_dir / "conll2003" / "dev.txt")
    report = _report(_run("padellm_vs_ar.py", "--model", str(model), "--limit", "2", "--batch-sizes", "1", "--label-counts", "4,7",
                          "--past-count-floor", "0.5", "--count-quantile", "0.05", "--data", dev, "--json", str(out)), out)
    assert {r["labels"] for r in report["results"]} == {4, 7}
    assert (set(report["padellm_speedup_by_labels"]) == set(report["padellm_floor_speedup_by_labels"])
            == set(report["padellm_quantile_speedup_by_labels"]) == {"batch 1, 4 labels", "batch 1, 7 labels"})
    floored = {r["labels"]: r for r in report["results"] if r["variant"] == "padellm_floor"}
    every = {r["labels"]: r for r in report["results"] if r["variant"] == "padellm_copy"}
    assert all(floored[n]["tokens_fed_per_text"] <= every[n]["tokens_fed_per_text"] for n in (4, 7))  # fewer questions past a count
    assert all(r["identical"] for r in report["results"] if r["variant"] not in {"padellm_floor", "padellm_quantile"})
    refused = _run("padellm_vs_ar.py", "--model", "tiny-conll03", "--limit", "1", "--label-counts", "4", "--data", dev)
    assert refused.returncode == 2 and "needs an open model" in refused.stderr


def test_work_estimate_times_each_label_set_under_both_estimates(tmp_path: Path, data_dir: Path) -> None:
    import shutil

    model = shutil.copytree(TINY, tmp_path / "tiny-open")
    config = json.loads((model / "ner_model.json").read_text())
    (model / "ner_model.json").write_text(json.dumps({**config, "open_labels": True}))
    out = tmp_path / "work.json"
    report = _report(_run("work_estimate.py", "--model", str(model), "--limit", "3", "--label-counts", "1,4", "--described", "2",
                          "--data", str(data_dir / "conll2003" / "dev.txt"), "--json", str(out)), out)
    rows = {(r["texts"], r["labels"]): r for r in report["results"]}
    assert {labels for _, labels in rows} == {"1", "4", "2 described"} and len(rows) == 6  # sentences and pieces, each label set
    for kind in {texts for texts, _ in rows}:  # the same texts: the same text-only work; more labels, more work with queries
        assert rows[kind, "1"]["text_only_tokens"] == rows[kind, "4"]["text_only_tokens"] == rows[kind, "2 described"]["text_only_tokens"]
        assert rows[kind, "1"]["work_tokens"] < rows[kind, "4"]["work_tokens"] < rows[kind, "2 described"]["work_tokens"]
    assert all(r["seconds"] > 0 for r in rows.values()) and set(report["spread"]) == {"text only", "with queries"}


def test_general_decoders_are_identical_to_greedy_on_every_task(tmp_path: Path, data_dir: Path) -> None:
    out = tmp_path / "general_decoders.json"
    report = _report(_run("general_decoders.py", "--model", "tiny-conll03", "--limit", "1",
                          "--data", str(data_dir / "conll2003" / "dev.txt"), "--json", str(out)), out)
    assert {r["task"] for r in report["results"]} == {"ar_ner", "mention", "continuation", "engine"}
    assert all(r["identical_to_greedy"] and r["forward_passes"] > 0 for r in report["results"])


def test_skinny_linear_times_each_number_of_fed_tokens(tmp_path: Path, data_dir: Path) -> None:
    out = tmp_path / "skinny_linear.json"
    report = _report(_run("skinny_linear.py", "--model", "tiny-conll03", "--limit", "2",
                          "--data", str(data_dir / "conll2003" / "dev.txt"), "--json", str(out)), out)
    assert [r["tokens"] for r in report["results"]] == [1, 2, 4, 8, 16, 32]
    assert all(r["linear_ms"] > 0 and r["skinny_ms"] > 0 for r in report["results"])


def test_torch_compile_runs_compiled_layers_beside_eager_on_the_same_texts(tmp_path: Path, data_dir: Path) -> None:
    out = tmp_path / "torch_compile.json"
    # the MLP blocks only: TorchInductor's first build of whole layers takes a minute of CI (the C++ of every kernel)
    report = _report(_run("torch_compile.py", "--model", "tiny-conll03", "--limit", "2", "--batch-sizes", "2", "--dtype", "float32",
                          "--scope", "mlp", "--data", str(data_dir / "conll2003" / "dev.txt"), "--json", str(out)), out)
    assert {(r["arm"], r["batch"]) for r in report["results"]} == {("eager", 2), ("compiled", 2)} and report["scope"] == "mlp"
    compiled = next(r for r in report["results"] if r["arm"] == "compiled")
    assert compiled["same_entities"] == 2 and compiled["first_batch_s"] > 0  # float32: the same answers
    assert report["speedup_batch2"] == compiled["speedup"] > 0


def test_one_sequence_matches_the_batched_engine_in_every_bucket(tmp_path: Path, data_dir: Path) -> None:
    out = tmp_path / "one_sequence.json"
    report = _report(_run("one_sequence.py", "--model", "tiny-conll03", "--limit", "1", "--repeats", "1",
                          "--data", str(data_dir / "conll2003" / "dev.txt"), "--json", str(out)), out)
    assert {r["entities_bucket"] for r in report["results"]} == {"1", "5", "20+"}
    assert all(r["identical"] for r in report["results"])


def test_api_load_drives_both_servers_without_errors(tmp_path: Path, data_dir: Path) -> None:
    out = tmp_path / "api_load.json"
    report = _report(_run("api_load.py", "--model", "tiny-conll03", "--limit", "4", "--seconds", "2", "--warmup", "1",
                          "--clients", "2", "--data", str(data_dir / "conll2003" / "dev.txt"), "--json", str(out)), out)
    assert [r["microbatch"] for r in report["results"]] == [False, True]
    assert all(r["answered"] > 0 and r["errors"] == 0 for r in report["results"])


def test_api_overload_offers_every_load_in_both_modes(tmp_path: Path, data_dir: Path) -> None:
    out = tmp_path / "api_overload.json"
    report = _report(_run("api_overload.py", "--model", "tiny-conll03", "--limit", "4", "--texts", "2", "--seconds", "1",
                          "--timeout", "20", "--loads", "0.5,2", "--data", str(data_dir / "conll2003" / "dev.txt"), "--json", str(out)), out)
    assert [(r["mode"], r["load"]) for r in report["rows"]] == [(m, x) for m in ("admission", "no admission") for x in (0.5, 2.0)]
    assert all(r["capacity_per_s"] > 0 and r["requests"] > 0 for r in report["rows"])


@pytest.fixture
def bench_redis() -> str:
    """The local Redis for the pipeline benchmark (skips when it does not answer)."""
    import redis

    client = redis.Redis.from_url(BENCH_REDIS, socket_connect_timeout=5)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as error:
        pytest.skip(f"Redis is not reachable at {BENCH_REDIS}: {error}")
    finally:
        client.close()
    return BENCH_REDIS


def test_batch_throughput_runs_a_job_on_a_celery_worker_and_leaves_no_queue(tmp_path: Path, data_dir: Path, bench_redis: str) -> None:
    import redis

    out = tmp_path / "batch_throughput.json"
    report = _report(_run("batch_throughput.py", "--no-spacy", "--model", "tiny-conll03", "--limit", "4", "--databases", "sqlite",
                          "--workers", "1", "--chunk-sizes", "1", "4", "--timeout", "120", "--data", str(data_dir / "conll2003" / "dev.txt"),
                          "--json", str(out), env={**os.environ, "REDIS_URL": bench_redis}), out)
    rows = report["results"]
    assert [(r["database"], r["workers"], r["chunk_size"], r["docs"]) for r in rows] == [("sqlite", 1, 1, 4), ("sqlite", 1, 4, 4)]
    assert all(r["docs_per_s"] > 0 for r in rows) and rows[0]["entities"] == rows[1]["entities"] > 0
    [queue] = set(re.findall(r"bench-[0-9a-f]{8}", (tmp_path / "batch_throughput_worker_sqlite_1.log").read_text()))
    client = redis.Redis.from_url(bench_redis)
    assert client.keys(f"*{queue}*") == []
    client.close()


def test_batch_throughput_says_in_one_line_when_the_worker_is_not_ready_in_time(tmp_path: Path, data_dir: Path,
                                                                              bench_redis: str) -> None:
    line = _one_line_exit(_run("batch_throughput.py", "--no-spacy", "--model", "tiny-conll03", "--limit", "1", "--databases", "sqlite",
                               "--workers", "1", "--timeout", "0.5", "--data", str(data_dir / "conll2003" / "dev.txt"),
                               "--json", str(tmp_path / "x.json"), env={**os.environ, "REDIS_URL": bench_redis}))
    assert "did not have its 1 pool process(es) up within 0.5 s" in line
    assert str(tmp_path / "x_worker_sqlite_1.log") in line and not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(("script", "recipe"), [("lud.py", "en-conll03-lud"), ("fast_dllm.py", "en-conll03-diffusion")])
def test_a_benchmark_whose_model_is_missing_names_the_command_that_builds_it(tmp_path: Path, script: str, recipe: str) -> None:
    # from an empty folder: runs/RECIPE is missing even where a checkout has built it
    line = _one_line_exit(_run(script, "--model", f"runs/{recipe}", "--limit", "1", "--json", str(tmp_path / "x.json"), cwd=tmp_path))
    assert f"runs/{recipe}" in line and f"padellm-ner train --recipe {recipe}" in line
    assert not (tmp_path / "x.json").exists()


def test_fast_dllm_times_every_sampler_against_lladas_on_the_shipped_diffusion_model(tmp_path: Path, data_dir: Path) -> None:
    if not (REPO / "ner_service" / "shipped_models" / "en-conll03-diffusion" / "ner_model.json").is_file():
        pytest.skip("the shipped en-conll03-diffusion model is not in this checkout")
    out = tmp_path / "fast_dllm.json"
    common = ("--limit", "1", "--batch-size", "1", "--block-sizes", "8", "--thresholds", "0.9", "--padellm", "",
              "--data", str(data_dir / "conll2003" / "dev.txt"), "--json", str(out))
    report = _report(_run("fast_dllm.py", *common, "--full-forward-every", "first"), out)
    rows = {row["variant"]: row for row in report["results"]}
    first_only = "+both (left to right, full forward first block only)"
    assert {"baseline", "+cache (dual)", "+both", "+both (left to right)", "+both (factor)", first_only} <= set(rows)
    assert rows["baseline"]["speedup"] == 1.0
    assert rows["+both (left to right)"]["forwards_per_text"] < rows["baseline"]["forwards_per_text"]
    assert rows[first_only]["forwards_per_text"] < rows["baseline"]["forwards_per_text"]
    chosen = _report(_run("fast_dllm.py", *common, "--full-forward-every", "3", "--variants", "+both (left"), out)
    assert [row["variant"] for row in chosen["results"]] == ["baseline", "+both (left to right)",
                                                             "+both (left to right, full forward every 3 blocks)"]


def test_lud_times_every_decoder_for_both_strategies_at_each_batch_size(tmp_path: Path, data_dir: Path) -> None:
    from training.configs import LUDConfig
    from training.lexical_units import train_lud

    model = tmp_path / "tiny-lud"
    train_lud(LUDConfig(model="tiny-conll03", train=str(data_dir / "conll2003" / "train.txt"), output=str(model),
                        placeholder="<eos>", limit=8, max_steps=1, top_layers=1))
    out = tmp_path / "lud.json"
    report = _report(_run("lud.py", "--model", str(model), "--limit", "3", "--batch-sizes", "1,2",
                          "--data", str(data_dir / "conll2003" / "dev.txt"), "--json", str(out)), out)
    runs = {(r["strategy"], r["batch"], r["decoder"]): r for r in report["results"]}
    assert set(runs) == {(s, b, d) for s in ("ar", "padellm") for b in (1, 2) for d in ("greedy", "copy", "anpd", "lud", "lud, units of 3", "lud, drafts >= 0.5", "lud (0.9)")}
    for (strategy, batch, decoder), row in runs.items():
        assert row["ms_per_text"] > 0
        if decoder != "lud (0.9)":  # lossless, verified units included: the same entities as greedy
            assert row["micro_f1"] == runs[strategy, batch, "greedy"]["micro_f1"]


def test_lud_curve_scores_every_snapshot_of_a_run_and_its_final_model(tmp_path: Path, data_dir: Path) -> None:
    from training.configs import LUDConfig
    from training.lexical_units import train_lud

    run = tmp_path / "tiny-lud"
    train_lud(LUDConfig(model="tiny-conll03", train=str(data_dir / "conll2003" / "train.txt"), output=str(run),
                        placeholder="<eos>", limit=8, max_steps=2, top_layers=1, checkpoint_minutes=0))
    out = tmp_path / "curve.json"
    report = _report(_run("lud_curve.py", "--run", str(run), "--limit", "1", "--data", str(data_dir / "conll2003" / "dev.txt"),
                          "--json", str(out)), out)
    rows = report["results"]
    assert [(r["snapshot"], r["decoder"]) for r in rows] == [
        ("minute-0", "greedy"), ("minute-0", "lud"), ("minute-0", "lud (0.9)"), ("final", "lud"), ("final", "lud (0.9)")]
    assert all(r["tokens_per_forward"] > 0 for r in rows)
    assert all(r["micro_f1"] == rows[0]["micro_f1"] for r in rows if r["decoder"] == "lud")  # verified units: greedy's entities


def test_lud_curve_without_a_run_says_which_command_writes_one(tmp_path: Path) -> None:
    line = _one_line_exit(_run("lud_curve.py", "--run", str(tmp_path / "none"), "--json", str(tmp_path / "x.json")))
    assert "padellm-ner train --recipe en-conll03-lud" in line and not (tmp_path / "x.json").exists()


def test_training_speed_measures_the_arms_and_draws_the_curve(tmp_path: Path, data_dir: Path) -> None:
    out = tmp_path / "training_speed.json"
    report = _report(_run("training_speed.py", "--base", str(TINY), "--data", str(data_dir), "--limit", "8", "--steps", "1",
                          "--bf16-steps", "1", "--compile-budget", "0", "--threads", "", "--minutes", "0.02", "--eval-limit", "1",
                          "--json", str(out)), out)
    arms = {row["arm"]: row for row in report["throughput"]}
    for name in ("baseline", "default", "mixed", "bfloat16"):  # one step each where the CPU emulates bfloat16
        assert arms[name]["status"] == "ok" and arms[name]["tokens_per_s"] > 0
    below_top = json.loads((TINY / "config.json").read_text())["num_hidden_layers"] - 1  # the recipe's 15, clamped
    assert arms["default"]["top_layers"] == below_top and arms["default"]["one_off_s"] > 0
    assert (arms["mixed"]["dtype"], arms["mixed"]["top_layers"]) == ("mixed", below_top) and arms["mixed"]["one_off_s"] > 0  # its own frozen pass
    assert report["machine"]["cpu_bfloat16"] in (True, False)
    assert arms["compile"]["status"].startswith("skipped")
    assert report["machine"]["cpu_count"] >= 1 and len(report["machine"]["loadavg_start"]) == 3
    assert {(row["arm"], row["part"]) for row in report["curve"]} == {(a, p) for a in ("baseline", "default") for p in range(1, 5)}
    assert all(0 <= row["padellm_f1"] <= 100 and row["minutes"] > 0 for row in report["curve"])  # percent


def _exit_line(monkeypatch, capsys, script: str, *args: str) -> str:
    """Run ``benchmarks/SCRIPT``'s ``main`` in this process (no second start-up) and return the
    one line it exits with, status 2."""
    module = importlib.import_module(f"benchmarks.{script}")
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *args])
    with pytest.raises(SystemExit) as exited:
        module.main()
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_training_speed_without_the_corpus_says_so_in_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    line = _exit_line(monkeypatch, capsys, "training_speed", "--data", str(tmp_path / "nowhere"), "--base", str(TINY), "--json", str(tmp_path / "x.json"))
    assert "conll2003/train.txt" in line and "--data" in line
    assert not (tmp_path / "x.json").exists()


def test_training_speed_without_the_base_model_says_how_to_install_it(tmp_path: Path, data_dir: Path, monkeypatch, capsys) -> None:
    line = _exit_line(monkeypatch, capsys, "training_speed", "--data", str(data_dir), "--base", str(tmp_path / "no-model"), "--json", str(tmp_path / "x.json"))
    assert "no-model" in line and "make install" in line


def test_batch_throughput_without_spacy_says_how_to_install_it(tmp_path: Path, monkeypatch, capsys) -> None:
    from benchmarks import batch_throughput

    monkeypatch.setattr(batch_throughput, "SPACY_MODEL", "no_such_spacy_pipeline")
    line = _exit_line(monkeypatch, capsys, "batch_throughput", "--json", str(tmp_path / "x.json"))
    assert "no_such_spacy_pipeline" in line and ".[bench]" in line and "--no-spacy" in line


def test_kept_vocabulary_without_a_kept_vocabulary_ends_with_one_line(tmp_path: Path, data_dir: Path) -> None:
    line = _one_line_exit(_run("kept_vocabulary.py", "--model", "tiny-conll03", "--limit", "2",
                               "--data", str(data_dir / "resume" / "dev.txt"), "--json", str(tmp_path / "k.json")))
    assert "not trained over a kept vocabulary" in line


def test_score_calibration_reports_precision_and_recall_at_each_threshold(tmp_path: Path, data_dir: Path) -> None:
    out = tmp_path / "score_calibration.json"
    report = _report(_run("score_calibration.py", "--model", "tiny-conll03", "--limit", "8", "--strategies", "padellm,ar",
                          "--data", str(data_dir / "conll2003" / "dev.txt"), "--json", str(out)), out)
    assert report["n_texts"] == 8 and set(report["strategies"]) == {"padellm", "ar"}
    for measured in report["strategies"].values():
        rows = measured["thresholds"]
        assert [r["threshold"] for r in rows] == [0.0, 0.3, 0.5, 0.7]
        assert rows[0]["kept"] == measured["mentions"] > 0 and [r["kept"] for r in rows] == sorted((r["kept"] for r in rows), reverse=True)
        assert [r["recall"] for r in rows] == sorted((r["recall"] for r in rows), reverse=True)  # a higher threshold never finds more
        assert sum(b["mentions"] for b in measured["reliability"]) == measured["mentions"] and 0 <= measured["ece"] <= 1


def test_cpu_inference_times_todays_path_against_the_new_default_in_one_run(tmp_path: Path, data_dir: Path) -> None:
    out = tmp_path / "cpu_inference.json"
    report = _report(_run("cpu_inference.py", "--model", "tiny-conll03", "--limit", "2", "--batch-sizes", "1,16", "--no-cold",
                          "--data", str(data_dir / "conll2003" / "dev.txt"), "--json", str(out)), out)
    rows = report["results"]
    assert [(r["batch"], r["arm"]) for r in rows] == [(1, "baseline"), (1, "default"), (1, "int8"), (1, "tanh_gelu"), (1, "ar_default"),
                                                       (16, "baseline"), (16, "default"), (16, "int8"), (16, "tanh_gelu")]
    assert rows[0]["dtype"] == "float32" and rows[1]["dtype"] == report["default_dtype"] == rows[3]["dtype"] and rows[2]["dtype"] == "int8"
    assert report["exact_gelu_speedup_batch1"] > 0 and report["exact_gelu_speedup_batch16"] > 0
    assert report["speedup_batch1"] > 0 and report["speedup_batch16"] > 0 and report["padellm_vs_ar_batch1"] > 0
    assert report["int8_speedup_batch1"] > 0 and report["int8_speedup_batch16"] > 0 and 0 <= report["f1_int8"] <= 100
    assert all(0 <= r["identical_texts"] <= 2 for r in rows) and rows[0]["identical_texts"] == 2  # the baseline is itself
    assert 0 <= report["f1_baseline"] <= 100 and 0 <= report["f1_default"] <= 100 and 0 <= report["identical_texts"] <= 2
    assert all(r["gflops"] > 0 and r["peak_gflops"] > 0 and r["part_ms_per_text"]["decoder stack"] > 0 for r in rows)
    assert all(r["part_ms_per_text"]["output layer"] > 0 for r in rows)  # the whole layer (baseline, AR) and the restricted rows
    assert f"{report['default_dtype']}_threads{report['default_threads']}" in report["matmul_peak_gflops"]
    assert all(value > 0 for value in report["matmul_peak_gflops"].values())


def test_cpu_inference_times_the_cold_commands_as_started_from_a_shell() -> None:
    """Every cold command ran to its end (a failed one is NaN): the program and, beside it, the same
    extract in a process that keeps its whole start and end; and each step of a cold extract."""
    from benchmarks.cpu_inference import cold_phases, cold_timings

    found = cold_timings("tiny-conll03", repeats=1)
    assert set(found) == {"help", "ingest_help", "extract_one_sentence", "extract_one_sentence_whole_teardown",
                          "extract_one_sentence_merged_at_start", "extract_one_sentence_transformers_classes"}
    assert all(0 < seconds < 300 for seconds in found.values()), found
    steps = cold_phases("tiny-conll03")  # a self-contained model: no adapter to merge
    assert list(steps) == ["import torch", "import transformers", "import the engine", "tokenizer", "weights",
                           "the rest of the load", "first sentence"], steps
    assert all(seconds > 0 for seconds in steps.values()), steps


def test_llama_cpp_backend_runs_padellm_on_llama_cpp_beside_the_default_or_says_what_it_needs(tmp_path: Path, data_dir: Path) -> None:
    out = tmp_path / "llama_cpp_backend.json"
    done = _run("llama_cpp_backend.py", "--limit", "2", "--batch-sizes", "1,2", "--weights", "bf16",
                "--data", str(data_dir / "conll2003" / "dev.txt"), "--json", str(out))
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("gguf") is None:
        assert "pip install llama-cpp-python gguf" in _one_line_exit(done)
        return
    report = _report(done, out)
    rows = report["results"]
    assert [(r["batch"], r["arm"]) for r in rows] == [(1, "torch"), (1, "llama.cpp bf16"), (2, "torch"), (2, "llama.cpp bf16")]
    # the same strategy over the same merged weights: these two sentences' entities come back alike
    assert all(r["identical_texts"] == 2 and r["f1"] == rows[0]["f1"] for r in rows)
    assert report["bf16_speedup_batch1"] > 0 and report["load_seconds"]["llama.cpp bf16"] > 0
