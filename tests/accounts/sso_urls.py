"""The portal's URLs plus OpenID Connect's, as accounts/urls.py adds them when OIDC is configured
(it decides at import, before a test can change settings)."""

from django.urls import include, path

urlpatterns = [
    path("oidc/", include("mozilla_django_oidc.urls")),
    path("", include("portal.urls")),
]
