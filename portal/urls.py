from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

admin.site.site_header = "GPU booking portal"
admin.site.site_title = "GPU booking portal"
admin.site.index_title = "Lab administration"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", RedirectView.as_view(pattern_name="admin:index", permanent=False)),
]
