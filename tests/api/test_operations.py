"""Probes, Prometheus metrics, JSON logs with the request id, and the ``serve`` command."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from ner_service.api.core.logging import JsonFormatter, request_id_var
from padellm_ner.cli import build_parser, main


def test_metrics_count_requests_batches_and_tokens(client) -> None:
    client.post("/v1/entities", json={"texts": ["EU rejects German call .", "Peter Blackburn"]})
    client.post("/v1/entities", json={"text": 1})
    client.get("/no-such-page")
    text = client.get("/metrics").text
    assert 'padellm_http_requests_total{method="POST",route="/v1/entities",status="200"}' in text
    assert 'padellm_http_requests_total{method="POST",route="/v1/entities",status="422"}' in text
    assert 'padellm_http_requests_total{method="GET",route="unmatched",status="404"}' in text
    assert 'padellm_http_request_duration_seconds_bucket{le="0.005",route="/v1/entities"}' in text
    batches = next(line for line in text.splitlines() if line.startswith("padellm_engine_batch_texts_sum"))
    assert float(batches.split()[-1]) >= 2
    assert "padellm_engine_tokens_per_forward_count" in text and "padellm_queue_texts 0.0" in text


def test_readyz_reports_a_model_that_fails_to_load(make_client, tmp_path: Path) -> None:
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "ner_model.json").write_text(json.dumps({"name": "broken", "labels": ["PER"]}))
    client = make_client(ready=False, ner_model=str(broken))
    deadline = time.monotonic() + 120  # bounds a failing test only: the load fails as soon as it is tried
    while (ready := client.get("/readyz")).json()["status"] == "loading":
        assert time.monotonic() < deadline, "the broken model was still loading"
        time.sleep(0.01)
    assert ready.status_code == 503 and ready.json()["status"] == "failed" and ready.json()["detail"]
    assert client.get("/healthz").json() == {"status": "ok"}
    answer = client.post("/v1/entities", json={"text": "Peter"})
    assert answer.status_code == 503 and "could not be loaded" in answer.json()["detail"]


def test_log_lines_are_json_with_the_request_id() -> None:
    token = request_id_var.set("req-42")
    try:
        record = logging.makeLogRecord({"name": "x", "levelname": "INFO", "msg": "hello %s", "args": ("you",), "model": "m"})
        line = json.loads(JsonFormatter().format(record))
    finally:
        request_id_var.reset(token)
    assert line["message"] == "hello you" and line["request_id"] == "req-42" and line["model"] == "m"


def test_serve_refuses_an_unknown_model_before_it_starts(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["serve", "--model", "runs/mine"]).model == "runs/mine"
    assert main(["serve", "--model", "no-such-model"]) == 2
    assert capsys.readouterr().err.startswith("padellm-ner: error: unknown model 'no-such-model'")
