"""Parallel decoders for any Hugging Face causal LM, behind one interface.

Every decoder is a small :class:`Decoder` subclass registered by name; ``greedy``
is the reference that the lossless decoders reproduce token for token.
"""

from general_decoding.base import Decoder, Generation, StopCriteria, left_pad
from general_decoding.registry import (
    UnknownDecoderError,
    available_decoders,
    get_decoder,
    register_decoder,
)
# importing a decoder module registers its decoders
from general_decoding import copy_draft, greedy, jacobi, lexical_units, lookahead, ngram, one_sequence, speculative  # noqa: F401,E402

__all__ = [
    "Decoder",
    "Generation",
    "StopCriteria",
    "UnknownDecoderError",
    "available_decoders",
    "get_decoder",
    "left_pad",
    "register_decoder",
]
