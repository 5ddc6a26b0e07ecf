"""Samplers for masked-diffusion LMs (any Hugging Face model run with bidirectional attention).

:class:`BlockDiffusionSampler` covers LLaDA's baseline (fixed steps per block, low-confidence
remasking, no cache) and Fast-dLLM (prefix or dual KV cache refreshed at block boundaries,
confidence-threshold or factor-based parallel unmasking, or a left-to-right run above a
threshold).
"""

from general_decoding.diffusion.layout import bidirectional_mask, block_bounds, causal_prompt_mask
from general_decoding.diffusion.sampler import BlockDiffusionSampler, DiffusionOutput, fast_dllm_sampler, llada_sampler
from general_decoding.diffusion.unmasking import (
    FactorUnmasking,
    FixedStepsUnmasking,
    LeftToRightUnmasking,
    ThresholdUnmasking,
    Unmasking,
)

__all__ = [
    "BlockDiffusionSampler",
    "DiffusionOutput",
    "FactorUnmasking",
    "FixedStepsUnmasking",
    "LeftToRightUnmasking",
    "ThresholdUnmasking",
    "Unmasking",
    "bidirectional_mask",
    "block_bounds",
    "causal_prompt_mask",
    "fast_dllm_sampler",
    "llada_sampler",
]
