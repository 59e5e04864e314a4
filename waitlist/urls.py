from django.urls import path

from waitlist import pages

urlpatterns = [
    path("waitlist/", pages.waitlist_page, name="waitlist"),
    path("waitlist/queue/", pages.queue_page, name="waitlist-queue"),
    path("waitlist/<int:pk>/<slug:action>/", pages.waitlist_action, name="waitlist-action"),
]
