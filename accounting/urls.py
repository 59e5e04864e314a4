from django.urls import path

from accounting.pages import report_csv, report_page

urlpatterns = [
    path("reports/", report_page, name="reports"),
    path("reports/usage.csv", report_csv, name="report-csv"),
]
