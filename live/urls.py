from django.urls import path

from live.pages import status_page

urlpatterns = [
    path("status/", status_page, name="status"),
]
