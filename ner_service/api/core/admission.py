"""Admission: a request is accepted only if the work queued before it and its own can be done
within the request timeout at the engine's rate; otherwise 429 with the seconds after which it
could be (``Retry-After``). 413 is kept for what can never fit: more work than one request may
hold (``NER_MAX_REQUEST_TOKENS``), more texts than the queue may (``NER_QUEUE_MAX``), or more
than the timeout allows alone at a fixed rate (``NER_FIXED_MS_PER_TOKEN``) or at the fastest
rate this server has measured (it would not fit on an idle engine: a batch job, ``POST
/v1/jobs``, takes it). A request that fits alone at the fastest rate but not at the current one
is 429: the rate moves with the machine's load, and the engine is measured anew on it."""

from __future__ import annotations

import math
import threading

#: Tokens of work the measured rate averages over: a call weighs by its tokens, so one slow
#: short call barely moves it, and some 2,000 tokens of calls at a new speed take it there.
RATE_HORIZON_TOKENS = 2048


class Overloaded(RuntimeError):
    """The request does not fit the timeout now; retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TooMuchWork(ValueError):
    """A request bigger than one request may be (tokens, texts), or than the timeout allows alone at a fixed rate."""


class ServiceRate:
    """Seconds of engine time per token of work (:func:`~.work.work_of`).

    Measured: the engine seconds over the tokens of the calls observed, each call's share decayed
    by the tokens of the calls after it (an average over about ``horizon_tokens``). Until the
    first call, ``prior_ms_per_token``: it should be pessimistic, so that on a fresh server a
    long request is shed (and the engine measured, see :mod:`.batching`) instead of admitted to
    time out. Made by :meth:`fixed`: a rate that engine calls do not change
    (``NER_FIXED_MS_PER_TOKEN``: admission that does not follow the momentary speed of a machine
    shared with other work)."""

    def __init__(self, prior_ms_per_token: float, horizon_tokens: int = RATE_HORIZON_TOKENS, *, measuring: bool = True) -> None:
        self.seconds_per_token = prior_ms_per_token / 1000
        self.best_seconds_per_token: float | None = None  # the fastest measured, once measured
        self.horizon_tokens = horizon_tokens
        self.measuring = measuring
        self._seconds = 0.0  # the decayed sums of the calls observed
        self._tokens = 0.0
        self._lock = threading.Lock()

    @classmethod
    def fixed(cls, ms_per_token: float) -> ServiceRate:
        """A rate of ``ms_per_token`` that :meth:`observe` leaves as it is."""
        return cls(ms_per_token, measuring=False)

    @property
    def measured(self) -> bool:
        """Whether an engine call has been observed (else the rate is the prior, or fixed)."""
        return self._tokens > 0

    def observe(self, tokens: int, seconds: float, fresh: bool = False) -> None:
        """Record one engine call over ``tokens`` tokens of work (nothing, for a fixed rate);
        ``fresh``: the call alone is the rate (a measurement of the idle engine on the work of a
        refused request, which the calls before it, of other sizes and loads, must not outweigh)."""
        if tokens > 0 and self.measuring:
            with self._lock:
                kept = 0.0 if fresh else math.exp(-tokens / self.horizon_tokens)
                self._seconds = self._seconds * kept + seconds
                self._tokens = self._tokens * kept + tokens
                self.seconds_per_token = self._seconds / self._tokens
                self.best_seconds_per_token = min(self.best_seconds_per_token or math.inf, self.seconds_per_token)

    def seconds_for(self, tokens: int) -> float:
        return tokens * self.seconds_per_token

    def describe(self) -> str:
        """Which rate this is, for the messages of refused requests."""
        if not self.measuring:
            return "the fixed rate (NER_FIXED_MS_PER_TOKEN)"
        return "the engine's measured rate" if self.measured else "the rate assumed until the engine is measured (NER_PRIOR_MS_PER_TOKEN)"


class Admission:
    """Decides, from the work queued and the engine's rate, whether a request may wait."""

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
                              "(NER_MAX_REQUEST_TOKENS): send fewer or shorter texts, or fewer labels, or a batch job (/v1/jobs)")
        own = self.rate.seconds_for(tokens)
        alone = (f"at {self.rate.describe()} the request needs about {own:.0f} s of engine time, more than the "
                 f"{self.budget_s:.0f} s a request may wait")
        if own > self.budget_s and not self.rate.measuring:
            raise TooMuchWork(f"{alone}: send fewer or shorter texts, or fewer labels, or a batch job (/v1/jobs)")
        best = self.rate.best_seconds_per_token
        if best is not None and tokens * best > self.budget_s:
            raise TooMuchWork(f"the request needs about {tokens * best:.0f} s of engine time even at the fastest rate this server "
                              f"has measured ({best * 1000:.1f} ms a token), more than the {self.budget_s:.0f} s a request may wait: "
                              "it can never be answered here; send fewer or shorter texts, or fewer labels, or long texts as a batch job (POST /v1/jobs)")
        if texts > self.queue_max_texts:
            raise TooMuchWork(f"the request holds {texts} texts, more than the queue may (NER_QUEUE_MAX={self.queue_max_texts}): "
                              "send fewer texts, or a batch job (/v1/jobs)")
        if queued_texts + texts > self.queue_max_texts:
            raise Overloaded(f"the queue holds {queued_texts} texts (NER_QUEUE_MAX={self.queue_max_texts}); retry later",
                             self.retry_after(queued_tokens, tokens))
        if own > self.budget_s:
            raise Overloaded(f"{alone}; retry later (the rate is measured anew), or send fewer or shorter texts, or fewer labels",
                             self.retry_after(queued_tokens, tokens))
        wait = self.rate.seconds_for(queued_tokens) + own
        if wait > self.budget_s:
            raise Overloaded(f"the server is at capacity: about {wait:.0f} s of work would be ahead of this request's "
                             f"answer, more than the {self.budget_s:.0f} s it may wait; retry later", self.retry_after(queued_tokens, tokens))

    def retry_after(self, queued_tokens: int, tokens: int) -> int:
        """Seconds until enough of the queue is done for this request to fit; for one that does
        not fit alone, until the queue is done (its calls measure the rate anew). At least 1."""
        if self.rate.seconds_for(tokens) > self.budget_s:
            seconds = self.rate.seconds_for(queued_tokens)
        else:
            seconds = self.rate.seconds_for(queued_tokens + tokens) - self.budget_s
        return max(1, math.ceil(seconds))
