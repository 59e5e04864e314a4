from django.urls import path

from metrics.views import metrics_view

urlpatterns = [
    path("metrics", metrics_view, name="metrics"),
]
