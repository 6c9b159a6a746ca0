"""The hardware advisor: which accelerator type, how long, how much, with what evidence."""

from __future__ import annotations

from fastapi import APIRouter

from shipyard.api.deps import Asked, Reader
from shipyard.api.errors import PROBLEM_RESPONSES
from shipyard.schemas.views import HardwareAdviceView
from shipyard.services.estimates import planning

router = APIRouter(prefix="/api/v1", tags=["planner"], responses=PROBLEM_RESPONSES)


@router.get("/planner/compare", operation_id="compareHardware", response_model=HardwareAdviceView)
def compare_hardware(ctx: Reader, asked: Asked) -> HardwareAdviceView:
    """A model of ``params_b`` billion parameters trained on ``tokens_b`` billion tokens, planned on
    ``devices`` of every type in this server's catalog (its ``hardware.yaml`` included) and ranked
    by ``rank_by``; types whose 80 % ranges overlap share a rank. The dashboard's planner page."""
    rows, caveat = planning.advice(ctx.settings, asked)
    return HardwareAdviceView(rank_by=asked.rank_by, rows=rows, price_caveat=caveat)
