"""Fast-dLLM: a masked-diffusion NER model answers the all-entities query.

Each window's prompt is the AR baseline's (``Text: ...`` + ``All entities:``); the sampler
fills a fixed-length answer of mask tokens (``max_ar_tokens`` of ``ner_model.json``), which
is parsed into ``LABEL: mention`` lines like the AR answer. A mention's score is the sum of
its tokens' log-confidence at the step that unmasked them.
"""

from __future__ import annotations

from dataclasses import replace

from general_decoding import Decoder
from general_decoding.diffusion import BlockDiffusionSampler, fast_dllm_sampler
from ner_service.engine import prompts
from ner_service.engine.chunking import Window
from ner_service.engine.ner_model import NERModelConfig, shipped_models_that
from ner_service.engine.results import ExtractionStats
from ner_service.engine.spans import Mention
from ner_service.engine.strategies import register_strategy
from ner_service.engine.strategies.autoregressive import answer_mentions
from ner_service.engine.strategies.base import Strategy


def default_sampler(threshold: float = 0.9) -> BlockDiffusionSampler:
    """Fast-dLLM with a dual cache, blocks of 8, and ``threshold`` (the model's
    ``diffusion_threshold``) over the run of positions after the first masked one (parallel
    tokens accepted apart from each other cost about 7 F1 on CoNLL-03 dev), a full forward at the
    first block only, every later block starting from the cache of the block before (1.12x faster
    at batch 16, whole-dev F1 -0.11: docs/benchmarks.md)."""
    return fast_dllm_sampler(block_size=8, threshold=threshold, cache="dual", left_to_right=True, full_forward_every=None)


@register_strategy("fast_dllm")
class FastDLLM(Strategy):
    """Every window's answer sampled in one batch by the options' ``diffusion_sampler``
    (when None, :func:`default_sampler` at the model's threshold); the token decoder plays no part."""

    decoder_ignored = "masked diffusion samples the answer's tokens"

    @classmethod
    def unsupported_reason(cls, config: NERModelConfig) -> str | None:
        if config.mask_token is None:
            diffusion = shipped_models_that(lambda c: c.mask_token is not None)
            return (f"model {config.name!r} is not a masked-diffusion model (no mask token); strategy 'fast_dllm' needs one: "
                    f"the shipped ones: {', '.join(diffusion) or 'none'} (`padellm-ner train --recipe en-conll03-diffusion` builds one)")
        return None

    def mentions(self, windows: list[Window], labels: list[str], decoder: Decoder, stats: ExtractionStats) -> list[list[Mention]]:
        ner_model, config = self.ner_model, self.ner_model.config
        sampler = replace(self.options.diffusion_sampler or default_sampler(config.diffusion_threshold), shift=config.diffusion_shift,
                          causal_prompt=config.diffusion_causal_prompt)
        prompt_ids = [prompts.ar_prompt_ids(ner_model.tokenizer, w.text) for w in windows]
        out = sampler.sample(ner_model.model, prompt_ids, config.max_ar_tokens, int(ner_model.tokenizer.mask_token_id),
                             ner_model.eos_token_id, ner_model.pad_token_id)
        stats.forward_passes += out.forward_passes
        stats.generated_tokens += out.generated_tokens
        return [answer_mentions(ner_model, tokens, logprobs, labels) for tokens, logprobs in zip(out.tokens, out.token_logprobs)]
