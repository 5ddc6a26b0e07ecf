"""padellm-ner: named-entity recognition by parallel decoding of language models.

In Python::

    import padellm_ner
    ner = padellm_ner.load("en-conll03")
    ner.predict_entities("Angela Merkel visited Paris .", labels=["PER", "LOC"], threshold=0.5)

The package also assembles the service: the command line (:mod:`padellm_ner.cli`) and the ASGI
app (:mod:`padellm_ner.asgi`) that mount the engine's API and the batch pipeline's routes; it is
the only package that imports both ``ner_service`` and ``pipeline``. ``load`` is imported on
first use, so that the command line starts without torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_THRESHOLD", "PadeLLMNER", "load"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from padellm_ner import ner

        return getattr(ner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
