from django.urls import path

from environments import pages

urlpatterns = [
    path("reservations/<int:pk>/environments/launch/", pages.launch_create_page, name="launch-create"),
    path("launches/<int:pk>/stop/", pages.launch_stop_page, name="launch-stop"),
]
