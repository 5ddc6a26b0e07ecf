"""The real server (uvicorn, SQLite) when tenants push it across models: only the served models
(``NER_MODELS``) may be named, every served model loaded one after another stays within the
memory budget and the Kubernetes limit, and a model loading never stalls requests on a loaded one."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from ner_service.engine.ner_model import CURRENT_MODELS, shipped_model_names
from ner_service.settings import Settings
from tests.local_services import LiveServer, live_server_process

REPO = Path(__file__).resolve().parents[2]
ALPHA, BETA = {"X-API-Key": "alpha-key"}, {"X-API-Key": "beta-key"}
SENTENCE = {"en": "EU rejects German call to boycott British lamb .", "zh": "张三，男，1980年出生，北京大学毕业，现任华为公司工程师。"}
SENTENCE["multi"] = SENTENCE["en"]  # the open model: any language it was trained on


def _env(folder: Path, redis_url: str, **overrides: str) -> dict[str, str]:
    return {"NER_MODEL": "tiny-conll03", "NER_API_KEYS": "alpha-key,beta-key", "NER_RATE_LIMIT_PER_MINUTE": "100000",
            "DATABASE_URL": f"sqlite:///{folder / 'pipeline.db'}", "REDIS_URL": redis_url, **overrides}


def _rss_bytes(pid: int) -> int:
    """The resident memory of process ``pid`` (VmRSS)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024


def _weights_bytes(http: httpx.Client) -> float:
    """The ``padellm_model_weights_bytes`` gauge of ``/metrics``."""
    return float(re.search(r"^padellm_model_weights_bytes (\S+)$", http.get("/metrics").text, re.M).group(1))


def _api_memory_limit_bytes() -> int:
    """The memory limit of the API container in ``k8s/base/api.yaml``."""
    deployment = next(doc for doc in yaml.safe_load_all((REPO / "k8s/base/api.yaml").read_text()) if doc and doc["kind"] == "Deployment")
    (api,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "api"]
    limit = api["resources"]["limits"]["memory"]
    units = {"Mi": 2**20, "Gi": 2**30}
    return int(float(limit[:-2]) * units[limit[-2:]])


@pytest.fixture
def server(tmp_path: Path, redis_url: str) -> Iterator[Callable[..., tuple[LiveServer, Path]]]:
    """Start a server with settings ``overrides``: the server and its log; each is stopped after the test."""
    managers: list = []

    def start(**overrides: str) -> tuple[LiveServer, Path]:
        log = tmp_path / f"serve-{len(managers)}.log"
        manager = live_server_process(_env(tmp_path, redis_url, **overrides), log)
        managers.append(manager)
        return manager.__enter__(), log

    yield start
    for manager in reversed(managers):
        manager.__exit__(None, None, None)


def test_only_the_served_models_may_be_named(server) -> None:
    live, _ = server(NER_MODELS="tiny-conll03")
    with httpx.Client(base_url=live.url, headers=ALPHA, timeout=60) as http:
        assert [m["name"] for m in http.get("/v1/models").json()["models"]] == ["tiny-conll03"]
        refused = http.post("/v1/entities", json={"text": SENTENCE["en"], "model": "en-conll03"})
        assert refused.status_code == 422 and "serves: tiny-conll03" in refused.json()["detail"], refused.text
        refused = http.post("/v1/entities", json={"text": SENTENCE["zh"], "language": "zh"})  # zh-resume is not served here
        assert refused.status_code == 422, refused.text


def test_the_current_models_are_served_by_default() -> None:
    assert Settings().served_models() is None
    from ner_service.engine import EnginePool

    pool = EnginePool("tiny-conll03")
    assert pool.names() == sorted({"tiny-conll03", *(m for m in CURRENT_MODELS if m in shipped_model_names())})


def test_every_served_model_loaded_in_turn_stays_within_the_budget_and_the_container_limit(server) -> None:
    missing = [name for name in CURRENT_MODELS if name not in shipped_model_names()]
    if missing:
        pytest.skip(f"shipped models missing from this checkout: {missing}")
    budget = Settings().ner_model_memory_mb * 2**20
    limit = _api_memory_limit_bytes()
    live, _ = server(NER_MODEL="en-conll03", NER_MODELS="", NER_MODEL_MEMORY_MB=str(Settings().ner_model_memory_mb),
                     NER_REQUEST_TIMEOUT_S="900")  # loads on a CPU shared with other work take what they take
    with httpx.Client(base_url=live.url, headers=ALPHA, timeout=600) as http:
        served = http.get("/v1/models").json()["models"]
        assert {m["name"] for m in served} == set(CURRENT_MODELS)
        def ask(model: dict) -> None:
            body = {"text": SENTENCE[model["language"]], "model": model["name"]}
            if model["name"] == "en-conll03-diffusion":
                body["strategy"] = "fast_dllm"
            answer = http.post("/v1/entities", json=body)
            assert answer.status_code == 200, answer.text
            weights, rss = _weights_bytes(http), _rss_bytes(live.process.pid)
            assert weights <= budget, f"{model['name']}: {weights / 2**20:.0f} MB of weights, budget {budget / 2**20:.0f} MB"
            assert rss <= limit, f"{model['name']}: the process holds {rss / 2**20:.0f} MB, the container may {limit / 2**20:.0f} MB"

        for model in served:
            ask(model)
        unloaded = [m for m in http.get("/v1/models").json()["models"] if not m["loaded"]]
        assert unloaded and "en-conll03" not in {m["name"] for m in unloaded}  # the default stays; the least recently used went
        for model in unloaded:  # the models unloaded come back, within the budget again
            ask(model)


def test_a_model_loading_does_not_stall_requests_on_a_loaded_model(server) -> None:
    if "zh-weibo" not in shipped_model_names():
        pytest.skip("the shipped zh-weibo model is not in this checkout")
    live, log = server(NER_MODELS="tiny-conll03,zh-weibo", NER_MODEL_MEMORY_MB="100000")
    answers: dict[str, httpx.Response] = {}

    def first_request_on_weibo() -> None:  # key A's first request: zh-weibo loads
        with httpx.Client(base_url=live.url, headers=ALPHA, timeout=600) as http:
            answers["alpha"] = http.post("/v1/entities", json={"text": SENTENCE["zh"], "model": "zh-weibo"})

    alpha = threading.Thread(target=first_request_on_weibo)
    alpha.start()
    deadline = time.monotonic() + 120
    while "loading model zh-weibo" not in log.read_text():
        assert time.monotonic() < deadline and alpha.is_alive(), "zh-weibo never started loading"
        time.sleep(0.05)
    with httpx.Client(base_url=live.url, headers=BETA, timeout=600) as http:  # key B, on the loaded default model
        answer = http.post("/v1/entities", json={"text": SENTENCE["en"]})
        weibo = next(m for m in http.get("/v1/models").json()["models"] if m["name"] == "zh-weibo")
    assert answer.status_code == 200, answer.text
    assert not weibo["loaded"] and "alpha" not in answers, "key B's sentence waited for key A's model to load"
    alpha.join()
    assert answers["alpha"].status_code == 200 and answers["alpha"].json()["model"] == "zh-weibo", answers["alpha"].text
