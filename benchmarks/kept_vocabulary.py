"""A decoding step with the whole output layer against the kept vocabulary's, and the entities of both.

A model trained over a kept vocabulary (``kept_vocabulary.json``: the training rows' tokens and
every single-character token) could load with a :class:`KeptHead` that computes only those
tokens' logits; it loads with the whole head, because the entities changed (docs/benchmarks.md). For each dev text the model caches the PaDeLLM prefix and feeds one token per row on top
of it, for a batch of 1 and of 16 rows, once with the whole head and once with the kept one,
interleaved. Then the engine tags the same texts with each head (PaDeLLM and AR): the entities
must not change.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.reporting import bar_plots, benchmark_parser, fail, print_table, require_model, write_json  # noqa: E402
from corpora import read_corpus  # noqa: E402
from general_decoding.kept_vocabulary import KeptHead, KeptVocabulary  # noqa: E402
from general_decoding.kv_cache import select_rows  # noqa: E402
from ner_service.engine import NEREngine, NERModel, prompts  # noqa: E402
from ner_service.engine.ner_model import resolve_ner_model  # noqa: E402
from training.evaluate import predict, span_f1  # noqa: E402

RESUME_DEV = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "resume" / "dev.txt"
BATCHES = (1, 16)


def main() -> None:
    parser = benchmark_parser(__doc__, "kept_vocabulary", limit=100, model="zh-resume")
    parser.set_defaults(data=str(RESUME_DEV))
    args = parser.parse_args()
    if not Path(args.data).is_file():
        fail("kept_vocabulary.py", f"dev data {args.data} not found (give --data FILE)")
    require_model("kept_vocabulary.py", args.model, "zh-resume")
    vocabulary = KeptVocabulary.load(resolve_ner_model(args.model))
    if vocabulary is None:
        fail("kept_vocabulary.py", f"model {args.model!r} was not trained over a kept vocabulary (no kept_vocabulary.json): "
                                   f"train one with --kept-vocabulary, e.g. `padellm-ner train --recipe zh-resume`")
    whole = NERModel.load(args.model)
    model, tokenizer = whole.model, whole.tokenizer
    heads = {"whole": model.get_output_embeddings(), "kept": KeptHead(model.get_output_embeddings(), vocabulary)}
    examples = [e for e in read_corpus(args.data) if e.text.strip()][: args.limit]

    seconds: dict[tuple[str, int], list[float]] = {(h, b): [] for h in heads for b in BATCHES}
    with torch.inference_mode():
        for example in tqdm(examples, desc="decode steps", unit="text"):
            prefix = torch.tensor([tokenizer(prompts.prefix(example.text)).input_ids])
            cached = model(input_ids=prefix, use_cache=True).past_key_values
            for rows in BATCHES:
                fed = torch.full((rows, 1), tokenizer.eos_token_id)
                positions = torch.full((rows, 1), prefix.shape[1])
                for name, head in heads.items():  # interleaved: noise hits both alike
                    model.set_output_embeddings(head)
                    cache = select_rows(cached, [0] * rows)
                    began = time.perf_counter()
                    model(input_ids=fed, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
                    seconds[name, rows].append(time.perf_counter() - began)

    gold = [[(s.start, s.end, s.label) for s in e.spans] for e in examples]
    entities = {}
    for name, head in heads.items():
        model.set_output_embeddings(head)
        engine = NEREngine(whole)
        for strategy in ("padellm", "ar"):
            entities[name, strategy] = predict(engine, examples, engine.options(None, strategy, None), batch_size=16).entities
    median = {key: 1000 * statistics.median(values) for key, values in seconds.items()}
    steps = [{"batch": rows, "whole_ms": median["whole", rows], "kept_ms": median["kept", rows],
              "speedup": median["whole", rows] / median["kept", rows]} for rows in BATCHES]
    quality = [{"strategy": strategy, "whole_f1": span_f1(gold, entities["whole", strategy])["micro_f1"],
                "kept_f1": span_f1(gold, entities["kept", strategy])["micro_f1"],
                "identical_texts": sum(a == b for a, b in zip(entities["whole", strategy], entities["kept", strategy])),
                "texts": len(examples)} for strategy in ("padellm", "ar")]
    print(f"\n{args.model}: a one-token decoding step over a cached prefix, median of {len(examples)} texts, "
          f"kept vocabulary {len(vocabulary):,} of {heads['whole'].out_features:,} tokens, {torch.get_num_threads()} threads")
    print_table(steps, list(steps[0]))
    print_table(quality, list(quality[0]))
    path = write_json(args.json, {"benchmark": "kept_vocabulary", "model": args.model, "n_texts": len(examples),
                                  "kept_tokens": len(vocabulary), "vocabulary": heads["whole"].out_features,
                                  "decode_step": steps, "quality": quality})
    png = bar_plots(path.with_suffix(".png"), [f"batch {rows}" for rows in BATCHES], {
        "decode step, whole head (ms)": [s["whole_ms"] for s in steps],
        "decode step, kept head (ms)": [s["kept_ms"] for s in steps],
        "speed-up": [s["speedup"] for s in steps],
    }, f"Kept vocabulary, {args.model}")
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
