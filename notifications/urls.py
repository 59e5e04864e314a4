from django.urls import path

from notifications.pages import mail_preferences

urlpatterns = [
    path("profile/mail/", mail_preferences, name="mail-preferences"),
]
