from django.conf import settings
from django.contrib.auth import views as auth_views
from django.urls import URLPattern, URLResolver, include, path

from accounts import pages, sso

urlpatterns: list[URLPattern | URLResolver] = [
    path("accounts/login/", sso.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("profile/", pages.profile, name="profile"),
    path("profile/tokens/", pages.token_create, name="token-create"),
    path("profile/tokens/<int:pk>/revoke/", pages.token_revoke, name="token-revoke"),
    path(
        "people/<int:pk>/unix-username/<slug:decision>/",
        pages.unix_username_decide,
        name="unix-username-decide",
    ),
]

if settings.OIDC_ENABLED:  # institutional login over OpenID Connect (accounts/sso_oidc.py)
    urlpatterns.append(path("oidc/", include("mozilla_django_oidc.urls")))
