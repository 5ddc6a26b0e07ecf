"""A command that loads a model, answers and exits (``extract``, ``evaluate``, the calibrations),
started from a shell: what its start and its end cost beside the work.

* While it imports torch and transformers and loads the model, Python's cyclic garbage collector
  would walk the hundreds of thousands of objects made so far again and again, and none of them
  is garbage: it is off until the model has loaded (:func:`begin`), then what exists is frozen out
  of later collections and collecting resumes (:func:`loaded`), so a long run over stdin frees
  its cycles as any process does.
* At its end, finalising every module and freeing the model's tensors one by one is work for a
  process about to vanish: once its output is flushed it leaves at once (:func:`finish`).

Only :func:`padellm_ner.cli.main` called as the ``padellm-ner`` program does this; a call from
Python (tests, notebooks) keeps its process as it was.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from typing import NoReturn

_begun = False


def begin() -> None:
    """Collect no cyclic garbage until :func:`loaded`."""
    global _begun
    _begun = True
    gc.disable()


def loaded() -> None:
    """The model is loaded: keep what exists out of later collections and collect again (nothing
    where :func:`begin` was not called)."""
    global _begun
    if _begun:
        _begun = False
        gc.freeze()
        gc.enable()


def finish(code: int) -> NoReturn:
    """Flush the output and the logs, then end the process with ``code`` without tearing it down."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (``| head``): nothing more can reach it
            pass
    logging.shutdown()
    os._exit(code)
