"""Training on the CPU: the top layers alone from cached frozen hidden states give the same loss
and gradients as the whole model, the precision follows the device and its instructions, mixed
precision trains float32 weights with the float32 loss's gradients, and a run killed at any moment
resumes to exactly the weights of a run that was never stopped (tiny model, real processes)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from training.examples import build_row
from training.loss import answer_loss, inner_model
from training.top_layers import FrozenHidden
from training.precision import PRECISIONS, resolve_precision
from training.trainer import TrainConfig, prepare_model
from corpora import Example, Span
from tests.conftest import TINY_DIR

TINY = TINY_DIR
TINY_LAYERS = json.loads((TINY / "config.json").read_text())["num_hidden_layers"]
NAMES = ["Peter", "Anna", "Maria", "Jon", "Li Wei", "Omar"]
PLACES = ["Paris", "Berlin", "Lagos", "Lima", "Oslo"]


def _examples(n: int, seed: int = 0) -> list[Example]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        who, where = rng.choice(NAMES), rng.choice(PLACES)
        text = f"{who} flew to {where} on day {i} ."
        out.append(Example(text, [Span(0, len(who), "PER"), Span(len(who) + 9, len(who) + 9 + len(where), "LOC")]))
    return out


def _jsonl(path: Path, examples: list[Example]) -> Path:
    lines = [json.dumps({"text": e.text, "entities": [{"start": s.start, "end": s.end, "label": s.label} for s in e.spans]})
             for e in examples]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_the_precision_follows_the_device_and_its_instructions() -> None:
    assert resolve_precision("auto", "cpu", cpu_bfloat16=False).name == "float32"
    assert resolve_precision("auto", "cpu", cpu_bfloat16=True).name == "mixed"
    assert resolve_precision("auto", "cuda").name == "bfloat16"
    assert resolve_precision("auto", "cpu").weights == torch.float32  # whatever this CPU has
    assert resolve_precision("bfloat16", "cpu").weights == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype 'int8'; choose one of auto, float32, bfloat16, mixed"):
        resolve_precision("int8", "cpu")


def test_mixed_precision_trains_float32_weights_along_the_float32_gradients(tmp_path: Path) -> None:
    model, tokenizer, first = prepare_model(TrainConfig(base=str(TINY), train="-", output=str(tmp_path), full=True, top_layers=1))
    rows = [build_row(e, ["LOC", "PER"], tokenizer) for e in _examples(6)]
    pad, trained = tokenizer.eos_token_id, [p for p in model.parameters() if p.requires_grad]

    def loss_and_grads(precision: str) -> tuple[float, torch.Tensor]:
        model.zero_grad()
        with PRECISIONS[precision].autocast("cpu"):
            loss = answer_loss(model, rows, pad)
        loss.backward()
        return loss.item(), torch.cat([p.grad.flatten() for p in trained])

    exact, exact_grads = loss_and_grads("float32")
    mixed, mixed_grads = loss_and_grads("mixed")
    assert mixed != exact and mixed == pytest.approx(exact, rel=0.02)  # bfloat16 products, not a float32 pass
    assert torch.nn.functional.cosine_similarity(exact_grads, mixed_grads, dim=0) > 0.99
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in trained)

    folder, lm = tmp_path / "frozen", inner_model(model)
    exact_hidden = FrozenHidden.build(lm, [r.tree for r in rows], first, folder, pad).hidden.clone()
    with PRECISIONS["mixed"].autocast("cpu"):
        mixed_hidden = FrozenHidden.build(lm, [r.tree for r in rows], first, folder, pad).hidden.clone()
    assert not torch.equal(exact_hidden, mixed_hidden), "states computed in float32 were reused for a mixed-precision run"
    assert (mixed_hidden - exact_hidden).norm() < 0.01 * exact_hidden.norm()  # bfloat16 products: about 3 significant digits


def test_lora_on_the_top_layers_adapts_those_layers_only(tmp_path: Path) -> None:
    model, _, first = prepare_model(TrainConfig(base=str(TINY), train="-", output=str(tmp_path), lora_r=4, top_layers=2))
    adapted = {name.split(".layers.")[1].split(".")[0] for name, p in model.named_parameters() if p.requires_grad}
    assert first == TINY_LAYERS - 2 and adapted == {str(TINY_LAYERS - 2), str(TINY_LAYERS - 1)}
    with pytest.raises(ValueError, match=f"between 1 and {TINY_LAYERS}"):
        prepare_model(TrainConfig(base=str(TINY), train="-", output=str(tmp_path), top_layers=TINY_LAYERS + 1))


def test_full_fine_tuning_of_the_top_layers_freezes_the_rest(tmp_path: Path) -> None:
    model, _, first = prepare_model(TrainConfig(base=str(TINY), train="-", output=str(tmp_path), full=True, top_layers=1))
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    top = f".layers.{TINY_LAYERS - 1}."
    assert first == TINY_LAYERS - 1 and any(top in name for name in trained)
    assert all(top in name or name == "model.norm.weight" for name in trained)


def test_the_top_layers_from_cached_hidden_states_give_the_whole_models_loss_and_gradients(tmp_path: Path) -> None:
    model, tokenizer, first = prepare_model(TrainConfig(base=str(TINY), train="-", output=str(tmp_path), lora_r=4, top_layers=1))
    torch.manual_seed(0)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.05)  # a LoRA that has learnt something
    rows = [build_row(e, ["LOC", "PER"], tokenizer) for e in _examples(6)]
    pad = tokenizer.eos_token_id
    frozen = FrozenHidden.build(inner_model(model), [r.tree for r in rows], first, tmp_path / "frozen", pad, batch_tokens=128)
    batch = [0, 3, 5]

    def loss_and_grads(hidden: torch.Tensor | None) -> tuple[float, list[torch.Tensor]]:
        model.zero_grad()
        loss = answer_loss(model, [rows[i] for i in batch], pad, hidden, first if hidden is not None else 0)
        loss.backward()
        return loss.item(), [p.grad.clone() for p in model.parameters() if p.requires_grad]

    whole, whole_grads = loss_and_grads(None)
    cached, cached_grads = loss_and_grads(frozen.padded(batch))
    assert cached == pytest.approx(whole, rel=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(whole_grads, cached_grads))
    again = FrozenHidden.build(inner_model(model), [r.tree for r in rows], first, tmp_path / "frozen", pad, batch_tokens=128)
    assert torch.equal(again.hidden, frozen.hidden)  # read back, not recomputed


def _train(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "padellm_ner.cli", "train", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})


def test_a_run_killed_mid_step_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "train.jsonl", _examples(48))
    common = ["--train", str(data), "--base", str(TINY), "--full", "--top-layers", "1", "--lr", "3e-3", "--max-steps", "60",
              "--batch-tokens", "256", "--seed", "3"]
    uninterrupted = _train([*common, "--output", str(tmp_path / "whole")])
    assert uninterrupted.wait(timeout=300) == 0, uninterrupted.stderr.read()

    killed = _train([*common, "--output", str(tmp_path / "killed"), "--checkpoint-minutes", "0"])
    checkpoint = tmp_path / "killed" / "checkpoint" / "checkpoint.pt"
    deadline = time.monotonic() + 240
    while not checkpoint.is_file() and time.monotonic() < deadline and killed.poll() is None:
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)  # a checkpoint is written after every step: the run is in a later step or saving
    killed.wait()
    assert killed.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    stopped_at = torch.load(checkpoint, weights_only=False)["state"]["step"]
    assert 0 < stopped_at < 60

    resumed = _train([*common, "--output", str(tmp_path / "killed"), "--resume"])
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    whole, continued = load_file(tmp_path / "whole" / "model.safetensors"), load_file(tmp_path / "killed" / "model.safetensors")
    assert whole.keys() == continued.keys()
    assert all(torch.equal(whole[k], continued[k]) for k in whole), "the resumed run diverged"
    assert json.loads((tmp_path / "killed" / "training.json").read_text())["steps"] == 60


def test_an_interrupted_frozen_pass_continues_where_it_stopped(tmp_path: Path) -> None:
    model, tokenizer, first = prepare_model(TrainConfig(base=str(TINY), train="-", output=str(tmp_path), lora_r=4, top_layers=1))
    trees = [build_row(e, ["LOC", "PER"], tokenizer).tree for e in _examples(20)]
    pad, lm = tokenizer.eos_token_id, inner_model(model)
    whole = FrozenHidden.build(lm, trees, first, tmp_path / "whole", pad, batch_tokens=64).hidden.clone()
    partial = FrozenHidden.build(lm, trees, first, tmp_path / "partial", pad, batch_tokens=64)
    meta = json.loads((tmp_path / "partial" / "hidden.json").read_text())
    meta["done"] = 7  # as if killed after the first 7 rows (shortest first) were written
    (tmp_path / "partial" / "hidden.json").write_text(json.dumps(meta))
    later = sorted(range(len(trees)), key=lambda i: len(trees[i][0]))[7:]
    for index in later:
        partial.hidden[partial.offsets[index]:partial.offsets[index + 1]] = 0.0
    resumed = FrozenHidden.build(lm, trees, first, tmp_path / "partial", pad, batch_tokens=64)
    assert torch.equal(resumed.hidden, whole)
    assert json.loads((tmp_path / "partial" / "hidden.json").read_text())["done"] == len(trees)


def test_the_schedule_ends_when_the_run_is_out_of_minutes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from training.loop import LoopSettings, last_step_in_time, run_loop

    assert last_step_in_time(600, 100, 1000.0, 1300.0, None) == 600  # no budget: the epochs decide
    assert last_step_in_time(600, 100, 1000.0, 1300.0, 60.0) == 100 + (3600 - 1300) // 10  # 10 s a step, 300 s of setup
    assert last_step_in_time(600, 100, 100.0, 100.0, 60.0) == 600  # the epochs end first
    assert last_step_in_time(600, 100, 1000.0, 4000.0, 60.0) == 100  # out of time: ends now

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    inputs, targets = torch.randn(64, 8), torch.randn(64, 1)

    now = [0.0]  # the loop's clock: every step takes 0.04 s of it, however fast the machine
    monkeypatch.setattr("training.loop.time.perf_counter", lambda: now[0])

    def batch_loss(batch: list[int]) -> torch.Tensor:
        now[0] += 0.04
        return torch.nn.functional.mse_loss(model(inputs[batch]), targets[batch])

    rates: list[float] = []
    hook = register_optimizer_step_pre_hook(lambda optimizer, *_: rates.append(optimizer.param_groups[0]["lr"]))
    try:
        settings = LoopSettings(lr=1e-2, batch_tokens=8, seed=0, checkpoint_folder=tmp_path, epochs=100, warmup_steps=2,
                                max_minutes=2 / 60, checkpoint_minutes=60)
        state = run_loop(model, [1] * 64, batch_loss, settings)
    finally:
        hook.remove()
    assert 49 <= state["step"] <= 51, state["step"]  # 2 s of 0.04 s steps, long before its 800 planned steps
    assert max(rates[2:]) > 0.9e-2 and rates[-1] < 0.15e-2  # from the peak to near the floor (10 %) in the minutes given
    assert rates[len(rates) // 2] < 0.8e-2  # halfway through the minutes, halfway down: not a cosine over 800 steps


def test_the_memory_ceiling_hands_the_pages_jemalloc_keeps_back_to_the_kernel() -> None:
    from training.allocator import JEMALLOC_SETTINGS, jemalloc_library

    library = jemalloc_library()
    if library is None:
        pytest.skip("jemalloc is not installed (Debian: libjemalloc2)")
    # tensors of many sizes, all freed: jemalloc without decay keeps their pages for reuse
    script = """
import json, torch
from training.allocator import MemoryCeiling, anonymous_memory, current_allocator
start = anonymous_memory()
tensors = [torch.ones(2_000_000 + 40_000 * n) for n in range(40)]
del tensors
kept = anonymous_memory()
above = MemoryCeiling(limit=2 * kept).check()
unchanged = anonymous_memory()
ceiling = MemoryCeiling(limit=start + 100 * 2**20)
released = ceiling.check()
print(json.dumps({"allocator": current_allocator(), "start": start, "kept": kept, "above": above, "unchanged": unchanged,
                  "released": released, "releases": ceiling.releases, "after": anonymous_memory()}))
"""
    environment = dict(os.environ, LD_PRELOAD=str(library), MALLOC_CONF=JEMALLOC_SETTINGS)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment, timeout=120)
    assert done.returncode == 0, done.stderr
    memory = json.loads(done.stdout)
    assert memory["allocator"] == "jemalloc"
    mb = 2**20
    assert memory["kept"] - memory["start"] > 300 * mb  # 40 tensors of 8-14 MB freed, their pages kept
    assert not memory["above"] and abs(memory["unchanged"] - memory["kept"]) < 20 * mb  # under its limit: nothing done
    assert memory["released"] and memory["releases"] == 1
    assert memory["after"] < memory["kept"] - 250 * mb  # above it: handed back


def test_a_process_without_a_limit_never_releases() -> None:
    from training.allocator import MemoryCeiling

    assert not MemoryCeiling(None).check()
    assert MemoryCeiling.of_machine(0.5).limit is not None  # this machine's /proc answers
