from django.urls import path

from reservations import detail, pages, series_pages

urlpatterns = [
    path("", pages.calendar_page, name="calendar"),
    path("reservations/mine/", pages.my_reservations, name="my-reservations"),
    path("reservations/pending/", pages.pending_approvals, name="pending-approvals"),
    path("reservations/<int:pk>/", detail.reservation_detail, name="reservation-detail"),
    path("reservations/<int:pk>/<slug:action>/", pages.reservation_action, name="reservation-action"),
    path("series/<int:pk>/", series_pages.series_detail, name="series-detail"),
    path("series/<int:pk>/<slug:action>/", series_pages.series_action, name="series-action"),
]
