"""The micro-batcher: concurrent requests gathered for a few milliseconds and run as one ``engine.extract`` call.

Requests are grouped by identical :class:`ExtractOptions` (model, labels, strategy, decoder). All engine work,
model loading included, runs in ONE dedicated worker thread (the engine is not thread-safe), off the event loop.

The gathering window opens with the first queued request and closes when the batch is full or
after ``wait_ms``, stretched to ``wait_fraction`` of the previous engine call (at most
``wait_max_ms``): when a batch takes seconds, its clients' next requests may take longer than
``wait_ms`` to come back (a loaded machine), and a batch cut short costs more per text than
the wait. A full batch never waits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ner_service.api.core.metrics import Metrics
from ner_service.engine import ExtractOptions, Extraction

logger = logging.getLogger(__name__)
T = TypeVar("T")


class QueueFullError(RuntimeError):
    """The queue holds its maximum number of texts; the caller should retry later."""

    retry_after_s = 1


@dataclass
class _Job:
    key: ExtractOptions
    texts: list[str]
    future: asyncio.Future[list[Extraction]] = field(repr=False)


Runner = Callable[[ExtractOptions, list[str]], list[Extraction]]


class MicroBatcher:
    """Queue requests and feed them to ``run`` in the engine thread, batched when ``enabled``."""

    def __init__(self, run: Runner, metrics: Metrics, *, enabled: bool, wait_ms: float, max_texts: int, queue_max: int,
                 wait_fraction: float = 0.0, wait_max_ms: float = 0.0) -> None:
        self._run = run
        self._metrics = metrics
        self.enabled = enabled
        self._wait_s = wait_ms / 1000
        self._wait_fraction = wait_fraction
        self._wait_max_s = max(wait_max_ms, wait_ms) / 1000
        self._last_run_s = 0.0
        self._max_texts = max_texts
        self._queue_max = queue_max
        self._pending_texts = 0
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ner-engine")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start gathering (inside the running event loop)."""
        self._task = asyncio.create_task(self._gather_forever(), name="micro-batcher")

    async def stop(self) -> None:
        """Stop gathering and wait for the engine thread to finish its current call."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def in_engine_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the engine thread (e.g. loading a model), after the work queued there."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def submit(self, key: ExtractOptions, texts: list[str]) -> list[Extraction]:
        """The extractions of ``texts``; raises :class:`QueueFullError` when the queue is full."""
        if self._pending_texts >= self._queue_max:
            raise QueueFullError(f"the queue holds {self._pending_texts} texts (NER_QUEUE_MAX={self._queue_max}); retry later")
        job = _Job(key, texts, asyncio.get_running_loop().create_future())
        self._pending_texts += len(texts)
        self._metrics.queue_texts.set(self._pending_texts)
        self._queue.put_nowait(job)
        return await job.future

    async def _gather_forever(self) -> None:
        while True:
            jobs = [await self._queue.get()]
            if self.enabled:
                await self._gather_more(jobs)
            groups: dict[ExtractOptions, list[_Job]] = {}
            for job in jobs:
                groups.setdefault(job.key, []).append(job)
            for key, group in groups.items():
                await self._process(key, group)

    def gather_window_s(self) -> float:
        """How long the next batch may wait for more requests (module docstring)."""
        return min(max(self._wait_s, self._wait_fraction * self._last_run_s), self._wait_max_s)

    async def _gather_more(self, jobs: list[_Job]) -> None:
        """Add queued jobs to ``jobs`` for up to the gathering window, or until the first key has ``max_texts`` texts."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.gather_window_s()
        first = jobs[0].key
        texts = len(jobs[0].texts)
        while texts < self._max_texts:
            if self._queue.empty():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return
                try:
                    job = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    return
            else:
                job = self._queue.get_nowait()
            jobs.append(job)
            if job.key == first:
                texts += len(job.texts)

    async def _process(self, key: ExtractOptions, group: list[_Job]) -> None:
        live = [job for job in group if not job.future.done()]  # a timed-out request is dropped
        texts = [text for job in live for text in job.texts]
        try:
            if live:
                began = time.perf_counter()
                results = await self.in_engine_thread(self._run, key, texts)
                self._last_run_s = time.perf_counter() - began
                self._metrics.observe_batch(len(texts), results)
                at = 0
                for job in live:
                    if not job.future.done():
                        job.future.set_result(results[at:at + len(job.texts)])
                    at += len(job.texts)
        except Exception as error:  # delivered to the waiting requests, which map it to a response
            for job in live:
                if not job.future.done():
                    job.future.set_exception(error)
        finally:
            self._pending_texts -= sum(len(job.texts) for job in group)
            self._metrics.queue_texts.set(self._pending_texts)
