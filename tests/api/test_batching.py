"""Micro-batching (concurrent requests share one engine call), its switch, the queue limit and the timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
from fastapi import FastAPI

from ner_service.api.core.admission import Admission, ServiceRate
from ner_service.api.core.batching import MicroBatcher
from ner_service.api.core.metrics import Metrics
from ner_service.api.state import ApiState
from ner_service.engine import ExtractOptions, Extraction

TEXT = "EU rejects German call to boycott British lamb ."


async def _ready(app: FastAPI) -> None:
    state: ApiState = app.state.api
    while not state.pool.is_loaded(state.pool.default):
        await asyncio.sleep(0.02)


async def _concurrently(app: FastAPI, bodies: list[dict]) -> list[httpx.Response]:
    """Send ``bodies`` concurrently over a real HTTP client, inside the app's lifespan."""
    async with app.router.lifespan_context(app):
        await _ready(app)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=120) as client:
            return list(await asyncio.gather(*(client.post("/v1/entities", json=body) for body in bodies)))


def test_concurrent_requests_share_one_engine_call(app_factory: Callable[..., FastAPI]) -> None:
    app = app_factory(ner_batch_wait_ms=2000, ner_batch_max_texts=8)
    responses = asyncio.run(_concurrently(app, [{"text": f"{TEXT} {i}"} for i in range(8)]))
    assert [r.status_code for r in responses] == [200] * 8
    assert {r.json()["results"][0]["stats"]["batch_texts"] for r in responses} == {8}


def test_requests_with_different_options_are_not_mixed(app_factory: Callable[..., FastAPI], tiny_engine) -> None:
    app = app_factory(ner_batch_wait_ms=2000, ner_batch_max_texts=8)
    bodies = [{"text": TEXT, "labels": ["PER"]}] * 4 + [{"text": TEXT, "labels": ["LOC"], "strategy": "ar"}] * 4
    responses = asyncio.run(_concurrently(app, bodies))
    for body, response in zip(bodies, responses):
        answer = response.json()
        assert answer["labels"] == body["labels"] and answer["strategy"] == body.get("strategy", "padellm")
        assert answer["results"][0]["stats"]["batch_texts"] == 4
        expected = tiny_engine.extract([TEXT], labels=body["labels"], strategy=answer["strategy"])[0]
        assert answer["results"][0]["entities"] == [e.to_dict() for e in expected.entities]


def test_without_microbatching_each_request_runs_alone(app_factory: Callable[..., FastAPI]) -> None:
    app = app_factory(ner_microbatch=False, ner_batch_wait_ms=2000)
    responses = asyncio.run(_concurrently(app, [{"text": TEXT}] * 4 + [{"texts": [TEXT, TEXT]}]))
    assert [r.json()["results"][0]["stats"]["batch_texts"] for r in responses] == [1, 1, 1, 1, 2]


async def _one_more_after_the_queue_fills(app: FastAPI, full: dict, more: dict) -> tuple[httpx.Response, httpx.Response]:
    """Send ``full``; once ``/metrics`` shows its texts queued, send ``more``."""
    async with app.router.lifespan_context(app):
        await _ready(app)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=120) as client:
            first = asyncio.create_task(client.post("/v1/entities", json=full))
            while f"padellm_queue_texts {float(len(full['texts']))}" not in (await client.get("/metrics")).text:
                await asyncio.sleep(0.01)
            second = await client.post("/v1/entities", json=more)
            return await first, second


def test_a_full_queue_answers_429_with_retry_after(app_factory: Callable[..., FastAPI]) -> None:
    app = app_factory(ner_queue_max=2, ner_batch_wait_ms=1000)
    first, second = asyncio.run(_one_more_after_the_queue_fills(app, {"texts": [TEXT, TEXT]}, {"text": TEXT}))
    assert first.status_code == 200
    assert second.status_code == 429 and second.headers["Retry-After"] == "1" and "NER_QUEUE_MAX" in second.json()["detail"]


async def _behind_a_busy_engine(app: FastAPI, busy_s: float, body: dict) -> httpx.Response:
    """Send ``body`` while the engine thread is busy for ``busy_s`` (work the queue does not see)."""
    async with app.router.lifespan_context(app):
        await _ready(app)
        busy = asyncio.ensure_future(app.state.api.batcher.in_engine_thread(time.sleep, busy_s))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=120) as client:
            response = await client.post("/v1/entities", json=body)
        await busy
        return response


def test_a_request_past_its_timeout_is_504_and_its_work_is_cancelled(app_factory: Callable[..., FastAPI]) -> None:
    app = app_factory(ner_request_timeout_s=0.5)
    response = asyncio.run(_behind_a_busy_engine(app, 1.5, {"texts": [TEXT, TEXT]}))
    assert response.status_code == 504 and "NER_REQUEST_TIMEOUT_S" in response.json()["detail"]
    state = app.state.api
    assert (state.batcher.pending_texts, state.batcher.pending_tokens) == (0, 0)
    assert "padellm_engine_batch_texts_count 0.0" in state.metrics.render().decode()  # its texts never reached the engine


def _batches_of_spread_requests(wait_fraction: float) -> list[int]:
    """Batch sizes when one request runs alone for 1 s and three more then arrive 100 ms apart.

    The runner stands in for the engine: what is under test is when the batcher closes a batch."""
    batches: list[int] = []

    def run(key: ExtractOptions, texts: list[str]) -> list[Extraction]:
        batches.append(len(texts))
        time.sleep(1.0 if len(batches) == 1 else 0.0)
        return [Extraction(text, []) for text in texts]

    async def scenario() -> None:
        admission = Admission(ServiceRate(prior_ms_per_token=1.0), budget_s=60, max_request_tokens=1000, queue_max_texts=64)
        batcher = MicroBatcher(run, Metrics(), admission, enabled=True, wait_ms=10, wait_fraction=wait_fraction, wait_max_ms=1000,
                               max_texts=8)
        batcher.start()
        key = ExtractOptions("m", None, "padellm", "greedy")
        await batcher.submit(key, ["first"])

        async def later(delay: float, text: str) -> list[Extraction]:
            await asyncio.sleep(delay)
            return await batcher.submit(key, [text])

        answers = await asyncio.gather(*(later(0.1 * i, str(i)) for i in range(3)))
        assert [a[0].text for a in answers] == ["0", "1", "2"]
        await batcher.stop()

    asyncio.run(scenario())
    return batches


def test_the_gathering_window_stretches_to_a_fraction_of_the_last_engine_call() -> None:
    assert _batches_of_spread_requests(wait_fraction=0.0) == [1, 1, 1, 1]  # 10 ms: each arrival alone
    assert _batches_of_spread_requests(wait_fraction=0.5) == [1, 3]  # 0.5 s after a 1 s call: one batch
