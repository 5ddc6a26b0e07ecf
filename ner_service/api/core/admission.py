"""Admission: a request is accepted only if the work queued before it and its own can be done
within the request timeout at the engine's measured rate; otherwise 429 with the seconds after
which it would be (``Retry-After``), or 413 if it could never be."""

from __future__ import annotations

import math
import threading


class Overloaded(RuntimeError):
    """The queue holds more work than the timeout leaves room for; retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TooMuchWork(ValueError):
    """A request bigger than one request may be (tokens), or than the timeout allows alone."""


class ServiceRate:
    """Seconds of engine time per estimated token: ``prior_ms_per_token`` until the first engine
    call is measured, then an exponential moving average over calls; or, made by :meth:`fixed`,
    a rate that engine calls do not change (``NER_FIXED_MS_PER_TOKEN``: admission that does not
    follow the momentary speed of a machine shared with other work)."""

    def __init__(self, prior_ms_per_token: float, smoothing: float = 0.3, *, measuring: bool = True) -> None:
        self.seconds_per_token = prior_ms_per_token / 1000
        self.smoothing = smoothing
        self.measuring = measuring
        self.measured = False
        self._lock = threading.Lock()

    @classmethod
    def fixed(cls, ms_per_token: float) -> ServiceRate:
        """A rate of ``ms_per_token`` that :meth:`observe` leaves as it is."""
        return cls(ms_per_token, measuring=False)

    def observe(self, tokens: int, seconds: float) -> None:
        """Record one engine call over ``tokens`` estimated tokens (nothing, for a fixed rate)."""
        if tokens > 0 and self.measuring:
            with self._lock:
                weight = self.smoothing if self.measured else 1.0
                self.seconds_per_token += weight * (seconds / tokens - self.seconds_per_token)
                self.measured = True

    def seconds_for(self, tokens: int) -> float:
        return tokens * self.seconds_per_token


class Admission:
    """Decides, from the work queued and the measured rate, whether a request may wait."""

    def __init__(self, rate: ServiceRate, budget_s: float, max_request_tokens: int, queue_max_texts: int) -> None:
        self.rate = rate
        self.budget_s = budget_s
        self.max_request_tokens = max_request_tokens
        self.queue_max_texts = queue_max_texts

    def check(self, tokens: int, texts: int, queued_tokens: int, queued_texts: int) -> None:
        """Raise :class:`TooMuchWork` or :class:`Overloaded` unless a request of ``tokens`` and
        ``texts`` may join a queue holding ``queued_tokens`` and ``queued_texts``."""
        if tokens > self.max_request_tokens:
            raise TooMuchWork(f"the request is about {tokens} tokens of work; at most {self.max_request_tokens} "
                              "(NER_MAX_REQUEST_TOKENS): send fewer or shorter texts, or a batch job (/v1/jobs)")
        own = self.rate.seconds_for(tokens)
        if own > self.budget_s:
            raise TooMuchWork(f"the request needs about {own:.0f} s of engine time, more than the {self.budget_s:.0f} s "
                              "a request may wait: send fewer or shorter texts, or a batch job (/v1/jobs)")
        if queued_texts + texts > self.queue_max_texts:
            raise Overloaded(f"the queue holds {queued_texts} texts (NER_QUEUE_MAX={self.queue_max_texts}); retry later",
                             self.retry_after(queued_tokens, tokens))
        wait = self.rate.seconds_for(queued_tokens) + own
        if wait > self.budget_s:
            raise Overloaded(f"the server is at capacity: about {wait:.0f} s of work would be ahead of this request's "
                             f"answer, more than the {self.budget_s:.0f} s it may wait; retry later", self.retry_after(queued_tokens, tokens))

    def retry_after(self, queued_tokens: int, tokens: int) -> int:
        """Seconds until enough of the queue is done for this request to fit (at least 1)."""
        excess = self.rate.seconds_for(queued_tokens + tokens) - self.budget_s
        return max(1, math.ceil(excess))
