"""What every entry point refuses about options before a model is involved, torch-free: the
schemas of the API and of the batch jobs import it, and a command that loads no model (``padellm-ner
ingest``, ``jobs status``) must not load torch (:mod:`.options` re-exports these)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: Option names of before 0.1 and the names that replaced them: refused, naming the new one.
RENAMED_OPTIONS = {"backend": "decoder"}


class InvalidOptionsError(ValueError):
    """Options the model cannot run; the message says what it supports."""


def refuse_renamed(fields: Iterable[str], renamed: Mapping[str, str] = RENAMED_OPTIONS, where: str = "") -> None:
    """An :class:`InvalidOptionsError` for the first of ``fields`` that ``renamed`` lists: "`old`
    ``where`` is now `new`" (the service answers old option names with the name to send)."""
    for field in fields:
        if field in renamed:
            raise InvalidOptionsError(f"`{field}`{where} is now `{renamed[field]}`")
