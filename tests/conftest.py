"""Shared fixtures: the data folder, the tiny model and the shipped English model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Before any test module imports the settings or the Celery app (the API imports the pipeline
# router, which builds the Celery app from REDIS_URL): the pipeline tests' Redis db and model.
#: The tiny model the fast tests use: not shipped, chosen by name from tests/models (for the
#: processes the tests start too).
TINY_DIR = Path(__file__).resolve().parent / "models" / "tiny-conll03"
os.environ["PADELLM_NER_MODEL_PATH"] = str(TINY_DIR.parent)
os.environ["NER_MODEL"] = "tiny-conll03"
#: ``make test`` runs the suite in two pytest-xdist workers ("gw0", "gw1"), a test file to each: each
#: worker has its own Redis db and one torch thread (inherited by the processes its tests start), so
#: that two processes keep two cores busy where one process's second thread would often wait.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER:
    os.environ.setdefault("NER_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
_WORKER_DB = 13 + (int(_WORKER.removeprefix("gw")) if _WORKER.startswith("gw") else 0)
os.environ["REDIS_URL"] = os.environ.get("PADELLM_TEST_REDIS_URL", f"redis://127.0.0.1:6379/{_WORKER_DB}")  # another db for a second checkout
os.environ["PIPELINE_CHUNK_SIZE"] = "4"
# The entry points load models in NER_DTYPE, by default auto (bfloat16 on a CPU with bfloat16
# instructions); the tests compare them with engines loaded in float32, so they run in float32
# (tests/test_cpu_inference.py runs the auto path itself).
os.environ.setdefault("NER_DTYPE", "float32")
# Models the tests load keep no merged weights in the cache (a GB each in float32, for models
# trained into temporary folders too); tests/test_gemma3_model.py turns it on where it tests it.
os.environ.setdefault("PADELLM_MERGED_CACHE", "0")

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
def diffusion_en_engine():
    return _shipped_engine("en-conll03-diffusion")


@pytest.fixture(scope="session")
def open_model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped English model's weights under an ``ner_model.json`` that declares it open (any
    labels at call time): real answers, and it knows CoNLL-03's label names, so that a right
    answer under a name asked at call time can be checked."""
    from ner_service.engine import NERModelConfig

    source = REPO / "ner_service" / "shipped_models" / "en-conll03"
    if not (source / "ner_model.json").is_file():
        pytest.skip("the shipped en-conll03 model is not in this checkout")
    folder = tmp_path_factory.mktemp("open-model")
    for path in source.iterdir():
        if path.name != "ner_model.json":
            (folder / path.name).symlink_to(path)
    config = NERModelConfig.read(source)
    config.open_labels, config.count_bias, config.name = True, 0.0, "open-test"
    config.trained_names = ["loc", "location", "misc", "org", "per", "person"]  # what its callers are told they may ask bare
    config.write(folder)
    return folder


@pytest.fixture(scope="session")
def open_engine(open_model_folder: Path):
    from ner_service.engine import NEREngine

    return NEREngine.load(open_model_folder)
