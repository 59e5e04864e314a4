"""A scrape costs the same few queries whatever the fleet's size."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from nodes.models import AgentState
from tests.conftest import at
from tests.factories import book, node_with_gpus
from tests.metrics.conftest import reading

# The status cards (3), lease versions (1), bookings (1), periodic jobs (1), fair share (4: bookings, usage
# hours, people, group memberships with their shares), the waitlist (1).
QUERIES = 11


def grow(count: int, users) -> None:
    """``count`` more nodes of 4 GPUs, each reporting, read, and booked by turns."""
    for n in range(count):
        node = node_with_gpus(4)
        AgentState.objects.create(node=node, last_seen=timezone.now(), clock_skew_seconds=0.1)
        for gpu in node.gpus.all():
            reading(gpu, age=timedelta(seconds=1), power_w=200.0, processes=[{"pid": 1, "user": "x"}])
        book(users[n % len(users)], list(node.gpus.all()[:2]), at(1), at(2))


@pytest.mark.usefixtures("clock")
def test_a_scrape_costs_the_same_queries_for_one_node_or_twenty(scrape, alice, bob, django_assert_max_num_queries):
    grow(1, [alice, bob])
    with django_assert_max_num_queries(QUERIES):
        small = scrape()
    grow(19, [alice, bob])
    with django_assert_max_num_queries(QUERIES):
        large = scrape()
    assert small.count("gpubook_gpu_info{") == 4
    assert large.count("gpubook_gpu_info{") == 80
