from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

admin.site.site_header = "GPU booking portal"
admin.site.site_title = "GPU booking portal"
admin.site.index_title = "Lab administration"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include(("portal.api_urls", "api"), namespace="api")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("", include("accounts.urls")),
    path("", include("reservations.urls")),
    path("", include("nodes.urls")),
    path("", include("notifications.urls")),
    path("", include("accounting.urls")),
    path("", include("feeds.urls")),
    path("", include("metrics.urls")),
]

handler400 = "portal.api.bad_request"
handler404 = "portal.api.not_found"
handler500 = "portal.api.server_error"
