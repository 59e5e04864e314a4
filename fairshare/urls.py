from django.urls import path

from fairshare.pages import fairshare_page

urlpatterns = [
    path("fairshare/", fairshare_page, name="fairshare"),
]
