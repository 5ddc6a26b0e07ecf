"""One source for each figure: a model's ``ner_model.json``. The README's table, ``padellm-ner
models`` and ``GET /v1/models`` (:mod:`ner_service.engine.model_metrics`) show its numbers; the
README stays a user's page (short, no dates)."""

from __future__ import annotations

import re
from pathlib import Path

from ner_service.engine.model_metrics import dev_f1, ms_per_text
from ner_service.engine.ner_model import NERModelConfig, resolve_ner_model

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")


def readme_models() -> dict[str, list[str]]:
    """The README's models table: model name -> its cells."""
    rows = {}
    for line in README.splitlines():
        found = re.match(r"\| `([a-z0-9-]+)`[^|]*\|(.*)\|\s*$", line)
        if found:
            rows[found.group(1)] = [cell.strip() for cell in found.group(2).split("|")]
    return rows


def test_the_readme_table_shows_each_models_figures_from_its_ner_model_json() -> None:
    rows = readme_models()
    assert {"en-conll03", "zh-resume", "zh-weibo", "en-conll03-lud", "en-conll03-diffusion"} <= set(rows)
    for name, (_task, f1, speed) in rows.items():
        metrics = NERModelConfig.read(resolve_ner_model(name)).metrics
        assert f1 == f"{dev_f1(metrics):.2f}", name
        assert speed == f"{ms_per_text(metrics):,.0f} ms a text", name


def test_the_readme_is_a_users_page() -> None:
    assert len(README.splitlines()) <= 120
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", README), "dates belong in CHANGELOG.md and git"
    for link in re.findall(r"\]\(([^)#]+)\)", README):
        assert link.startswith("http") or (REPO / link).exists(), link


def test_each_page_of_docs_is_reference_of_at_most_400_lines() -> None:
    pages = sorted((REPO / "docs").glob("*.md"))
    assert {p.name for p in pages} >= {"architecture.md", "api.md", "decoders.md", "training.md", "deploy.md", "benchmarks.md"}
    assert [p.name for p in pages if len(p.read_text(encoding="utf-8").splitlines()) > 400] == []


CARD_SECTIONS = ["## Intended use", "## Training data", "## Training procedure", "## Evaluation", "## Limitations", "## Licence"]


def test_each_current_models_card_is_short_in_the_hugging_face_layout_and_shows_its_figures() -> None:
    for name in readme_models():
        folder = resolve_ner_model(name)
        card = (folder / "MODEL_CARD.md").read_text(encoding="utf-8")
        assert len(card.splitlines()) <= 100, name
        assert card.startswith("---\n") and "\nlicense: " in card.split("\n---\n")[0], name  # the YAML header a hub reads
        assert [section for section in CARD_SECTIONS if section in card] == CARD_SECTIONS, name
        assert f"    padellm-ner train --recipe {name}\n" in card, name
        assert f"| **{dev_f1(NERModelConfig.read(folder).metrics):.2f}** |" in card, name
        assert "issue" not in card.lower(), name  # written for users, not the tracker
