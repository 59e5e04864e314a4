from django.contrib import admin
from django.http import HttpRequest, HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import include, path
from django.views.decorators.http import require_safe
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from accounts.sso import AdminLoginForm

admin.site.site_header = "GPU booking portal"
admin.site.site_title = "GPU booking portal"
admin.site.index_title = "Lab administration"
# A directory out of reach is said on admin's login page as on the portal's, not a 500 (accounts/sso.py).
admin.site.login_form = AdminLoginForm


@require_safe
def favicon(request: HttpRequest) -> HttpResponsePermanentRedirect:
    """Pages without our <link rel=icon> (the API's browsable pages, error pages) still make browsers ask for
    /favicon.ico: send them to the icon rather than a 404."""
    return HttpResponsePermanentRedirect(static("favicon.svg"))


urlpatterns = [
    path("favicon.ico", favicon),
    path("admin/", admin.site.urls),
    path("api/v1/", include(("portal.api_urls", "api"), namespace="api")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The split view serves Swagger UI's start-up script as a file of its own (?script): the Content-Security-Policy
    # refuses inline scripts (kernel/csp.py).
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    path("", include("accounts.urls")),
    path("", include("reservations.urls")),
    path("", include("live.urls")),
    path("", include("notifications.urls")),
    path("", include("accounting.urls")),
    path("", include("feeds.urls")),
    path("", include("fairshare.urls")),
    path("", include("waitlist.urls")),
    path("", include("environments.urls")),
    path("", include("metrics.urls")),
]

handler400 = "kernel.api.bad_request"
handler404 = "kernel.api.not_found"
handler500 = "kernel.outages.server_error"  # an outage met outside a view is a 503; the rest kernel/api.py's 500
