"""Parallel decoders for any Hugging Face causal LM, behind one interface.

Every decoder is registered by name; ``greedy`` is the reference that the lossless decoders
reproduce token for token. Drafting decoders are one draft-and-verify loop composed with a
:class:`Drafter`; token constraints (:mod:`general_decoding.constraints`) compose with any
decoder that ``supports_constraints``.
"""

from general_decoding.base import DecodeInputs, Decoder, Generation, StopCriteria, left_pad
from general_decoding.constraints import BannedFirstToken, TokenBias, TokenConstraint, TokenTrie, TrieConstraint, choose
from general_decoding.draft_verify import Drafter, DraftVerifyDecoder
from general_decoding.registry import (
    UnknownDecoderError,
    available_decoders,
    get_decoder,
    register_decoder,
)
# importing a decoder module registers its decoders
from general_decoding import copy_draft, greedy, jacobi, lexical_units, lookahead, ngram, one_sequence, speculative  # noqa: F401,E402

__all__ = [
    "BannedFirstToken",
    "DecodeInputs",
    "Decoder",
    "DraftVerifyDecoder",
    "Drafter",
    "Generation",
    "StopCriteria",
    "TokenBias",
    "TokenConstraint",
    "TokenTrie",
    "TrieConstraint",
    "UnknownDecoderError",
    "available_decoders",
    "choose",
    "get_decoder",
    "left_pad",
    "register_decoder",
]
