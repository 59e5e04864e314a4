from django.urls import path

from feeds import views

urlpatterns = [
    path("feeds/<str:token>.ics", views.feed, name="feed"),
]
