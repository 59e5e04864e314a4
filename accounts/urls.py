from django.contrib.auth import views as auth_views
from django.urls import path

from accounts import pages

urlpatterns = [
    path("accounts/login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("profile/", pages.profile, name="profile"),
    path("profile/tokens/", pages.token_create, name="token-create"),
    path("profile/tokens/<int:pk>/revoke/", pages.token_revoke, name="token-revoke"),
    path("profile/feeds/rotate/", pages.feeds_rotate, name="feeds-rotate"),
]
