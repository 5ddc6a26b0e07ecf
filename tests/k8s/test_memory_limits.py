"""The memory limits of the containers that load models fit the service's defaults: each process
may hold ``NER_MODEL_MEMORY_MB`` of weights (the pool unloads beyond it) and the runtime beside
(tests/api/test_model_memory.py measures the API process with every served model loaded in turn)."""

from __future__ import annotations

import pytest

from ner_service.settings import Settings
from tests.k8s.test_manifests import OVERLAYS, command, container, kustomize, quantity, rendered  # noqa: F401 (fixture)

#: Resident memory of a serving process beside its model weights: Python, torch, the app, a batch's activations.
RUNTIME_BYTES = 1 * 2**30


def _processes(c: dict) -> int:
    """The processes of a container that load models: a Celery worker's ``--concurrency``, else one."""
    words = command(c)
    concurrency = [w.split("=", 1)[1] for w in words if w.startswith("--concurrency=")]
    return int(concurrency[0]) if concurrency else 1


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("workload", ["api", "worker"])
def test_model_loading_containers_hold_the_budget_and_the_runtime(rendered, overlay: str, workload: str) -> None:  # noqa: F811
    c = container(rendered[overlay], workload)
    budget = Settings().ner_model_memory_mb * 2**20
    limit = quantity(c["resources"]["limits"]["memory"])
    needed = _processes(c) * (budget + RUNTIME_BYTES)
    assert limit >= needed, f"{overlay} {workload}: limit {limit / 2**30:.1f} Gi, needs {needed / 2**30:.1f} Gi"
