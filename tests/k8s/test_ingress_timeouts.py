"""The Ingress bounds what a slow client or a slow answer may hold (docs/deploy.md, "Slow clients and timeouts")."""

from __future__ import annotations

import pytest

from ner_service.settings import Settings
from tests.k8s.test_manifests import OVERLAYS, find, rendered  # noqa: F401 (fixture)

PREFIX = "nginx.ingress.kubernetes.io/"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_ingress_buffers_requests_and_answers_within_the_request_budget(rendered, overlay: str) -> None:  # noqa: F811
    (ingress,) = find(rendered[overlay], "Ingress")
    annotations = ingress["metadata"]["annotations"]
    settings = Settings()
    assert annotations[PREFIX + "proxy-request-buffering"] == "on"  # a slow client's body never reaches a pod half-sent
    assert settings.ner_request_timeout_s < float(annotations[PREFIX + "proxy-read-timeout"]) <= settings.ner_request_timeout_s + 30
    body_mb = float(annotations[PREFIX + "proxy-body-size"].rstrip("m"))
    assert body_mb * 2**20 >= settings.ner_max_texts * settings.ner_max_text_chars * 6  # the API's own limit (JSON escapes)
    assert settings.ner_header_timeout_s <= 60 and settings.ner_body_timeout_s <= 60
