"""Things registered by name, in the style of spaCy's registries: the decoders here, and any
other family of interchangeable parts (the engine's strategies use the same class)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from general_decoding.base import Decoder

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Decoder])


class UnknownNameError(ValueError):
    """A name that is not registered."""


class UnknownDecoderError(UnknownNameError):
    """Raised for a decoder name that is not registered."""


class Registry(Generic[T]):
    """Entries of one kind by name, in the order they were registered (``kind`` names them in
    errors; ``error`` is the :class:`UnknownNameError` subclass an unknown name raises)."""

    def __init__(self, kind: str, error: type[UnknownNameError] = UnknownNameError) -> None:
        self.kind, self.error = kind, error
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register the decorated object as ``name`` (a class also gets ``name``)."""

        def wrap(entry: T) -> T:
            if isinstance(entry, type):
                entry.name = name  # type: ignore[attr-defined]
            self._entries[name] = entry
            return entry

        return wrap

    def names(self) -> list[str]:
        """Every registered name, in registration order."""
        return list(self._entries)

    def get(self, name: str) -> T:
        """The entry registered as ``name``."""
        try:
            return self._entries[name]
        except KeyError:
            raise self.error(f"unknown {self.kind} {name!r}; available: {', '.join(self.names())}") from None


DECODERS: Registry[Callable[..., Decoder]] = Registry("decoder", UnknownDecoderError)


def register_decoder(name: str) -> Callable[[F], F]:
    """Decorator of a :class:`Decoder` class or of a function building one: make it available
    as ``get_decoder(name, **options)``."""
    return DECODERS.register(name)  # type: ignore[return-value]


def available_decoders() -> list[str]:
    """Names of every registered decoder, sorted."""
    return sorted(DECODERS.names())


def get_decoder(name: str, **options: Any) -> Decoder:
    """A new decoder instance by registered name."""
    decoder = DECODERS.get(name)(**options)
    decoder.name = name
    return decoder
