"""``/api/v1/feeds/``: included from portal/api_urls.py, so the names are ``api:feeds`` and ``api:feeds-rotate``."""

from django.urls import path

from feeds.api import FeedListView, FeedRotateView

urlpatterns = [
    path("", FeedListView.as_view(), name="feeds"),
    path("rotate/", FeedRotateView.as_view(), name="feeds-rotate"),
]
