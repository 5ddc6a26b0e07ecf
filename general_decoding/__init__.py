"""Parallel decoders for any Hugging Face causal LM, behind one interface.

Every decoder is registered by name; ``greedy`` is the reference that the lossless decoders
reproduce token for token. Drafting decoders are one draft-and-verify loop composed with a
:class:`Drafter`; token constraints (:mod:`general_decoding.constraints`) compose with any
decoder that ``supports_constraints``.
"""

from importlib import import_module
from typing import Any

#: Each public name and the module that defines it: imported on first use (PEP 562), so that the
#: registry's names are read without loading torch.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["DecodeInputs", "Decoder", "Generation", "StopCriteria", "left_pad"], "general_decoding.base"),
    **dict.fromkeys(["BannedFirstToken", "TokenBias", "TokenConstraint", "TokenTrie", "TrieConstraint", "choose"],
                    "general_decoding.constraints"),
    **dict.fromkeys(["Drafter", "DraftVerifyDecoder"], "general_decoding.draft_verify"),
    **dict.fromkeys(["UnknownDecoderError", "available_decoders", "get_decoder", "register_decoder"], "general_decoding.registry"),
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


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
