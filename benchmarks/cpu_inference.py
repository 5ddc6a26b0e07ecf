"""Today's CPU path against the new default, on the same dev texts, at batch 1 and 16, in one run.

Arms (the same model, the same texts, interleaved batch by batch so that machine noise hits them
alike; each warmed up on its first batch, untimed):

* ``baseline``: the path before issue 78: transformers' model class, float32 weights, PaDeLLM's
  answers over the whole output layer (262,144 rows for Gemma 3), torch's default threads;
* ``default``: the engine's default now: Gemma 3 in the package's own class
  (``ner_service/engine/gemma3_model.py``), ``dtype auto`` (bfloat16 on a CPU with AVX512_BF16 or
  AMX, else float32), count and mention logits over the tokens their answers may take only
  (``ner_service/engine/answer_vocabulary.py``), threads from the CPU quota (``engine/cpu.py``);
* ``int8`` (``--no-int8`` leaves it out): the default with int8 weights in the decoder stack's
  linear layers (PyTorch's dynamic quantisation: weights int8 per output row, each product's
  input quantised to 8 bits on the fly), float32 around them on every CPU: a lever measured
  beside the default, not taken by it, because it changes the entities (:func:`with_int8_weights`);
* ``tanh_gelu`` (``--no-tanh-gelu`` leaves it out): the default with Gemma's GELU in the tanh
  form it is trained with, where the default computes the exact form in bfloat16
  (:mod:`general_decoding.exact_gelu`): what that lever gains, and whether the entities stay;
* ``ar_default`` (batch 1; ``--no-ar`` leaves it out): the AR baseline (ANPD drafting, the
  figure of the README) under the new default's dtype and threads: PaDeLLM against AR there.

Per arm and batch size: micro-F1, ms per text (mean, p50, p90), texts per second, forwards; where
the time goes: the strategy's phases (prefix+count, mention, repair; AR: answer) and, across
them, the decoder stack's forwards, the output layer, and the rest (Python, tokenizer, framework
outside the model); the achieved GFLOP/s of the matrix products (two per weight per fed token in
the decoder stack, two per output row computed per position) against the machine's measured peak
(a 2048 x 2048 ``torch.matmul`` in float32 and in bfloat16, at each arm's threads). With
``--cold`` (default on) it also times commands from a cold process: ``padellm-ner --help``,
``padellm-ner ingest --help`` and ``padellm-ner extract`` of one sentence (the median of three),
that ``extract`` in a process that collects cycles while it loads and is torn down at its end,
and the same load and sentence with the model merged at every start (``PADELLM_MERGED_CACHE=0``)
and with transformers' model class (the path before :mod:`ner_service.engine.gemma3_model`);
then each step of a cold ``extract`` (imports, tokenizer, weights, adapter merge, first sentence).

The JSON holds ``speedup_batch16`` (texts/s of the default over the baseline at batch 16),
``speedup_batch1`` (the baseline's latency over the default's at batch 1), ``f1_baseline`` and
``f1_default`` (the batch-16 runs over every text), ``padellm_vs_ar_batch1``, ``int8_speedup_batch1``
and ``int8_speedup_batch16`` (the int8 arm against the default) with ``f1_int8``,
``exact_gelu_speedup_batch1`` and ``exact_gelu_speedup_batch16`` (the default against ``tanh_gelu``), the rows (each
with ``identical_texts``: its texts whose entities are the baseline's), the phase table and the
peaks; the PNG is drawn beside it.

Usage: python benchmarks/cpu_inference.py [--limit N] [--json PATH] [--model NAME] [--data FILE]
       [--batch-sizes 1,16] [--threads N] [--no-int8] [--no-tanh-gelu] [--no-ar] [--no-cold]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.reporting import benchmark_parser, print_table, save_figure, write_json  # noqa: E402
from corpora import read_corpus  # noqa: E402
from general_decoding import row_vocabulary  # noqa: E402
from general_decoding.exact_gelu import use_exact_gelu  # noqa: E402
from general_decoding.skinny_linear import use_skinny_linear  # noqa: E402
from ner_service.engine import NEREngine  # noqa: E402
from ner_service.engine.cpu import available_cpus, cpu_has_bfloat16, inference_dtype, inference_threads  # noqa: E402
from training.evaluate import span_f1  # noqa: E402

PHASES = ("prefix+count", "mention", "repair", "answer", "other")
PARTS = ("decoder stack", "output layer", "outside the model")
COLD_TEXT = "EU rejects German call to boycott British lamb ."


@dataclass
class Arm:
    """One way to run the engine, and what it measured."""

    name: str
    engine: NEREngine
    threads: int
    strategy: str = "padellm"
    decoder: str | None = None
    seconds: list[float] = field(default_factory=list)  # per call
    texts: int = 0
    forwards: int = 0
    phase_ms: dict[str, float] = field(default_factory=dict)
    part_s: dict[str, float] = field(default_factory=dict)
    flops: float = 0.0
    spans: list[list[tuple[int, int, str]]] = field(default_factory=list)


class Meter:
    """Times and counts the matrix products of a model: its decoder stack's forwards (tokens fed)
    and its output layer, the whole one (a hook on it) or restricted rows (``RowVocabulary.sparse_logprobs``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        stack, head = model.get_decoder(), model.get_output_embeddings()
        embedding = model.get_input_embeddings()
        self.stack_params = sum(p.numel() for p in stack.parameters()) - sum(p.numel() for p in embedding.parameters())
        self.hidden = head.weight.shape[1]
        self.stack_s = self.head_s = 0.0
        self.stack_flops = self.head_flops = 0.0
        self._stack_began = self._head_began = 0.0
        stack.register_forward_pre_hook(self._stack_before, with_kwargs=True)
        stack.register_forward_hook(self._stack_after)
        head.register_forward_pre_hook(self._head_before)
        head.register_forward_hook(self._head_after)

    def _stack_before(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids")
        self.stack_flops += 2.0 * self.stack_params * (ids.numel() if ids is not None else 0)
        self._stack_began = time.perf_counter()

    def _stack_after(self, module: torch.nn.Module, args: tuple, output: object) -> None:
        self.stack_s += time.perf_counter() - self._stack_began

    def _head_before(self, module: torch.nn.Module, args: tuple) -> None:
        self._head_began = time.perf_counter()

    def _head_after(self, module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        self.head_s += time.perf_counter() - self._head_began
        self.head_flops += 2.0 * self.hidden * output.numel()

    def restricted(self, seconds: float, positions: int, rows: int) -> None:
        self.head_s += seconds
        self.head_flops += 2.0 * self.hidden * positions * rows

    def reset(self) -> None:
        self.stack_s = self.head_s = self.stack_flops = self.head_flops = 0.0


@contextmanager
def metered_restriction(meters: dict[int, Meter]):
    """Route :meth:`RowVocabulary.sparse_logprobs` (which ``logprobs`` calls) through the meter of
    the head it multiplies by."""
    original = row_vocabulary.RowVocabulary.sparse_logprobs

    def timed(self, hidden, head, softcap=None):
        began = time.perf_counter()
        out = original(self, hidden, head, softcap)
        meter = meters.get(id(head))
        if meter is not None:
            meter.restricted(time.perf_counter() - began, hidden.shape[0] * hidden.shape[1], len(self.ids))
        return out

    row_vocabulary.RowVocabulary.sparse_logprobs = timed
    try:
        yield
    finally:
        row_vocabulary.RowVocabulary.sparse_logprobs = original


def matmul_peak(dtype: torch.dtype, threads: int, size: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of a ``size`` x ``size`` matrix product in ``dtype`` at ``threads`` threads (the best of ``repeats``)."""
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    torch.matmul(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - began)
    return 2.0 * size ** 3 / best / 1e9


def with_int8_weights(engine: NEREngine) -> NEREngine:
    """``engine`` with every linear layer of its model's decoder stack dynamically quantised to
    int8 (per output row), in place; the output layer and the embedding stay as they were."""
    model = engine.ner_model.model
    use_skinny_linear(model, enabled=False)  # quantisation takes plain ``nn.Linear`` layers only
    stack = model.get_decoder()
    layers = {name for name, module in stack.named_modules() if isinstance(module, torch.nn.Linear)}
    with warnings.catch_warnings():  # torch.ao.quantization warns that torchao will replace it
        warnings.simplefilter("ignore")
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        quantize_dynamic(stack, {name: per_channel_dynamic_qconfig for name in layers}, inplace=True)
    use_skinny_linear(model)
    return engine


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_batch(arm: Arm, meter: Meter, batch: list[str], timed: bool = True) -> None:
    torch.set_num_threads(arm.threads)
    meter.reset()
    began = time.perf_counter()
    results = arm.engine.extract(batch, strategy=arm.strategy, decoder=arm.decoder)
    seconds = time.perf_counter() - began
    if not timed:
        return
    stats = results[0].stats
    arm.seconds.append(seconds)
    arm.texts += len(batch)
    arm.forwards += stats.forward_passes
    arm.spans += [[(e.start, e.end, e.label) for e in r.entities] for r in results]
    phases = dict(stats.phase_ms)
    phases["other"] = stats.latency_ms - sum(phases.values())
    for phase, ms in phases.items():
        arm.phase_ms[phase] = arm.phase_ms.get(phase, 0.0) + ms
    parts = {"decoder stack": meter.stack_s, "output layer": meter.head_s,
             "outside the model": max(seconds - meter.stack_s - meter.head_s, 0.0)}
    for part, value in parts.items():
        arm.part_s[part] = arm.part_s.get(part, 0.0) + value
    arm.flops += meter.stack_flops + meter.head_flops


def measure(arms: list[Arm], meters: dict[str, Meter], texts: list[str], batch_size: int) -> None:
    """Every arm over ``texts`` in batches of ``batch_size``, interleaved batch by batch (the
    order alternating), after an untimed warm-up batch each."""
    for arm in arms:
        run_batch(arm, meters[arm.name], texts[:batch_size], timed=False)
    for number, start in enumerate(tqdm(range(0, len(texts), batch_size), desc=f"batch {batch_size}", unit="batch")):
        batch = texts[start:start + batch_size]
        for arm in (arms if number % 2 == 0 else arms[::-1]):
            run_batch(arm, meters[arm.name], batch)


def row_of(arm: Arm, gold: list[list[tuple[int, int, str]]], batch_size: int, peaks: dict[str, float], dtype: str,
           activations: str) -> dict:
    """The arm's figures; ``dtype`` its weights' (for the table), ``activations`` the dtype whose matmul peak it is held against."""
    total = sum(arm.seconds)
    per_text = [1000 * s / batch_size for s in arm.seconds] if batch_size > 1 else [1000 * s for s in arm.seconds]
    gflops = arm.flops / total / 1e9
    peak = peaks[f"{activations}_threads{arm.threads}"]
    return {
        "batch": batch_size, "arm": arm.name, "dtype": dtype, "threads": arm.threads, "strategy": arm.strategy,
        "f1": span_f1(gold[: len(arm.spans)], arm.spans)["micro_f1"],
        "ms_per_text": 1000 * total / arm.texts, "p50_ms": percentile(per_text, 0.5), "p90_ms": percentile(per_text, 0.9),
        "texts_per_s": arm.texts / total, "forwards_per_text": arm.forwards / arm.texts,
        "gflop_per_text": arm.flops / arm.texts / 1e9, "gflops": gflops, "peak_gflops": peak, "peak_share": gflops / peak,
        "phase_ms_per_text": {phase: ms / arm.texts for phase, ms in arm.phase_ms.items()},
        "part_ms_per_text": {part: 1000 * s / arm.texts for part, s in arm.part_s.items()},
        "output_layer_share": arm.part_s.get("output layer", 0.0) / total,
    }


#: ``padellm-ner`` called from Python rather than started as the program: a process that collects
#: cycles while it loads and is torn down at its end (:mod:`padellm_ner.one_shot`), as before.
CALLED_FROM_PYTHON = "import sys; from padellm_ner.cli import main; sys.exit(main(sys.argv[1:]))"
#: ``extract`` as the program runs it (:mod:`padellm_ner.one_shot`), the model loaded with
#: transformers' class (``native`` False): what the path was before the package's own class.
WITH_TRANSFORMERS_CLASSES = """
import sys
from padellm_ner import one_shot
one_shot.begin()
from ner_service.engine import NEREngine
engine = NEREngine.load(sys.argv[1], dtype="auto", native=False)
one_shot.loaded()
print(engine.extract([sys.argv[2]])[0].entities)
one_shot.finish(0)
"""


def cold_timings(model: str, repeats: int = 3) -> dict[str, float]:
    """Median seconds of commands in fresh processes, as a user starts them (the shell's
    ``padellm-ner``), and of ``extract`` in a process that keeps the whole start and end."""
    command = str(Path(sys.executable).with_name("padellm-ner"))
    extract = ["extract", "--model", model, COLD_TEXT]
    merged_at_start = {**os.environ, "PADELLM_MERGED_CACHE": "0"}
    runs = {"help": ([command, "--help"], None), "ingest_help": ([command, "ingest", "--help"], None),
            "extract_one_sentence": ([command, *extract], None),
            "extract_one_sentence_whole_teardown": ([sys.executable, "-c", CALLED_FROM_PYTHON, *extract], None),
            "extract_one_sentence_merged_at_start": ([command, *extract], merged_at_start),
            "extract_one_sentence_transformers_classes": ([sys.executable, "-c", WITH_TRANSFORMERS_CLASSES, model, COLD_TEXT], None)}
    subprocess.run([command, *extract], capture_output=True, cwd=REPO, timeout=600)  # the first start keeps the merge
    found = {}
    for name, (args, env) in runs.items():
        seconds = []
        for _ in range(repeats):
            began = time.perf_counter()
            done = subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=600, env=env)
            seconds.append(time.perf_counter() - began if done.returncode == 0 else float("nan"))
        found[name] = statistics.median(seconds)
    return found


#: A fresh process that starts and loads as the program does (:mod:`padellm_ner.one_shot`) and
#: times each step of a cold ``extract``: the imports, then the engine's own load with its
#: tokenizer, weights and adapter merge timed where they are called, then the first sentence.
COLD_PHASES = """
import json, sys, time
from padellm_ner import one_shot
one_shot.begin()
spent, last = {}, time.perf_counter()
def lap(name):
    global last
    now = time.perf_counter()
    spent[name], last = now - last, now
import torch
lap("import torch")
import transformers
lap("import transformers")
from ner_service.engine import NEREngine, lora_merge, model_loading, ner_model
from ner_service.engine.strategies import strategy_class
strategy_class("padellm")
lap("import the engine")
def timed(owner, attribute, name):
    original = getattr(owner, attribute)
    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - began
    setattr(owner, attribute, wrapper)
timed(model_loading, "cached_tokenizer", "tokenizer")
timed(ner_model, "load_causal_lm", "weights")  # its tokenizer taken out below
timed(lora_merge, "merge_lora", "adapter merge")
engine = NEREngine.load(sys.argv[1], dtype="auto")
one_shot.loaded()
lap("load")
spent["weights"] -= spent["tokenizer"]
spent["the rest of the load"] = spent.pop("load") - sum(spent.get(k, 0.0) for k in ("tokenizer", "weights", "adapter merge"))
engine.extract([sys.argv[2]])
lap("first sentence")
print(json.dumps(spent))
"""


def cold_phases(model: str) -> dict[str, float]:
    """Seconds of each step of a cold ``extract`` (:data:`COLD_PHASES`), in a fresh process."""
    done = subprocess.run([sys.executable, "-c", COLD_PHASES, model, COLD_TEXT], capture_output=True, text=True, cwd=REPO, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the cold-phase probe failed: {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def plot(path: Path, rows: list[dict], title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(14, 4))
    labels = [f"b{r['batch']} {r['arm']}" for r in rows]
    palette = {"baseline": "#4c72b0", "default": "#dd8452", "int8": "#c44e52", "tanh_gelu": "#8172b3"}
    colours = [palette.get(r["arm"], "#55a868") for r in rows]
    for axis, key, name in ((axes[0], "ms_per_text", "ms per text"), (axes[1], "texts_per_s", "texts per second")):
        bars = axis.bar(labels, [r[key] for r in rows], color=colours)
        axis.bar_label(bars, fmt="%.1f", fontsize=8)
        axis.set_title(name, fontsize=10)
        axis.tick_params(axis="x", labelrotation=25, labelsize=8)
    bottom = [0.0] * len(rows)
    for part in PARTS:
        values = [r["part_ms_per_text"].get(part, 0.0) for r in rows]
        axes[2].bar(labels, values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values)]
    axes[2].set_title("where a text's time goes (ms)", fontsize=10)
    axes[2].tick_params(axis="x", labelrotation=25, labelsize=8)
    axes[2].legend(fontsize=8)
    figure.suptitle(title, fontsize=11)
    return save_figure(figure, path)


def main() -> None:
    parser = benchmark_parser(__doc__, "cpu_inference", limit=96)
    parser.add_argument("--batch-sizes", default="1,16", help="comma-separated (default %(default)s)")
    parser.add_argument("--threads", type=int, default=None,
                        help="the default arm's threads (default: NER_THREADS, else the CPU quota: engine/cpu.py)")
    parser.add_argument("--no-int8", dest="int8", action="store_false", help="leave out the int8 arm")
    parser.add_argument("--no-tanh-gelu", dest="tanh_gelu", action="store_false",
                        help="leave out the arm of the default with GELU's tanh form")
    parser.add_argument("--no-ar", dest="ar", action="store_false", help="leave out the AR arm at batch 1")
    parser.add_argument("--no-cold", dest="cold", action="store_false", help="leave out the cold-process timings")
    args = parser.parse_args()

    examples = [e for e in read_corpus(args.data) if e.text.strip()][: args.limit]
    texts = [e.text for e in examples]
    gold = [[(s.start, s.end, s.label) for s in e.spans] for e in examples]
    torch_default_threads = torch.get_num_threads()
    threads = args.threads or inference_threads()
    dtype = inference_dtype("auto")
    baseline = NEREngine.load(args.model, dtype=torch.float32, restricted_output=False, native=False)
    default = NEREngine.load(args.model, dtype=dtype, restricted_output=True)
    engines = {"baseline": baseline, "default": default}
    if args.int8:
        engines["int8"] = NEREngine.load(args.model, dtype=torch.float32, restricted_output=True)  # quantised products take float32
    if args.tanh_gelu:
        engines["tanh_gelu"] = NEREngine.load(args.model, dtype=dtype, restricted_output=True)
        use_exact_gelu(engines["tanh_gelu"].ner_model.model, enabled=False)
    meters = {name: Meter(engine.ner_model.model) for name, engine in engines.items()}  # before quantising: its FLOPs count weights
    if args.int8:
        with_int8_weights(engines["int8"])
    meters["ar_default"] = meters["default"]
    peaks = {f"{name}_threads{n}": matmul_peak(getattr(torch, name), n)
             for name in {"float32", dtype} for n in {torch_default_threads, threads}}
    rows = []
    load_start = os.getloadavg()
    with metered_restriction({id(e.ner_model.model.get_output_embeddings()): meters[name] for name, e in engines.items()}):
        for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
            for engine in engines.values():
                engine.max_batch_texts = batch_size
            arms = [Arm("baseline", baseline, torch_default_threads), Arm("default", default, threads)]
            if args.int8:
                arms.append(Arm("int8", engines["int8"], threads))
            if args.tanh_gelu:
                arms.append(Arm("tanh_gelu", engines["tanh_gelu"], threads))
            if args.ar and batch_size == 1:
                arms.append(Arm("ar_default", default, threads, strategy="ar", decoder="anpd"))
            measure(arms, meters, texts, batch_size)
            for arm in arms:
                activations = "float32" if arm.name in ("baseline", "int8") else dtype
                rows.append(row_of(arm, gold, batch_size, peaks, "int8" if arm.name == "int8" else activations, activations))
                rows[-1]["identical_texts"] = sum(a == b for a, b in zip(arms[0].spans, arm.spans))
    cold = cold_timings(args.model) if args.cold else {}
    phases_cold = cold_phases(args.model) if args.cold else {}

    def find(batch: int, arm: str) -> dict | None:
        return next((r for r in rows if r["batch"] == batch and r["arm"] == arm), None)

    summary: dict[str, float | None] = {"speedup_batch16": None, "speedup_batch1": None, "padellm_vs_ar_batch1": None,
                                        "int8_speedup_batch1": None, "int8_speedup_batch16": None,
                                        "exact_gelu_speedup_batch1": None, "exact_gelu_speedup_batch16": None}
    if find(16, "default"):
        summary["speedup_batch16"] = find(16, "default")["texts_per_s"] / find(16, "baseline")["texts_per_s"]
    if find(1, "default"):
        summary["speedup_batch1"] = find(1, "baseline")["ms_per_text"] / find(1, "default")["ms_per_text"]
    if find(1, "ar_default"):
        summary["padellm_vs_ar_batch1"] = find(1, "ar_default")["ms_per_text"] / find(1, "default")["ms_per_text"]
    for batch in (1, 16):
        if find(batch, "int8"):
            summary[f"int8_speedup_batch{batch}"] = find(batch, "default")["ms_per_text"] / find(batch, "int8")["ms_per_text"]
        if find(batch, "tanh_gelu"):
            summary[f"exact_gelu_speedup_batch{batch}"] = find(batch, "tanh_gelu")["ms_per_text"] / find(batch, "default")["ms_per_text"]
    largest = max(r["batch"] for r in rows)
    f1_baseline, f1_default = find(largest, "baseline")["f1"], find(largest, "default")["f1"]
    int8_row = find(largest, "int8")
    machine = {"cpu_count": os.cpu_count(), "available_cpus": available_cpus(), "cpu_bfloat16": cpu_has_bfloat16(),
               "torch_default_threads": torch_default_threads, "loadavg_start": load_start, "loadavg_end": os.getloadavg()}
    where = (f"{args.model}, {len(texts)} dev sentences, {machine['cpu_count']} CPUs "
             f"({'with' if machine['cpu_bfloat16'] else 'without'} bfloat16 instructions), default {dtype}, {threads} threads")
    print(f"\n{where}")
    print_table(rows, ["batch", "arm", "dtype", "threads", "f1", "ms_per_text", "p50_ms", "p90_ms", "texts_per_s",
                       "forwards_per_text", "gflop_per_text", "gflops", "peak_gflops", "output_layer_share", "identical_texts"])
    phase_rows = [{"batch": r["batch"], "arm": r["arm"], **{p: r["phase_ms_per_text"].get(p, 0.0) for p in PHASES},
                   **{p: r["part_ms_per_text"].get(p, 0.0) for p in PARTS}} for r in rows]
    print("\nms per text by phase and by part")
    print_table(phase_rows, ["batch", "arm", *PHASES, *PARTS])
    print("\n" + ", ".join(f"{k} {v:.2f}" for k, v in summary.items() if v is not None) + f"; F1 {f1_baseline:.2f} -> {f1_default:.2f}"
          f" (batch {largest}; {find(largest, 'default')['identical_texts']} of {len(texts)} texts with the same entities)"
          + (f"; int8 weights: F1 {int8_row['f1']:.2f}, {int8_row['identical_texts']} texts the same" if int8_row else ""))
    if cold:
        print("cold process: " + ", ".join(f"{k} {v:.2f} s" for k, v in cold.items()))
        print("a cold extract, step by step: " + ", ".join(f"{k} {v:.2f} s" for k, v in phases_cold.items()))
    path = write_json(args.json, {"benchmark": "cpu_inference", "model": args.model, "n_sentences": len(texts), "default_dtype": dtype,
                                  "default_threads": threads, **summary, "f1_baseline": f1_baseline, "f1_default": f1_default,
                                  "f1_int8": int8_row["f1"] if int8_row else None,
                                  "identical_texts": find(largest, "default")["identical_texts"],
                                  "matmul_peak_gflops": peaks, "cold_s": cold, "cold_phases_s": phases_cold, "machine": machine, "results": rows,
                                  "phases": phase_rows})
    png = plot(path.with_suffix(".png"), rows, f"today's CPU path against the new default: {where}")
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
