"""The micro-batcher: concurrent requests gathered for a few milliseconds and run as one ``engine.extract`` call.

Every request is admitted first (:mod:`.admission`: its work, its texts' tokens and its labels'
queries in each window the model reads (:mod:`.work`), and the work queued before it must fit
the request timeout at the measured rate), then cut into pieces (:mod:`.work`: a text
longer than ``long_text_tokens`` is cut at sentence ends into pieces of ``piece_tokens``). Pieces wait in one queue per caller (API
key), and each batch starts with the next caller in turn, so that no key's burst holds back
another's requests. A batch is either whole texts of any callers (up to ``max_texts`` with the
same :class:`ExtractOptions`) or pieces of long texts (up to ``split_tokens``): a short request
never waits behind more than one small batch of someone's long text. A request that times out
or whose client is gone is cancelled, and its pieces still queued (or in a batch still waiting
for the engine thread) never reach the engine.

All engine work runs in ONE dedicated worker thread (the engine is not thread-safe), off the
event loop; a model that is not loaded loads in a loader thread of its own, and its requests'
pieces wait in their queues meanwhile while the batches of loaded models go on, so that no key's
first request on another model stalls the others. Each engine call's time is what admission's
measured rate learns from; a request refused while nothing is
queued has the engine measured on a small text, so that the rate is never stale on an idle
engine. The gathering window opens with the first queued piece and closes when ``max_texts``
are queued or after ``wait_ms``, stretched to ``wait_fraction`` of the previous engine call
(at most ``wait_max_ms``): when a batch takes seconds, its clients' next requests may take
longer than ``wait_ms`` to come back, and a batch cut short costs more per text than the wait.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from ner_service.api.core.admission import Admission, Overloaded
from ner_service.api.core.metrics import Metrics
from ner_service.api.core.work import Piece, Reading, merged, pieces_of, query_tokens
from ner_service.engine import ExtractOptions, Extraction
from ner_service.engine.spans import Entity, distinct_spans, resolve_overlaps

logger = logging.getLogger(__name__)
T = TypeVar("T")
Runner = Callable[[ExtractOptions, list[str]], list[Extraction]]
#: A text's entities from those of its pieces (``NEREngine.text_entities`` of the options' model).
TextEntities = Callable[[ExtractOptions, str, list[Entity]], list[Entity]]
#: The queue of the calls that measure the engine when nothing else would (:meth:`MicroBatcher._calibrate`).
CALIBRATION_CALLER = "(calibration)"


@dataclass(eq=False)
class _Request:
    """An admitted request: its pieces, the answers received so far, and its future."""

    options: ExtractOptions
    texts: list[str]
    pieces: list[Piece]
    future: asyncio.Future[list[Extraction]] = field(repr=False)
    answers: dict[int, Extraction] = field(default_factory=dict)  # by piece index
    calibration: bool = False  # measures the idle engine: its call alone is the rate

    @property
    def tokens(self) -> int:
        return sum(piece.units for piece in self.pieces)

    def answer(self, text_entities: TextEntities) -> list[Extraction]:
        """Every text's extraction, from its pieces' answers."""
        parts: dict[int, list[tuple[Piece, Extraction]]] = {}
        for index, piece in enumerate(self.pieces):
            parts.setdefault(piece.text_index, []).append((piece, self.answers[index]))
        return [merged(text, parts[index], partial(text_entities, self.options)) for index, text in enumerate(self.texts)]


@dataclass(frozen=True, eq=False)
class _Queued:
    """A piece waiting for the engine: piece ``index`` of ``request``."""

    request: _Request
    index: int

    @property
    def piece(self) -> Piece:
        return self.request.pieces[self.index]


class MicroBatcher:
    """Admit requests, queue their pieces per caller, and feed batches to ``run`` in the engine
    thread (batched across requests when ``enabled``)."""

    def __init__(self, run: Runner, metrics: Metrics, admission: Admission, *, enabled: bool, wait_ms: float, max_texts: int,
                 wait_fraction: float = 0.0, wait_max_ms: float = 0.0, piece_tokens: int = 64, long_text_tokens: int = 160,
                 split_tokens: int = 64, prepare: Callable[[ExtractOptions], object] | None = None,
                 text_entities: TextEntities | None = None, loaded: Callable[[ExtractOptions], bool] | None = None,
                 load: Callable[[ExtractOptions], object] | None = None,
                 reading: Callable[[ExtractOptions], Reading] | None = None) -> None:
        self._run = run
        # how the engine reads a text for the options (its windows, the queries of each): what a piece's work is counted in
        self._reading = reading or (lambda options: Reading(queries=query_tokens(options.label_specs())))
        self._prepare = prepare  # run in the engine thread before a batch, untimed
        self._loaded = loaded or (lambda options: True)  # whether the options' model is loaded
        self._load = load  # loads it, in the loader thread
        self._loads: dict[str, asyncio.Future[object]] = {}  # by model: the load under way
        self._text_entities = text_entities or (lambda options, text, found: resolve_overlaps(found) if options.flat_ner else distinct_spans(found))
        self._metrics = metrics
        self.admission = admission
        self.enabled = enabled
        self._wait_s = wait_ms / 1000
        self._wait_fraction = wait_fraction
        self._wait_max_s = max(wait_max_ms, wait_ms) / 1000
        self._last_run_s = 0.0
        self._max_texts = max_texts
        self._piece_tokens = piece_tokens
        self._long_text_tokens = long_text_tokens
        self._split_tokens = split_tokens
        self._queues: dict[str, deque[_Queued]] = {}  # per caller, in arrival order; dict order is the callers' turn
        self._queued = 0
        self._arrived = asyncio.Event()
        self.pending_texts = 0  # texts of admitted requests not answered yet
        self.pending_tokens = 0  # their estimated work
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ner-engine")
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ner-loader")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start gathering (inside the running event loop)."""
        self._arrived = asyncio.Event()
        self._task = asyncio.create_task(self._gather_forever(), name="micro-batcher")

    async def stop(self) -> None:
        """Stop gathering and wait for the engine thread to finish its current call."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._loader.shutdown(wait=True, cancel_futures=True)

    def load(self, options: ExtractOptions) -> asyncio.Future[object]:
        """The load of ``options.model`` in the loader thread (one per model at a time; done at
        once when it is loaded). When it ends, the pieces waiting for it may run, or, if it failed,
        get its error."""
        if self._load is None or self._loaded(options):
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        if options.model not in self._loads:
            future = asyncio.get_running_loop().run_in_executor(self._loader, self._load, options)
            self._loads[options.model] = future
            future.add_done_callback(lambda done: self._load_ended(options.model, done))
        return self._loads[options.model]

    def _load_ended(self, model: str, done: asyncio.Future[object]) -> None:
        del self._loads[model]
        error = None if done.cancelled() else done.exception()
        if error is not None:
            for queue in self._queues.values():
                for queued in queue:
                    if queued.request.options.model == model and not queued.request.future.done():
                        queued.request.future.set_exception(error)
        self._arrived.set()  # its pieces may be taken now (or dropped)

    async def in_engine_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the engine thread (e.g. loading a model), after the work queued there."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def submit(self, options: ExtractOptions, texts: list[str], caller: str = "") -> list[Extraction]:
        """The extractions of ``texts``. Raises :class:`~.admission.TooMuchWork` or
        :class:`~.admission.Overloaded` before queueing anything; cancelling the call (a timeout, a
        client gone) takes its pieces out of the queue."""
        request = self._request(options, texts)
        try:
            self.admission.check(request.tokens, len(texts), self.pending_tokens, self.pending_texts)
        except Overloaded:
            self._calibrate(request)
            raise
        self._enqueue(request, caller)
        self.load(options)
        try:
            return await request.future
        finally:
            if not request.future.done():
                request.future.cancel()
            self._drop_cancelled(caller)
            self._hold(request, -1)

    def _request(self, options: ExtractOptions, texts: list[str]) -> _Request:
        pieces = pieces_of(texts, self._piece_tokens, self._long_text_tokens, self._reading(options))
        return _Request(options, texts, pieces, asyncio.get_running_loop().create_future())

    def _enqueue(self, request: _Request, caller: str) -> None:
        self._hold(request, +1)
        queue = self._queues.setdefault(caller, deque())
        queue.extend(_Queued(request, index) for index in range(len(request.pieces)))
        self._queued += len(request.pieces)
        self._arrived.set()

    def _calibrate(self, refused: _Request) -> None:
        """Measure the engine on the first batch the ``refused`` request would have made (one piece
        of a long text, or up to ``max_texts`` of its texts) if nothing else is queued: the rate
        is learnt only from engine calls, so on an idle engine (a fresh server's, or one measured
        while the machine was busy, or on work of another shape: one short text a call costs more
        a token than a batch or a long text's pieces) a request refused for its size alone would
        be refused again however fast the engine is now for it. That call alone becomes the rate.
        One call at a time, only while nothing is queued; its answer is dropped."""
        if self.pending_texts or not self.admission.rate.measuring:
            return
        first = refused.pieces[0]
        texts = [first.text] if first.split else [p.text for p in refused.pieces if not p.split][:self._max_texts]
        request = self._request(refused.options, texts)
        request.calibration = True
        self._enqueue(request, CALIBRATION_CALLER)
        request.future.add_done_callback(lambda done: self._calibrated(request, done))

    def _calibrated(self, request: _Request, done: asyncio.Future[list[Extraction]]) -> None:
        self._hold(request, -1)
        if not done.cancelled() and done.exception() is not None:
            logger.warning("the engine's calibration call failed", exc_info=done.exception())

    def _hold(self, request: _Request, sign: int) -> None:
        self.pending_texts += sign * len(request.texts)
        self.pending_tokens += sign * request.tokens
        self._metrics.queue_texts.set(self.pending_texts)

    def _drop_cancelled(self, caller: str) -> None:
        queue = self._queues.get(caller)
        if queue:
            live = deque(q for q in queue if not q.request.future.done())
            self._queued -= len(queue) - len(live)
            self._queues[caller] = live

    async def _gather_forever(self) -> None:
        while True:
            if not self._queued:
                self._arrived.clear()
                await self._arrived.wait()
            if self.enabled:
                await self._gather_more()
            batch = self._take_batch()
            if batch:
                await self._process(batch)
            else:  # every queued piece waits for its model: until a load ends or a piece arrives
                self._arrived.clear()
                await self._arrived.wait()

    def gather_window_s(self) -> float:
        """How long the next batch may wait for more requests (module docstring)."""
        return min(max(self._wait_s, self._wait_fraction * self._last_run_s), self._wait_max_s)

    async def _gather_more(self) -> None:
        """Wait for more pieces for up to the gathering window, or until ``max_texts`` are queued."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.gather_window_s()
        while self._queued < self._max_texts:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return

    def _take_batch(self) -> list[_Queued]:
        """The next batch: it starts with the first piece of the next caller in turn; whole texts
        with the same options join it from every caller in turn, or, if it is a piece of a long
        text, other such pieces up to ``split_tokens``. Without micro-batching: one request's pieces."""
        for caller in list(self._queues):
            self._drop_cancelled(caller)
            if not self._queues[caller]:
                del self._queues[caller]
        first_caller, first = next(((caller, queued) for caller, queue in self._queues.items() for queued in queue
                                    if self._ready(queued.request.options)), (None, None))
        if first is None:
            return []
        batch: list[_Queued] = []
        tokens = 0
        limit = self._max_texts if self.enabled else len(first.request.pieces)
        progressed = True
        while progressed and len(batch) < limit:
            progressed = False
            for queue in self._queues.values():
                if len(batch) >= limit:
                    break
                found = next((q for q in queue if self._joins(q, first, batch, tokens)), None)
                if found is not None:
                    queue.remove(found)
                    batch.append(found)
                    tokens += found.piece.units
                    progressed = True
        self._queues[first_caller] = self._queues.pop(first_caller)  # its turn is over: to the back
        self._queued = sum(len(queue) for queue in self._queues.values())
        return batch

    def _ready(self, options: ExtractOptions) -> bool:
        """Whether the model of ``options`` is loaded (else its load is started)."""
        if self._loaded(options):
            return True
        self.load(options)
        return False

    def _joins(self, queued: _Queued, first: _Queued, batch: list[_Queued], tokens: int) -> bool:
        """Whether ``queued`` may join a batch that starts with ``first`` and holds ``tokens``."""
        if queued.request.options != first.request.options:
            return False
        if not self.enabled:
            return queued.request is first.request
        if queued.piece.split != first.piece.split:
            return False
        return not (first.piece.split and batch and tokens + queued.piece.units > self._split_tokens)

    async def _process(self, batch: list[_Queued]) -> None:
        options = batch[0].request.options
        try:
            if self._prepare is not None:  # a model loaded on first use is not engine time: it would inflate the rate
                await self.in_engine_thread(self._prepare, options)
            batch = [queued for queued in batch if not queued.request.future.done()]  # cancelled while the engine was busy
            if not batch:
                return
            texts = [queued.piece.text for queued in batch]
            began = time.perf_counter()
            results = await self.in_engine_thread(self._run, options, texts)
            self._last_run_s = time.perf_counter() - began
            self.admission.rate.observe(sum(queued.piece.units for queued in batch), self._last_run_s,
                                        fresh=any(queued.request.calibration for queued in batch))
            self._metrics.observe_batch(len(texts), results)
            complete: dict[int, _Request] = {}
            for queued, result in zip(batch, results):
                queued.request.answers[queued.index] = result
                if len(queued.request.answers) == len(queued.request.pieces):
                    complete[id(queued.request)] = queued.request
            for request in complete.values():
                # put together in the engine thread: it asks the model's engine, which is never loaded on the event loop
                answer = await self.in_engine_thread(request.answer, self._text_entities)
                if not request.future.done():
                    request.future.set_result(answer)
        except Exception as error:  # delivered to the waiting requests, which map it to a response
            for queued in batch:
                if not queued.request.future.done():
                    queued.request.future.set_exception(error)
