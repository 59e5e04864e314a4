"""The ``/metrics`` endpoint: who may scrape it (metrics/access.py) and the text it answers
(metrics/collector.py)."""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from metrics.access import scrape_refusal
from metrics.collector import render

logger = logging.getLogger(__name__)
TEXT = "text/plain; charset=utf-8"


@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """GET /metrics: Prometheus' text format, for the scraper METRICS_TOKEN or METRICS_ALLOWED_IPS lets in."""
    refusal = scrape_refusal(request)
    if refusal is not None:
        return HttpResponse(refusal + "\n", status=403, content_type=TEXT)
    try:
        body = render()
    except Exception:  # the database is away, say: the target is down, not the portal broken
        logger.exception("could not build /metrics")
        return HttpResponse(
            "The metrics could not be read; the portal's log says why.\n", status=503, content_type=TEXT
        )
    return HttpResponse(body, content_type=CONTENT_TYPE_PLAIN_0_0_4)
