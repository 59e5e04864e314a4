"""Make and fill a database with a released version's own code, as a lab running that release has one
(tests/test_upgrade.py runs this file with the release's tree first on the path, never this tree's).

It migrates the empty database DATABASE_URL names, then books through the release's services what a lab has: a
researcher and an admin, a node registered with its agent's credentials and broker user, its GPUs, a booking, a
recurring series and an API token. What a later version must still honour is printed as one line of JSON.

Written against the services of v2.0.0 (tests/test_upgrade.py, RELEASE): when the release the test starts from
moves on, this moves with it."""

from __future__ import annotations

import json
from datetime import timedelta

import django

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402 - after django.setup()
from django.core.management import call_command  # noqa: E402
from django.utils import timezone  # noqa: E402

from accounts.services import api_token_create  # noqa: E402
from nodes.models import Gpu  # noqa: E402
from nodes.services import node_register  # noqa: E402
from reservations.series import series_create  # noqa: E402
from reservations.services import reservation_create  # noqa: E402


def main() -> None:
    call_command("migrate", "--noinput", verbosity=0)
    users = get_user_model()
    alice = users.objects.create_user("alice", email="alice@lab.example", password="x" * 20, unix_username="alice")
    users.objects.create_superuser("carol", email="carol@lab.example", password="y" * 20)
    credentials = node_register(name="gpu-up", hostname="up.lab.example")
    gpus = [
        Gpu.objects.create(
            node=credentials.node,
            index=index,
            uuid=f"GPU-{index:08x}-5eed-5eed-5eed-000000000000",
            model="NVIDIA A100-SXM4-80GB",
            memory_mib=81920,
        )
        for index in range(2)
    ]
    start = timezone.now().replace(second=0, microsecond=0) + timedelta(hours=1)
    booking = reservation_create(user=alice, gpus=[gpus[0]], start=start, end=start + timedelta(hours=2), purpose="up")
    first = start + timedelta(days=1)
    series = series_create(
        user=alice, gpus=[gpus[1]], start=first, end=first + timedelta(hours=1), rule="FREQ=DAILY;COUNT=3", zone="UTC"
    )
    _, token = api_token_create(user=alice, name="upgrade check")
    print(
        json.dumps(
            {
                "node": credentials.node.name,
                "lease_secret": credentials.lease_secret,
                "agent_token": credentials.agent_token,
                "broker_url": credentials.broker_url,
                "gpus": [gpu.uuid for gpu in gpus],
                "booking": {
                    "id": booking.pk,
                    "start": booking.start.isoformat(),
                    "end": booking.end.isoformat(),
                    "status": booking.status,
                },
                "series": {
                    "id": series.series.pk if series.series else None,
                    "bookings": sorted(o.reservation.pk for o in series.occurrences if o.reservation is not None),
                },
                "token": token,
            }
        )
    )


if __name__ == "__main__":
    main()
