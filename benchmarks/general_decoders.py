"""The lossless decoders of ``general_decoding`` against greedy decoding, in one run.

Four tasks on CoNLL-03 dev sentences: (a) ``ar_ner``, the shipped model's AR query;
(b) ``mention``, a PaDeLLM mention query; (c) ``continuation``, free continuation of the
sentence by the model's base (SmolLM2; a model that holds its own weights is its own base);
(d) ``engine``, the whole PaDeLLM engine with the decoder as its decoder (identical: the same
entities). Per decoder and task: wall-clock speed-up over greedy (same prompts, interleaved),
tokens per forward, forward passes, and whether every output is identical to greedy's.
``--batch-size B`` decodes B sentences' queries as one left-padded batch (and B texts per
engine call); a decoder of one row at a time is left out.

Usage: python benchmarks/general_decoders.py [--limit N] [--batch-size B] [--json PATH] [--model NAME] [--data FILE]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.reporting import bar_plots, benchmark_parser, print_table, write_json  # noqa: E402
from general_decoding import StopCriteria, get_decoder, left_pad  # noqa: E402
from ner_service.engine import NEREngine, prompts  # noqa: E402
from ner_service.engine.model_loading import load_causal_lm  # noqa: E402
from ner_service.engine.ner_model import SELF_CONTAINED  # noqa: E402
from corpora import read_corpus  # noqa: E402

DECODERS = ("greedy", "jacobi", "gs_jacobi", "anpd", "lookahead", "copy")
CONTINUATION_TOKENS = 48


def queries(engine: NEREngine, text: str, mentions: dict[str, int]) -> dict[str, list[int]]:
    """The AR query, one mention query (first label with a mention, else PER) and the plain text."""
    tokenizer = engine.ner_model.tokenizer
    prefix = tokenizer(prompts.prefix(text)).input_ids
    label = next((lab for lab, n in mentions.items() if n), "PER")
    count = max(1, mentions.get(label, 0))
    return {
        "ar": prefix + tokenizer(prompts.ar_query(), add_special_tokens=False).input_ids,
        "mention": prefix + tokenizer(prompts.mention_query(label, count, 1), add_special_tokens=False).input_ids,
        "continuation": tokenizer(text).input_ids,
    }


def spans(extractions: list) -> list[list[tuple[int, int, str]]]:
    """Each extraction's (start, end, label) spans: what "identical" compares on the engine task."""
    return [[(e.start, e.end, e.label) for e in x.entities] for x in extractions]


def main() -> None:
    parser = benchmark_parser(__doc__, "general_decoders", limit=50)
    parser.add_argument("--batch-size", type=int, default=1, help="sentences decoded as one batch (default %(default)s)")
    args = parser.parse_args()

    engine = NEREngine.load(args.model)
    config = engine.ner_model.config
    base = engine.ner_model.model if config.base == SELF_CONTAINED else load_causal_lm(config.base)[0]  # a model of its own weights is its base
    models = {"ar": engine.ner_model.model, "mention": engine.ner_model.model, "continuation": base}
    examples = [e for e in read_corpus(args.data) if e.text.strip()][: args.limit]
    limits = {"ar": config.max_ar_tokens, "mention": config.max_mention_tokens,
              "continuation": CONTINUATION_TOKENS}
    decoders = {name: get_decoder(name) for name in DECODERS}
    decoders = {name: d for name, d in decoders.items() if args.batch_size == 1 or d.supports_batch}
    kinds = [*limits, "engine"]
    seconds = {(d, q): 0.0 for d in decoders for q in kinds}
    forwards = {(d, q): 0 for d in decoders for q in kinds}
    emitted = {(d, q): 0 for d in decoders for q in kinds}
    identical = {(d, q): True for d in decoders for q in kinds}
    batches = [examples[i:i + args.batch_size] for i in range(0, len(examples), args.batch_size)]
    warm = queries(engine, examples[0].text, {})
    for name, decoder in decoders.items():  # untimed: first calls pay for allocations, not decoding
        decoder.generate(models["mention"], torch.tensor([warm["mention"]]), StopCriteria(limits["mention"], frozenset({engine.ner_model.eos_token_id})))
        engine.extract([examples[0].text], decoder=name)
    for batch in tqdm(batches, desc=f"batches of {args.batch_size}", unit="batch"):
        rows = [queries(engine, e.text, {lab: len(e.mentions(lab)) for lab in engine.labels}) for e in batch]
        for kind in limits:
            stop = StopCriteria(limits[kind], frozenset({engine.ner_model.eos_token_id}))
            ids, mask = left_pad([r[kind] for r in rows], engine.ner_model.eos_token_id)
            reference = None
            for name, decoder in decoders.items():  # interleaved: noise hits every decoder alike
                began = time.perf_counter()
                out = decoder.generate(models[kind], ids, stop, attention_mask=mask)
                seconds[name, kind] += time.perf_counter() - began
                forwards[name, kind] += out.forward_passes
                emitted[name, kind] += sum(len(t) + s for t, s in zip(out.tokens, out.stopped))
                reference = reference or out.tokens
                identical[name, kind] &= out.tokens == reference
        expected = None
        for name in decoders:
            began = time.perf_counter()
            found = engine.extract([e.text for e in batch], decoder=name)
            seconds[name, "engine"] += time.perf_counter() - began
            calls = {id(x.stats): x.stats for x in found}.values()  # one stats object per engine call
            forwards[name, "engine"] += sum(s.forward_passes for s in calls)
            emitted[name, "engine"] += sum(s.generated_tokens for s in calls)
            expected = expected or spans(found)
            identical[name, "engine"] &= spans(found) == expected
    results = []
    for kind in kinds:
        for name in decoders:
            results.append({
                "task": {"ar": "ar_ner"}.get(kind, kind), "decoder": name,
                "speedup": seconds["greedy", kind] / seconds[name, kind],
                "tokens_per_forward": emitted[name, kind] / forwards[name, kind],
                "forward_passes": forwards[name, kind],
                "ms_per_query": 1000 * seconds[name, kind] / len(examples),
                "identical_to_greedy": identical[name, kind],
            })
    print(f"\n{args.model} (tasks a, b, d) and its base (task c) on {len(examples)} sentences, batch {args.batch_size}, float32, "
          f"{torch.get_num_threads()} threads")
    print_table(results, ["task", "decoder", "speedup", "tokens_per_forward", "forward_passes", "ms_per_query", "identical_to_greedy"])
    path = write_json(args.json, {"benchmark": "decoders", "model": args.model, "n_sentences": len(examples),
                                   "batch_size": args.batch_size, "results": results})
    labels = [f"{r['task']}/{r['decoder']}" for r in results]
    png = bar_plots(path.with_suffix(".png"), labels, {
        "speed-up over greedy": [r["speedup"] for r in results],
        "tokens per forward": [r["tokens_per_forward"] for r in results],
    }, f"Lossless decoders vs greedy, {args.model}, {len(examples)} CoNLL-03 dev sentences, batch {args.batch_size}")
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
