"""Admission and the engine rate it assumes. The rate is set by the test (a fixed rate, or
engine calls of a duration it chooses; where the tiny model itself is measured, a prior hundreds
of times slower than it), so that what is checked is the decision (admit, 429 with the seconds
until the request could fit, 413 for what can never fit), never how fast this machine happens to be."""

from __future__ import annotations

import asyncio
import re
import time
from types import SimpleNamespace

import pytest

from ner_service.api.core import batching
from ner_service.api.core.admission import Admission, Overloaded, ServiceRate, TooMuchWork
from ner_service.api.core.batching import MicroBatcher
from ner_service.api.core.metrics import Metrics
from ner_service.api.core.work import PREFIX_TOKENS, Reading, estimated_tokens, query_tokens
from ner_service.engine import ExtractOptions, Extraction
from ner_service.engine.labels import label_specs

KEY = ExtractOptions("m", None, "padellm", "greedy")
TEXT = "EU rejects German call to boycott British lamb ."


def test_the_measured_rate_starts_from_the_prior_then_weighs_engine_calls_by_their_tokens() -> None:
    rate = ServiceRate(prior_ms_per_token=50.0, horizon_tokens=1000)
    assert not rate.measured and rate.seconds_for(100) == pytest.approx(5.0)
    rate.observe(1000, 5.0)  # the first call replaces the prior
    assert rate.measured and rate.seconds_per_token == pytest.approx(0.005)
    rate.observe(10, 10.0)  # one slow short call (1 s a token) is 10 tokens among the 1,000 averaged ...
    assert 0.005 < rate.seconds_per_token < 0.02  # ... not the new rate (an average over calls made it 0.3 s)
    for _ in range(5):  # a few horizons of work at a new speed take it there
        rate.observe(1000, 1.0)
    assert rate.seconds_per_token == pytest.approx(0.001, rel=0.1)
    before = rate.seconds_per_token
    rate.observe(0, 9.0)  # a call over no tokens teaches nothing
    assert rate.seconds_per_token == before


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


def test_at_a_measured_rate_a_request_too_big_for_the_budget_alone_is_shed_unless_it_never_fits() -> None:
    rate = ServiceRate(prior_ms_per_token=10.0)
    admission = Admission(rate, budget_s=8.0, max_request_tokens=2000, queue_max_texts=10)
    with pytest.raises(Overloaded, match="NER_PRIOR_MS_PER_TOKEN") as shed:  # 9 s at the rate assumed so far
        admission.check(tokens=900, texts=1, queued_tokens=0, queued_texts=0)
    assert shed.value.retry_after_s == 1  # nothing queued: retry as soon as the engine is measured
    rate.observe(100, 0.5)  # measured: 5 ms a token, the fastest yet
    rate.observe(100, 2.0, fresh=True)  # then 20 ms a token (a machine busy with something else)
    with pytest.raises(Overloaded, match="measured rate") as shed:  # 10 s alone now, 2.5 s at the fastest: it could fit later
        admission.check(tokens=500, texts=1, queued_tokens=300, queued_texts=2)
    assert shed.value.retry_after_s == 6  # once the 6 s of work ahead are done, the rate is measured anew
    admission.check(tokens=300, texts=1, queued_tokens=0, queued_texts=0)  # 6 s: fits
    with pytest.raises(TooMuchWork, match="never be answered here.*POST /v1/jobs"):  # 8.5 s even at the fastest rate
        admission.check(tokens=1700, texts=1, queued_tokens=0, queued_texts=0)
    with pytest.raises(TooMuchWork, match="NER_MAX_REQUEST_TOKENS"):  # limits that do not move
        admission.check(tokens=2001, texts=1, queued_tokens=0, queued_texts=0)
    with pytest.raises(TooMuchWork, match="NER_QUEUE_MAX"):
        admission.check(tokens=100, texts=11, queued_tokens=0, queued_texts=0)


def test_a_request_refused_on_an_idle_engine_has_the_engine_measured_and_its_retry_admitted(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a fresh server nothing has measured the engine: a request too big at the pessimistic
    prior is shed, and the batcher measures the engine on a small text, so that the retry is
    decided at the engine's rate (1 ms a token here, by the batcher's clock, which the test sets)."""
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(batching, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    calls: list[list[str]] = []

    def run(key: ExtractOptions, texts: list[str]) -> list[Extraction]:
        calls.append(list(texts))
        clock.now += 0.001 * sum(Reading().work(text) for text in texts)
        return [Extraction(text, []) for text in texts]

    text = "word " * 96  # 100 tokens of work with its prefix: 100 s at the prior, more than the 60 s budget
    rate = ServiceRate(prior_ms_per_token=1000.0)

    async def scenario() -> None:
        batcher = MicroBatcher(run, Metrics(), Admission(rate, budget_s=60, max_request_tokens=100_000, queue_max_texts=64),
                               enabled=True, wait_ms=1, max_texts=8)
        batcher.start()
        with pytest.raises(Overloaded) as shed:
            await batcher.submit(KEY, [text])
        assert shed.value.retry_after_s == 1
        async def calibrated() -> None:
            while batcher.pending_texts or not rate.measured:
                await asyncio.sleep(0.001)

        await asyncio.wait_for(calibrated(), 60)  # the calibration call (the timeout bounds a test that fails)
        assert [answer.text for answer in await batcher.submit(KEY, [text])] == [text]  # the retry
        await batcher.stop()

    asyncio.run(scenario())
    assert calls == [[text], [text]]  # measured on the refused request's own work
    assert rate.seconds_per_token == pytest.approx(0.001)


def test_a_fixed_rate_never_has_the_engine_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def run(key: ExtractOptions, texts: list[str]) -> list[Extraction]:
        calls.append(list(texts))
        return [Extraction(text, []) for text in texts]

    async def scenario() -> None:
        admission = Admission(ServiceRate.fixed(1000.0), budget_s=60, max_request_tokens=100_000, queue_max_texts=64)
        batcher = MicroBatcher(run, Metrics(), admission, enabled=True, wait_ms=1, max_texts=8)
        batcher.start()
        with pytest.raises(TooMuchWork):  # 100 s at the fixed rate, for ever
            await batcher.submit(KEY, ["word " * 96])
        assert batcher.pending_texts == 0
        await batcher.stop()

    asyncio.run(scenario())
    assert calls == []


def test_a_request_is_charged_for_its_labels_queries_in_every_window_the_model_reads() -> None:
    sentence = "Peter Blackburn met officials in Brussels ."
    two = f"{sentence} {sentence}"
    person = query_tokens(label_specs(["person"], True))
    assert person == 2 * estimated_tokens("person") + 6  # the name in its count query and its mention query
    described = query_tokens(label_specs([{"name": "person", "description": "a human being, alive or dead"}], True))
    assert described > person + 2 * estimated_tokens("a human being, alive or dead")  # the description is written twice
    names = [f"type {chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(48)]  # "type aa", "type ba", ...: alike in length
    assert query_tokens(label_specs(names, True)) == 48 * query_tokens(label_specs(names[:1], True))
    whole, sentences = Reading(160, False, person), Reading(160, True, person)
    assert whole.work(two) == estimated_tokens(two) + PREFIX_TOKENS + person  # one window
    assert sentences.work(two) == estimated_tokens(two) + 2 * (PREFIX_TOKENS + person)  # a window a sentence
    assert Reading(8, False, person).work(sentence) > whole.work(sentence)  # a text longer than a window is several
    assert whole.work(" \n\t ") == 0  # a blank text is read in no window


def test_an_open_models_request_is_admitted_by_the_work_of_its_labels_as_well_as_its_text(make_client, open_model_folder) -> None:
    # a budget of 8 s at 4 ms a token: 2,000 tokens of work. Ten labels with long descriptions (1,790
    # characters, within a request's 2,000) are about 1,000 tokens of queries in each of the text's
    # three sentences: 3,000 tokens
    client = make_client(ner_model=str(open_model_folder), ner_fixed_ms_per_token=4.0, ner_request_timeout_s=10.0)
    text = "Peter Blackburn met officials in Brussels . He flew to Paris on Monday . The talks ended ."
    described = [{"name": f"kind {i}", "description": "a thing of this kind as the guidelines of a long and detailed corpus "
                  "define it, with examples, exceptions and edge cases, and notes on nesting and on what is not one"} for i in range(10)]
    refused = client.post("/v1/entities", json={"text": text, "labels": described})
    assert refused.status_code == 413, refused.text
    assert "fewer labels" in refused.json()["detail"] and "NER_FIXED_MS_PER_TOKEN" in refused.json()["detail"]
    answered = client.post("/v1/entities", json={"text": text, "labels": ["PER", "LOC"]})  # the same text, two names
    assert answered.status_code == 200, answered.text
    found = {(e["text"], e["label"]) for e in answered.json()["results"][0]["entities"]}
    assert {("Peter Blackburn", "PER"), ("Paris", "LOC")} <= found


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
    # a budget of 8 s at 10 ms a token: 800 tokens of work; 800 words are more with their windows' queries
    client = make_client(ner_fixed_ms_per_token=10.0, ner_request_timeout_s=10.0)
    never = client.post("/v1/entities", json={"text": "word " * 800})
    assert never.status_code == 413 and "s of engine time" in never.json()["detail"]
    assert client.post("/v1/entities", json={"text": "EU rejects German call ."}).status_code == 200


def test_white_space_is_no_work_and_work_is_counted_in_tokens_not_characters(make_client) -> None:
    # a budget of 8 s at 10 ms a token: 800 tokens of work, whatever the characters
    client = make_client(ner_fixed_ms_per_token=10.0, ner_request_timeout_s=10.0, ner_max_entities_text_chars=20_000)
    blank = client.post("/v1/entities", json={"text": "\n" * 20_000})
    assert blank.status_code == 200 and blank.json()["results"][0]["entities"] == []
    gap = "Peter Blackburn met officials in Brussels ." + "\n" * 15_000 + " \t" * 2_000 + TEXT
    spaced = client.post("/v1/entities", json={"text": gap})
    assert spaced.status_code == 200, spaced.text
    assert all(gap[e["start"]:e["end"]] == e["text"] for e in spaced.json()["results"][0]["entities"])
    words = "Peter met Paul in Rome , " * 50  # 1,250 characters, about 350 tokens read in 6 windows
    assert client.post("/v1/entities", json={"text": words}).status_code == 200
    digits = "1234567890" * 100  # 1,000 characters, 1,000 tokens (a tokenizer cuts digits one by one)
    refused = client.post("/v1/entities", json={"text": digits})
    assert refused.status_code == 413 and "NER_FIXED_MS_PER_TOKEN" in refused.json()["detail"]


def test_a_request_too_big_at_the_prior_is_429_and_admitted_once_the_engine_is_measured(make_client) -> None:
    # 10 s a token assumed until the engine is measured: the text's 21 tokens need 210 s, more than
    # the 48 s budget; the tiny model's calls take milliseconds a token (500 times less would do)
    client = make_client(ner_prior_ms_per_token=10_000.0)
    shed = client.post("/v1/entities", json={"text": TEXT})
    assert shed.status_code == 429 and shed.headers["Retry-After"] == "1", shed.text
    assert "NER_PRIOR_MS_PER_TOKEN" in shed.json()["detail"]
    deadline = time.monotonic() + 120  # bounds a test that fails
    while _seconds_per_token(client) == pytest.approx(10.0):  # the calibration call measures the engine
        assert time.monotonic() < deadline, "the engine was not measured"
        time.sleep(0.01)
    assert client.post("/v1/entities", json={"text": TEXT}).status_code == 200
