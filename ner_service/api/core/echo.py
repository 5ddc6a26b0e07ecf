"""How much of a request an error body quotes back: a few values, each cut short, and a count,
so that an error answer stays small whatever the request held."""

from __future__ import annotations

from collections.abc import Sequence

#: The most values (ids, validation errors) one error body lists.
ECHO_MAX = 10
#: The most characters of one quoted value.
ECHO_CHARS = 200


def clipped(value: str) -> str:
    """``value`` cut to :data:`ECHO_CHARS` characters (marked with an ellipsis when cut)."""
    return value if len(value) <= ECHO_CHARS else value[:ECHO_CHARS] + "…"


def quoted(values: Sequence[object]) -> str:
    """The first :data:`ECHO_MAX` values, comma-separated and clipped, and how many more there are."""
    shown = ", ".join(clipped(str(value)) for value in values[:ECHO_MAX])
    return shown if len(values) <= ECHO_MAX else f"{shown} and {len(values) - ECHO_MAX} more"
