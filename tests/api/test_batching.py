"""Micro-batching (concurrent requests share one engine call), its switch, the queue limit, the
timeout, fairness between callers and cancellation.

No test here depends on how fast the machine is: where a behaviour depends on time, the test
holds the engine thread until it lets it go, sets the clock the batcher measures engine calls
with, or opens a gathering window far longer than the requests need to arrive (a window closes
as soon as the batch is full, so a long one costs nothing when the behaviour is right)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import SimpleNamespace

import httpx
import pytest
from fastapi import FastAPI

from ner_service.api.core import batching
from ner_service.api.core.admission import Admission, ServiceRate
from ner_service.api.core.batching import MicroBatcher
from ner_service.api.core.metrics import Metrics
from ner_service.api.core.work import pieces_of
from ner_service.api.state import ApiState
from ner_service.engine import ExtractOptions, Extraction
from tests.entity_lists import as_entities, assert_same_entities

TEXT = "EU rejects German call to boycott British lamb ."
#: A gathering window far longer than any test needs for its requests to arrive: the batch
#: closes when it holds ``ner_batch_max_texts`` texts, long before.
LONG_WINDOW_MS = 60_000


async def _ready(app: FastAPI) -> None:
    state: ApiState = app.state.api
    while not state.pool.is_loaded(state.pool.default):
        await asyncio.sleep(0.02)


async def _until(condition: Callable[[], bool]) -> None:
    """Return once ``condition()`` holds (checked every millisecond of the event loop)."""
    while not condition():
        await asyncio.sleep(0.001)


async def _concurrently(app: FastAPI, bodies: list[dict]) -> list[httpx.Response]:
    """Send ``bodies`` concurrently over a real HTTP client, inside the app's lifespan."""
    async with app.router.lifespan_context(app):
        await _ready(app)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=120) as client:
            return list(await asyncio.gather(*(client.post("/v1/entities", json=body) for body in bodies)))


def test_concurrent_requests_share_one_engine_call(app_factory: Callable[..., FastAPI]) -> None:
    app = app_factory(ner_batch_wait_ms=LONG_WINDOW_MS, ner_batch_max_texts=8)
    responses = asyncio.run(_concurrently(app, [{"text": f"{TEXT} {i}"} for i in range(8)]))
    assert [r.status_code for r in responses] == [200] * 8
    assert {r.json()["results"][0]["stats"]["batch_texts"] for r in responses} == {8}


async def _queued_in_order(app: FastAPI, ordered: list[dict], then: list[dict]) -> list[httpx.Response]:
    """Send ``ordered`` one by one, each once the one before is queued, then ``then`` concurrently."""
    async with app.router.lifespan_context(app):
        await _ready(app)
        batcher = app.state.api.batcher
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=120) as client:
            sent = []
            for count, body in enumerate(ordered, 1):
                sent.append(asyncio.ensure_future(client.post("/v1/entities", json=body)))
                await _until(lambda count=count: batcher.pending_texts == count)
            sent.extend(asyncio.ensure_future(client.post("/v1/entities", json=body)) for body in then)
            return list(await asyncio.gather(*sent))


def test_requests_with_different_options_are_not_mixed(app_factory: Callable[..., FastAPI], tiny_engine) -> None:
    app = app_factory(ner_batch_wait_ms=LONG_WINDOW_MS, ner_batch_max_texts=8)
    misc, ar = {"text": TEXT, "labels": ["MISC"]}, {"text": TEXT, "labels": ["LOC", "MISC"], "strategy": "ar"}
    # 8 texts queued close the window: the 4 MISC texts make one batch, the AR texts wait for 4 more of their own
    responses = asyncio.run(_queued_in_order(app, [misc] * 4 + [ar] * 4, [ar] * 4))
    for body, response, batch in zip([misc] * 4 + [ar] * 8, responses, [4] * 4 + [8] * 8):
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["labels"] == body["labels"] and answer["strategy"] == body.get("strategy", "padellm")
        assert answer["results"][0]["stats"]["batch_texts"] == batch
        expected = tiny_engine.extract([TEXT], labels=body["labels"], strategy=answer["strategy"])[0]
        assert_same_entities([as_entities(answer["results"][0]["entities"])], [expected.entities])


def test_without_microbatching_each_request_runs_alone(app_factory: Callable[..., FastAPI]) -> None:
    app = app_factory(ner_microbatch=False, ner_batch_wait_ms=LONG_WINDOW_MS)
    responses = asyncio.run(_concurrently(app, [{"text": TEXT}] * 4 + [{"texts": [TEXT, TEXT]}]))
    assert [r.json()["results"][0]["stats"]["batch_texts"] for r in responses] == [1, 1, 1, 1, 2]


@asynccontextmanager
async def _engine_held(app: FastAPI) -> AsyncIterator[None]:
    """The engine thread kept busy (work the queue does not see) until the block ends: whatever
    is admitted meanwhile stays pending, however fast or slow the machine."""
    release = threading.Event()
    busy = asyncio.ensure_future(app.state.api.batcher.in_engine_thread(release.wait))
    try:
        yield
    finally:
        release.set()
        await busy


async def _one_more_while_the_queue_is_full(app: FastAPI, full: dict, more: dict) -> tuple[httpx.Response, httpx.Response]:
    """Send ``full`` while the engine is held; once ``/metrics`` shows its texts queued, send ``more``."""
    async with app.router.lifespan_context(app):
        await _ready(app)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=120) as client:
            async with _engine_held(app):
                first = asyncio.create_task(client.post("/v1/entities", json=full))
                while f"padellm_queue_texts {float(len(full['texts']))}" not in (await client.get("/metrics")).text:
                    await asyncio.sleep(0.01)
                second = await client.post("/v1/entities", json=more)
            return await first, second


def test_a_full_queue_answers_429_with_retry_after(app_factory: Callable[..., FastAPI]) -> None:
    app = app_factory(ner_queue_max=2)
    first, second = asyncio.run(_one_more_while_the_queue_is_full(app, {"texts": [TEXT, TEXT]}, {"text": TEXT}))
    assert first.status_code == 200
    assert second.status_code == 429 and second.headers["Retry-After"] == "1" and "NER_QUEUE_MAX" in second.json()["detail"]


async def _behind_a_held_engine(app: FastAPI, body: dict) -> httpx.Response:
    """Send ``body`` while the engine thread is held; it is let go once the answer is back."""
    async with app.router.lifespan_context(app):
        await _ready(app)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=120) as client:
            async with _engine_held(app):
                return await client.post("/v1/entities", json=body)


def test_a_request_past_its_timeout_is_503_with_retry_after_and_its_work_is_released(app_factory: Callable[..., FastAPI]) -> None:
    app = app_factory(ner_request_timeout_s=0.5, ner_fixed_ms_per_token=1.0)  # admitted: 0.4 s fits its 42 tokens
    response = asyncio.run(_behind_a_held_engine(app, {"texts": [TEXT, TEXT]}))
    assert response.status_code == 503 and "NER_REQUEST_TIMEOUT_S" in response.json()["detail"]
    assert int(response.headers["Retry-After"]) >= 1
    state = app.state.api
    assert (state.batcher.pending_texts, state.batcher.pending_tokens) == (0, 0)


KEY = ExtractOptions("m", None, "padellm", "greedy")


class _Engine:
    """Stands in for the engine where what is under test is the batcher: it records the texts of
    every call; while ``held`` is cleared, a batch waits for it in ``prepare`` (as a batch waits
    for a model to load, or for the engine thread's other work)."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.waiting = 0  # batches that wait in prepare
        self.held = threading.Event()
        self.held.set()

    def prepare(self, key: ExtractOptions) -> None:
        self.waiting += 1
        self.held.wait()
        self.waiting -= 1

    def __call__(self, key: ExtractOptions, texts: list[str]) -> list[Extraction]:
        self.calls.append(list(texts))
        return [Extraction(text, []) for text in texts]


def _batcher(run: Callable[[ExtractOptions, list[str]], list[Extraction]], rate: ServiceRate | None = None,
             **options: object) -> MicroBatcher:
    """A batcher on ``run``; admission at a fixed rate of 1 ms a token unless ``rate`` is given."""
    admission = Admission(rate or ServiceRate.fixed(1.0), budget_s=60, max_request_tokens=100_000, queue_max_texts=64)
    prepare = run.prepare if isinstance(run, _Engine) else (lambda key: None)
    fields: dict = {"enabled": True, "wait_ms": 1, "max_texts": 8, "prepare": prepare} | options
    return MicroBatcher(run, Metrics(), admission, **fields)


def test_a_short_request_waits_behind_at_most_one_more_piece_of_another_callers_long_text() -> None:
    engine = _Engine()
    long_text = " ".join(f"Peter Blackburn met officials in Brussels on day {i} ." for i in range(40))
    pieces = [piece.text for piece in pieces_of([long_text], 64, 160)]
    assert len(pieces) >= 8

    async def scenario() -> None:
        batcher = _batcher(engine)
        batcher.start()
        engine.held.clear()
        long = asyncio.ensure_future(batcher.submit(KEY, [long_text], caller="alpha"))
        await _until(lambda: engine.waiting == 1)  # its first batch has the engine
        short = asyncio.ensure_future(batcher.submit(KEY, [TEXT], caller="beta"))
        await _until(lambda: batcher.pending_texts == 2)
        engine.held.set()
        answers = await asyncio.gather(long, short)
        assert [answer[0].text for answer in answers] == [long_text, TEXT]
        await batcher.stop()

    asyncio.run(scenario())
    assert engine.calls[0] == pieces[:1]
    assert engine.calls.index([TEXT]) <= 2, engine.calls  # not after the long text's other pieces
    assert [text for call in engine.calls for text in call if text != TEXT] == pieces


def test_cancelled_work_never_reaches_the_engine_even_from_a_batch_that_waits_for_it() -> None:
    engine = _Engine()

    async def scenario() -> None:
        batcher = _batcher(engine)
        batcher.start()
        engine.held.clear()
        taken = asyncio.ensure_future(batcher.submit(KEY, ["taken into a batch"], caller="alpha"))
        await _until(lambda: engine.waiting == 1)  # its batch waits for the engine
        queued = asyncio.ensure_future(batcher.submit(KEY, ["still queued"], caller="beta"))
        await _until(lambda: batcher.pending_texts == 2)
        taken.cancel()  # a timeout, or a client gone
        queued.cancel()
        await asyncio.gather(taken, queued, return_exceptions=True)
        assert (batcher.pending_texts, batcher.pending_tokens) == (0, 0)
        engine.held.set()
        assert [answer.text for answer in await batcher.submit(KEY, ["kept"])] == ["kept"]  # after whatever came before it
        await batcher.stop()

    asyncio.run(scenario())
    assert engine.calls == [["kept"]]


def test_the_rate_learns_from_engine_calls_not_from_loading_a_model(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(batching, "time", SimpleNamespace(perf_counter=lambda: clock.now))  # the batcher's clock: set here

    def load(key: ExtractOptions) -> None:
        clock.now += 100.0  # a model loaded on first use

    def run(key: ExtractOptions, texts: list[str]) -> list[Extraction]:
        clock.now += 2.0
        return [Extraction(text, []) for text in texts]

    async def scenario() -> MicroBatcher:
        batcher = _batcher(run, ServiceRate(prior_ms_per_token=1.0), prepare=load, wait_fraction=0.5, wait_max_ms=60_000)
        batcher.start()
        await batcher.submit(KEY, ["x" * 40])  # 10 estimated tokens and one window's prefix, 4
        await batcher.stop()
        return batcher

    batcher = asyncio.run(scenario())
    assert batcher.admission.rate.seconds_per_token == pytest.approx(2.0 / 14)
    assert batcher.gather_window_s() == pytest.approx(1.0)  # half of the 2 s engine call


def _batches_of_spread_requests(wait_fraction: float) -> list[int]:
    """Batch sizes when one request's engine call takes 60 s by the batcher's clock (set here) and
    three more then arrive 0.5 s apart.

    The runner stands in for the engine: what is under test is when the batcher closes a batch.
    A window of 10 ms closes long before the next arrival; a window stretched to half the last
    engine call (30 s) holds all three, and closes when it holds ``max_texts`` (3), not later."""
    batches: list[int] = []
    clock = SimpleNamespace(now=0.0)

    def run(key: ExtractOptions, texts: list[str]) -> list[Extraction]:
        batches.append(len(texts))
        clock.now += 60.0 if len(batches) == 1 else 0.001
        return [Extraction(text, []) for text in texts]

    async def scenario() -> None:
        batcher = _batcher(run, wait_ms=10, wait_fraction=wait_fraction, wait_max_ms=60_000, max_texts=3)
        batcher.start()
        await batcher.submit(KEY, ["first"])

        async def later(delay: float, text: str) -> list[Extraction]:
            await asyncio.sleep(delay)
            return await batcher.submit(KEY, [text])

        answers = await asyncio.gather(*(later(0.5 * i, str(i)) for i in range(3)))
        assert [a[0].text for a in answers] == ["0", "1", "2"]
        await batcher.stop()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(batching, "time", SimpleNamespace(perf_counter=lambda: clock.now))
        asyncio.run(scenario())
    return batches


def test_the_gathering_window_stretches_to_a_fraction_of_the_last_engine_call() -> None:
    assert _batches_of_spread_requests(wait_fraction=0.0) == [1, 1, 1, 1]  # 10 ms: each arrival alone
    assert _batches_of_spread_requests(wait_fraction=0.5) == [1, 3]  # 30 s after a 60 s call: one batch
