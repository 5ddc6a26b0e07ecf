"""The ``fast_dllm`` strategy: a masked-diffusion NER model answers the all-entities query.

Each window's prompt is the AR baseline's (``Text: ...`` + ``All entities:``); the sampler
fills a fixed-length answer of mask tokens (``max_ar_tokens`` of ``ner_model.json``), which
is parsed into ``LABEL: mention`` lines like the AR answer. A mention's score is the sum of
its tokens' log-confidence at the step that unmasked them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from general_decoding.diffusion import BlockDiffusionSampler, fast_dllm_sampler
from ner_service.engine.spans import Mention

if TYPE_CHECKING:
    from ner_service.engine.engine import ExtractionStats, NEREngine, _Window


class NotADiffusionModelError(ValueError):
    """The model's tokenizer has no mask token, so it cannot be sampled by diffusion."""


def default_sampler() -> BlockDiffusionSampler:
    """Fast-dLLM with a dual cache, blocks of 8 and threshold 0.9 (the engine's default)."""
    return fast_dllm_sampler(block_size=8, threshold=0.9, cache="dual")


def extract_mentions(engine: "NEREngine", windows: list["_Window"], labels: list[str], mentions: list[list[Mention]],
                     stats: "ExtractionStats", sampler: BlockDiffusionSampler | None = None) -> None:
    """Sample every window's answer in one batch and append its mentions of ``labels``."""
    ner_model = engine.ner_model
    mask_id = ner_model.tokenizer.mask_token_id
    if mask_id is None:
        raise NotADiffusionModelError(f"model {ner_model.config.name!r} is not a masked-diffusion model (no mask token); "
                                      "decoder 'fast_dllm' needs one (train it with `padellm-ner train-diffusion`)")
    config = ner_model.config
    sampler = replace(sampler or default_sampler(), shift=config.diffusion_shift, causal_prompt=config.diffusion_causal_prompt)
    out = sampler.sample(ner_model.model, engine._ar_prompts(windows), config.max_ar_tokens, int(mask_id), ner_model.eos_token_id, engine._pad)
    stats.forward_passes += out.forward_passes
    stats.generated_tokens += out.generated_tokens
    for window, (tokens, logprobs) in enumerate(zip(out.tokens, out.token_logprobs)):
        mentions[window].extend(engine._ar_mentions(tokens, logprobs, labels))
