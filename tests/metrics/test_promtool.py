"""Prometheus' own checker, promtool (Debian package prometheus; scripts/services installs it), reads
/metrics as a real scrape returns it and finds nothing to say."""

from __future__ import annotations

import pytest

from tests.metrics.conftest import needs_promtool, promtool, samples

pytestmark = [pytest.mark.usefixtures("lab"), needs_promtool]


def test_promtool_accepts_the_metrics_of_a_lab(scrape):
    text = scrape()
    assert len(samples(text)) > 50  # every kind of series is there: held, free, stale, offline
    assert promtool("check", "metrics", input=text) == ""  # valid, and no lint remark either
