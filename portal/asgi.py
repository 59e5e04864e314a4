"""The portal as an ASGI application: Django for HTTP, Channels for the live websockets.

Run it with daphne (``daphne portal.asgi:application``), as scripts/run and docker-compose do.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

# Django first: the websocket side imports models.
django_application = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from live.auth import LiveAuthMiddleware  # noqa: E402
from live.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_application,
        "websocket": LiveAuthMiddleware(URLRouter(websocket_urlpatterns)),
    }
)
