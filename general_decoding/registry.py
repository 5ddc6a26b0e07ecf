"""Things registered by name, in the style of spaCy's registries: the decoders here, and any
other family of interchangeable parts (the engine's strategies use the same class).

A registry knows each entry's module before it is imported (its catalogue): listing the names
imports nothing (``padellm-ner extract --help`` lists the decoders without loading torch), and
getting an entry imports its module, whose decorator registers it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from general_decoding.base import Decoder

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., "Decoder"])


class UnknownNameError(ValueError):
    """A name that is not registered."""


class UnknownDecoderError(UnknownNameError):
    """Raised for a decoder name that is not registered."""


class Registry(Generic[T]):
    """Entries of one kind by name: the ``catalogue``'s (name -> the module that registers it) in
    its order, then any registered elsewhere (``kind`` names them in errors; ``error`` is the
    :class:`UnknownNameError` subclass an unknown name raises)."""

    def __init__(self, kind: str, error: type[UnknownNameError] = UnknownNameError, catalogue: Mapping[str, str] | None = None) -> None:
        self.kind, self.error = kind, error
        self.catalogue = dict(catalogue or {})
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
        """Every name: the catalogue's, then those registered elsewhere, in registration order."""
        return list(dict.fromkeys([*self.catalogue, *self._entries]))

    def get(self, name: str) -> T:
        """The entry registered as ``name`` (its catalogued module imported first)."""
        if name not in self._entries and name in self.catalogue:
            import_module(self.catalogue[name])
        try:
            return self._entries[name]
        except KeyError:
            raise self.error(f"unknown {self.kind} {name!r}; available: {', '.join(self.names())}") from None


#: Each decoder and the module that registers it.
DECODER_MODULES = {
    "greedy": "general_decoding.greedy", "copy": "general_decoding.copy_draft", "anpd": "general_decoding.ngram",
    "jacobi": "general_decoding.jacobi", "gs_jacobi": "general_decoding.jacobi", "lookahead": "general_decoding.lookahead",
    "speculative": "general_decoding.speculative", "lud": "general_decoding.lexical_units", "one_sequence": "general_decoding.one_sequence",
}
DECODERS: "Registry[Callable[..., Decoder]]" = Registry("decoder", UnknownDecoderError, DECODER_MODULES)


def register_decoder(name: str) -> Callable[[F], F]:
    """Decorator of a :class:`Decoder` class or of a function building one: make it available
    as ``get_decoder(name, **options)``."""
    return DECODERS.register(name)  # type: ignore[return-value]


def available_decoders() -> list[str]:
    """Names of every registered decoder, sorted."""
    return sorted(DECODERS.names())


def get_decoder(name: str, **options: Any) -> "Decoder":
    """A new decoder instance by registered name."""
    decoder = DECODERS.get(name)(**options)
    decoder.name = name
    return decoder
