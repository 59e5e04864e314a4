from django.urls import include, path
from rest_framework.routers import DefaultRouter

from accounting.api import DemandView, LengthAdviceView, UsageReportView
from accounting.suggest_api import SuggestView
from accounts.api import ApiTokenViewSet
from environments.api import EnvironmentViewSet, LaunchViewSet
from live.api import FleetStatusView
from nodes.api import NodeViewSet
from nodes.ingest_api import EventsView, HeartbeatView, TelemetryView
from reservations.api import AvailabilityView, GpuViewSet, ReservationViewSet
from reservations.calendar_api import CalendarDataView
from reservations.lease_api import SnapshotView
from reservations.me import MeView
from reservations.series_api import SeriesViewSet
from waitlist.api import WaitlistViewSet

router = DefaultRouter()
router.register("nodes", NodeViewSet, basename="node")
router.register("gpus", GpuViewSet, basename="gpu")
router.register("reservations", ReservationViewSet, basename="reservation")
router.register("series", SeriesViewSet, basename="series")
router.register("tokens", ApiTokenViewSet, basename="token")
router.register("waitlist", WaitlistViewSet, basename="waitlist")
router.register("environments", EnvironmentViewSet, basename="environment")
router.register("launches", LaunchViewSet, basename="launch")

urlpatterns = [
    path("me/", MeView.as_view(), name="me"),
    path("me/length-advice/", LengthAdviceView.as_view(), name="me-length-advice"),
    path("availability/", AvailabilityView.as_view(), name="availability"),
    path("availability/suggest/", SuggestView.as_view(), name="availability-suggest"),
    path("calendar/", CalendarDataView.as_view(), name="calendar"),
    path("status/", FleetStatusView.as_view(), name="status"),
    path("reports/usage/", UsageReportView.as_view(), name="report-usage"),
    path("reports/demand/", DemandView.as_view(), name="report-demand"),
    path("agent/heartbeat/", HeartbeatView.as_view(), name="agent-heartbeat"),
    path("agent/events/", EventsView.as_view(), name="agent-events"),
    path("agent/telemetry/", TelemetryView.as_view(), name="agent-telemetry"),
    path("agent/snapshot/", SnapshotView.as_view(), name="agent-snapshot"),
    path("feeds/", include("feeds.api_urls")),
    path("", include(router.urls)),
]
