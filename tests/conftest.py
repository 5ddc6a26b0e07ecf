"""Shared fixtures: the data folder, the tiny model and the shipped English model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Before any test module imports the settings or the Celery app (the API imports the pipeline
# router, which builds the Celery app from REDIS_URL): the pipeline tests' Redis db and model.
os.environ["NER_MODEL"] = "tiny-conll03"
os.environ["REDIS_URL"] = os.environ.get("PADELLM_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")  # another db for a second checkout
os.environ["PIPELINE_CHUNK_SIZE"] = "4"

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("PADELLM_DATA", REPO.parent / "shared" / "data"))
SHIPPED_EN = REPO / "ner_service" / "shipped_models" / "en-conll03" / "ner_model.json"
SHIPPED_DIFFUSION = REPO / "ner_service" / "shipped_models" / "en-conll03-diffusion" / "ner_model.json"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA / "conll2003" / "train.txt").is_file():
        pytest.skip(f"corpora not found in {DATA} (set PADELLM_DATA)")
    return DATA


@pytest.fixture(scope="session")
def tiny_engine():
    from ner_service.engine import NEREngine

    return NEREngine.load("tiny-conll03")


def _shipped_engine(name: str):
    """The engine of shipped model ``name``, or a skip where this checkout lacks it."""
    if not (REPO / "ner_service" / "shipped_models" / name / "ner_model.json").is_file():
        pytest.skip(f"the shipped {name} model is not in this checkout")
    from ner_service.engine import NEREngine

    return NEREngine.load(name)


@pytest.fixture(scope="session")
def en_engine():
    return _shipped_engine("en-conll03")


@pytest.fixture(scope="session")
def smollm2_en_engine():
    """The English model on SmolLM2-135M (``en-conll03`` until 2026-11-30): the tests of behaviours
    seen on its answers (a name it labels two ways in a document, a neighbour it answers twice)."""
    return _shipped_engine("en-conll03-smollm2")


@pytest.fixture(scope="session")
def diffusion_en_engine():
    return _shipped_engine("en-conll03-diffusion")
