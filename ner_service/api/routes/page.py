"""``GET /``: the entity-highlighting page."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from ner_service.api.page_html import PAGE

router = APIRouter(tags=["page"])


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def page() -> HTMLResponse:
    """The self-contained page that highlights entities (it calls ``/v1/models`` and ``/v1/entities``)."""
    return HTMLResponse(PAGE)
