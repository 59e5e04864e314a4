from django.urls import path

from feeds import pages

urlpatterns = [
    path("feeds/<str:token>.ics", pages.feed, name="feed"),
    path("profile/feeds/rotate/", pages.feeds_rotate, name="feeds-rotate"),
]
