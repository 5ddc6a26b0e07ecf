"""Labels asked at call time: what a caller may send, and how a query writes it.

A caller names labels as strings or as ``{"name": ..., "description": ...}`` (a :class:`LabelSpec`).
A model trained for its own labels answers those only; an open model (``open_labels`` in its
``ner_model.json``) answers any name, its description (when given) written beside the name in
the query. The rules for a list of open labels are here, in one place: every entry point (API,
CLI, spaCy, batch jobs, Python) checks labels through :func:`label_specs`, and says which names
the model never trained on through :func:`unfamiliar_names`.
"""

from __future__ import annotations

import json
import unicodedata
import warnings
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ner_service.engine import prompts

#: The most labels one request may ask of an open model (each label is a count branch and its mentions).
MAX_OPEN_LABELS = 50
MAX_NAME_CHARS = 100
MAX_DESCRIPTION_CHARS = 300
#: The names and descriptions one API request or batch job may ask in all: every window is asked
#: every label, and an engine batch's memory grows with them (docs/api.md). Local callers (the
#: command line, Python, spaCy) are not held to it.
MAX_REQUEST_LABEL_CHARS = 2_000


class InvalidLabelsError(ValueError):
    """A label list that cannot be asked: the message says which entry and why."""


class UnfamiliarLabelsWarning(UserWarning):
    """Labels asked of an open model by names it never trained on (:func:`unfamiliar_names`)."""


@dataclass(frozen=True)
class LabelSpec:
    """A label as a caller names it: its name, which comes back on every entity, and an optional
    description of what it means."""

    name: str
    description: str | None = None

    @property
    def prompt(self) -> str:
        """How a query writes this label (:func:`prompts.label_prompt`)."""
        return prompts.label_prompt(self.name, self.description)


def _problem(text: str, what: str, limit: int) -> str | None:
    if not text.strip():
        return f"{what} is empty"
    if len(text) > limit:
        return f"{what} has {len(text):,} characters (at most {limit})"
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text):
        return f"{what} holds a line break or control character (a label is written on one line)"
    return None


def label_spec(entry: object) -> LabelSpec:
    """One entry of a label list: a name, a ``{"name", "description"}`` mapping or a :class:`LabelSpec`."""
    if isinstance(entry, LabelSpec):
        return entry
    if isinstance(entry, str):
        return LabelSpec(entry)
    if isinstance(entry, Mapping):
        unknown = set(entry) - {"name", "description"}
        if unknown or not isinstance(entry.get("name"), str) or not isinstance(entry.get("description"), (str, type(None))):
            raise InvalidLabelsError('a label is a name or {"name": ..., "description": ...} of strings')
        return LabelSpec(entry["name"], entry.get("description") or None)
    raise InvalidLabelsError(f'a label is a name or {{"name": ..., "description": ...}}, not {type(entry).__name__}')


def label_specs(entries: Iterable[object], open_labels: bool) -> tuple[LabelSpec, ...]:
    """The labels of a request, checked: for an open model at most :data:`MAX_OPEN_LABELS`, each
    name one line of at most :data:`MAX_NAME_CHARS` characters, no name twice (names compare as
    written); descriptions only for an open model. Raises :class:`InvalidLabelsError`."""
    specs = tuple(label_spec(entry) for entry in entries)
    if not specs:
        raise InvalidLabelsError("labels must not be empty (leave them out for the model's default labels)")
    if not open_labels:
        described = [s.name for s in specs if s.description]
        if described:
            raise InvalidLabelsError(f"label descriptions are for open-label models; this model answers its own labels only "
                                     f"(described: {', '.join(map(repr, described))})")
        return specs
    if len(specs) > MAX_OPEN_LABELS:
        raise InvalidLabelsError(f"{len(specs)} labels asked; at most {MAX_OPEN_LABELS} in one request")
    seen: set[str] = set()
    for number, spec in enumerate(specs, start=1):
        problem = _problem(spec.name, f"label {number}'s name", MAX_NAME_CHARS)
        if problem is None and spec.description is not None:
            problem = _problem(spec.description, f"label {spec.name!r}'s description", MAX_DESCRIPTION_CHARS)
        if problem is None and (spec.name in seen or spec.prompt in seen):
            problem = f"label {spec.name!r} is asked twice"
        if problem is not None:
            raise InvalidLabelsError(problem)
        seen |= {spec.name, spec.prompt}
    return specs


def unfamiliar_names(specs: Iterable[LabelSpec], trained_names: Collection[str]) -> list[str]:
    """The names among ``specs``, asked without a description, that an open model never trained on
    (``trained_names``, lower-cased, from its ``ner_model.json``; none listed: none unfamiliar).
    An open model finds a type it never read far less often than one it did (docs/open_labels.md):
    its callers are told, so that they may ask a name it knows where one fits. Names compare as a
    query writes them, lower-cased."""
    known = set(trained_names)
    return [s.name for s in specs if known and not s.description and s.prompt.lower() not in known]


def unfamiliar_note(model: str, names: Sequence[str]) -> str:
    """What a caller is told of :func:`unfamiliar_names`: which, why it matters, what to do."""
    return (f"{model} never trained on the label name(s) {', '.join(map(repr, names))}: it finds such types far less often; "
            f"where a name it trained on fits (padellm-ner models --trained-names {model}), ask that one; a description "
            f"({{\"name\": {json.dumps(names[0])}, \"description\": \"...\"}}) helps a little")


def warn_unfamiliar(model: str, names: Sequence[str], stacklevel: int = 2) -> None:
    """Warn a Python caller (:class:`UnfamiliarLabelsWarning`) of ``names`` from :func:`unfamiliar_names`, if any;
    ``stacklevel`` as :func:`warnings.warn` counts it from the caller of this function."""
    if names:
        warnings.warn(UnfamiliarLabelsWarning(unfamiliar_note(model, names)), stacklevel=stacklevel + 1)
