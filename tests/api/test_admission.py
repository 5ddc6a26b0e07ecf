"""Admission and the engine rate it assumes. The rate is set by the test (a fixed rate, or
engine calls of a duration it chooses), so that what is checked is the decision (admit, 429
with the seconds until the request would fit, 413 for what can never fit), never how fast this
machine happens to be."""

from __future__ import annotations

import re

import pytest

from ner_service.api.core.admission import Admission, Overloaded, ServiceRate, TooMuchWork


def test_the_measured_rate_starts_from_the_prior_then_follows_the_engine_calls() -> None:
    rate = ServiceRate(prior_ms_per_token=5.0, smoothing=0.5)
    assert rate.seconds_for(100) == pytest.approx(0.5)
    rate.observe(100, 2.0)  # the first call replaces the prior
    assert rate.seconds_per_token == pytest.approx(0.02)
    rate.observe(100, 1.0)  # later ones move the average
    assert rate.seconds_per_token == pytest.approx(0.015)
    rate.observe(0, 9.0)  # a call over no tokens teaches nothing
    assert rate.seconds_per_token == pytest.approx(0.015)


def test_a_fixed_rate_is_not_moved_by_engine_calls() -> None:
    rate = ServiceRate.fixed(2.0)
    rate.observe(100, 50.0)  # a machine busy with something else
    assert rate.seconds_per_token == pytest.approx(0.002) and rate.seconds_for(1000) == pytest.approx(2.0)


def test_admission_admits_sheds_with_retry_after_or_refuses_what_can_never_fit() -> None:
    admission = Admission(ServiceRate.fixed(10.0), budget_s=8.0, max_request_tokens=1000, queue_max_texts=10)
    admission.check(tokens=300, texts=1, queued_tokens=450, queued_texts=3)  # 4.5 s ahead + 3 s: fits 8 s
    with pytest.raises(Overloaded, match="at capacity") as shed:
        admission.check(tokens=300, texts=1, queued_tokens=550, queued_texts=3)  # 8.5 s
    assert shed.value.retry_after_s == 1  # at least one second
    with pytest.raises(Overloaded) as shed:
        admission.check(tokens=300, texts=1, queued_tokens=1950, queued_texts=3)  # 22.5 s: 14.5 s too many
    assert shed.value.retry_after_s == 15
    with pytest.raises(Overloaded, match="NER_QUEUE_MAX"):
        admission.check(tokens=10, texts=2, queued_tokens=0, queued_texts=9)
    with pytest.raises(TooMuchWork, match="9 s of engine time"):  # more than the budget even on an empty queue
        admission.check(tokens=900, texts=1, queued_tokens=0, queued_texts=0)
    with pytest.raises(TooMuchWork, match="NER_MAX_REQUEST_TOKENS"):
        admission.check(tokens=1001, texts=1, queued_tokens=0, queued_texts=0)


def _seconds_per_token(client) -> float:
    return float(re.search(r"^padellm_engine_seconds_per_token (\S+)$", client.get("/metrics").text, re.M).group(1))


def test_the_app_admits_at_ner_fixed_ms_per_token_whatever_the_engine_calls_take(make_client) -> None:
    fixed = make_client(ner_fixed_ms_per_token=2.0)
    assert fixed.post("/v1/entities", json={"texts": ["EU rejects German call ."] * 4}).status_code == 200
    assert _seconds_per_token(fixed) == pytest.approx(0.002)
    measured = make_client(ner_prior_ms_per_token=1000.0)
    assert _seconds_per_token(measured) == pytest.approx(1.0)  # the prior, until a call is measured
    assert measured.post("/v1/entities", json={"text": "EU rejects German call ."}).status_code == 200
    assert _seconds_per_token(measured) != pytest.approx(1.0)


def test_a_request_that_can_never_fit_at_the_fixed_rate_is_413(make_client) -> None:
    # a budget of 8 s at 10 ms a token: 800 estimated tokens of work (a text of about 4 bytes a token)
    client = make_client(ner_fixed_ms_per_token=10.0, ner_request_timeout_s=10.0)
    never = client.post("/v1/entities", json={"text": "word " * 800})
    assert never.status_code == 413 and "s of engine time" in never.json()["detail"]
    assert client.post("/v1/entities", json={"text": "EU rejects German call ."}).status_code == 200
