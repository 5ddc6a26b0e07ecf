"""Handing jobs to Redis from the API without letting a slow or hung Redis hold up other
requests, and the readiness check of the broker.

A submission waits at most ``REDIS_TIMEOUT_S`` for its job to be enqueued, on a few threads of
the dispatcher's own (never the threads that serve requests), and none waits for a thread held
by a hung send: the job is stored either way, and beat's ``dispatch_undispatched`` sweep hands
over what was not."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import redis.asyncio

from ner_service.settings import get_settings

log = logging.getLogger(__name__)

#: Jobs being handed to Redis at once; a submission beyond these leaves its job to the sweep.
DISPATCH_THREADS = 4


class Dispatcher:
    """Enqueues jobs on ``threads`` threads of its own; a caller waits at most ``wait_s``."""

    def __init__(self, threads: int, wait_s: float) -> None:
        self.wait_s = wait_s
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="dispatch")
        self._free = threading.BoundedSemaphore(threads)

    async def dispatch(self, job_id: int) -> bool:
        """Enqueue a stored job; whether that finished within the wait. ``False`` (Redis failed,
        was slower than the wait, or every thread is still busy with earlier jobs) leaves the job
        recorded and not dispatched: a send still running may finish it, else the sweep does."""
        if not self._free.acquire(blocking=False):
            log.warning("job %s stored; not enqueued now: every dispatch thread waits on Redis", job_id)
            return False
        sending = asyncio.wrap_future(self._executor.submit(self._send, job_id))
        try:
            return await asyncio.wait_for(sending, self.wait_s)
        except TimeoutError:
            log.warning("job %s stored; Redis did not take it within %g s", job_id, self.wait_s)
            return False

    def _send(self, job_id: int) -> bool:
        from pipeline.tasks import TRANSIENT, enqueue_job

        try:
            enqueue_job(job_id)
            return True
        except TRANSIENT:
            log.warning("job %s stored; handing it to Redis failed (beat's sweep does)", job_id, exc_info=True)
            return False
        finally:
            self._free.release()


@lru_cache
def get_dispatcher() -> Dispatcher:
    """This process's dispatcher (its wait is ``REDIS_TIMEOUT_S``)."""
    return Dispatcher(DISPATCH_THREADS, get_settings().redis_timeout_s)


async def broker_problem() -> str | None:
    """Why the broker cannot take jobs now (Redis does not answer PING within ``REDIS_TIMEOUT_S``),
    or ``None``: a readiness check of the API."""
    settings = get_settings()
    timeout = settings.redis_timeout_s
    client = redis.asyncio.Redis.from_url(settings.redis_url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        await asyncio.wait_for(client.ping(), timeout)
    except (redis.exceptions.RedisError, OSError, TimeoutError) as error:
        return f"the job broker (Redis) did not answer PING within {timeout:g} s ({type(error).__name__})"
    finally:
        await client.aclose()
    return None
