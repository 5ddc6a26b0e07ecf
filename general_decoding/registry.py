"""Decoders registered by name, in the style of spaCy's registries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from general_decoding.base import Decoder

_DECODERS: dict[str, Callable[..., Decoder]] = {}
D = TypeVar("D", bound=type[Decoder])


class UnknownDecoderError(ValueError):
    """Raised for a decoder name that is not registered."""


def register_decoder(name: str) -> Callable[[D], D]:
    """Class decorator: make a decoder available as ``get_decoder(name)``."""

    def wrap(cls: D) -> D:
        cls.name = name
        _DECODERS[name] = cls
        return cls

    return wrap


def available_decoders() -> list[str]:
    """Names of every registered decoder."""
    return sorted(_DECODERS)


def get_decoder(name: str, **options: Any) -> Decoder:
    """A new decoder instance by registered name."""
    try:
        factory = _DECODERS[name]
    except KeyError:
        raise UnknownDecoderError(f"unknown decoder {name!r}; available: {', '.join(available_decoders())}") from None
    return factory(**options)
