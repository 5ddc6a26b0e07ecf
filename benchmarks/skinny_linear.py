"""Forward cost by number of fed tokens: nn.Linear against SkinnyLinear, in one run.

For each CoNLL-03 dev sentence the shipped model caches the PaDeLLM prefix, then feeds
1, 2, 4, 8, 16 and 32 tokens on top of it (a greedy step, drafts to verify, rows of a batch)
once with plain ``nn.Linear`` layers and once with :class:`SkinnyLinear`, interleaved.
Reports the median forward time per width, the speed-up, and each width's cost relative to
one token (what a drafting decoder must beat).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.reporting import bar_plots, benchmark_parser, print_table, write_json  # noqa: E402
from general_decoding.kv_cache import select_rows  # noqa: E402
from general_decoding.skinny_linear import use_skinny_linear  # noqa: E402
from ner_service.engine import NEREngine, prompts  # noqa: E402
from corpora import read_corpus  # noqa: E402

WIDTHS = (1, 2, 4, 8, 16, 32)
KINDS = {"linear": False, "skinny": True}  # use_skinny_linear(model, enabled)


def main() -> None:
    parser = benchmark_parser(__doc__, "skinny_linear", limit=20)
    args = parser.parse_args()

    engine = NEREngine.load(args.model)
    model, tokenizer = engine.ner_model.model, engine.ner_model.tokenizer
    texts = [e.text for e in read_corpus(args.data) if e.text.strip()][: args.limit]
    seconds: dict[tuple[str, int], list[float]] = {(k, w): [] for k in KINDS for w in WIDTHS}
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for text in tqdm(texts, desc="sentences", unit="text"):
            prefix = torch.tensor([tokenizer(prompts.prefix(text)).input_ids])
            cached = model(input_ids=prefix, use_cache=True).past_key_values
            for width in WIDTHS:
                fed = torch.randint(100, tokenizer.vocab_size, (1, width), generator=generator)
                positions = torch.arange(prefix.shape[1], prefix.shape[1] + width)[None]
                for name, skinny in KINDS.items():  # interleaved: noise hits both alike
                    use_skinny_linear(model, enabled=skinny)
                    cache = select_rows(cached, [0])  # a fresh copy: the forward extends it
                    began = time.perf_counter()
                    model(input_ids=fed, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=width)
                    seconds[name, width].append(time.perf_counter() - began)
    use_skinny_linear(model)
    median = {key: 1000 * statistics.median(values) for key, values in seconds.items()}
    results = [{
        "tokens": width,
        "linear_ms": median["linear", width],
        "skinny_ms": median["skinny", width],
        "speedup": median["linear", width] / median["skinny", width],
        "linear_cost_vs_1": median["linear", width] / median["linear", 1],
        "skinny_cost_vs_1": median["skinny", width] / median["skinny", 1],
    } for width in WIDTHS]
    print(f"\n{args.model}: one forward over a cached prefix, median of {len(texts)} sentences, float32, {torch.get_num_threads()} threads")
    print_table(results, list(results[0]))
    path = write_json(args.json, {"benchmark": "skinny_linear", "model": args.model, "n_sentences": len(texts), "results": results})
    png = bar_plots(path.with_suffix(".png"), [f"{w} tok" for w in WIDTHS], {
        "speed-up of SkinnyLinear": [r["speedup"] for r in results],
        "cost vs 1 token, nn.Linear": [r["linear_cost_vs_1"] for r in results],
        "cost vs 1 token, SkinnyLinear": [r["skinny_cost_vs_1"] for r in results],
    }, f"Forward cost by tokens fed, {args.model}")
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
