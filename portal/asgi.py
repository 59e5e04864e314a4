"""The portal as an ASGI application: Django for HTTP, Channels for the live websockets.

Run it with daphne (``daphne portal.asgi:application``), as scripts/run and docker-compose do.
"""

import os

import django
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")


class PortalASGIHandler(ASGIHandler):
    """Django's ASGI handler, with the request's middleware and view run in one trip to a thread.

    Every middleware of the portal and every view it serves over HTTP is synchronous. Django's own handler
    still puts an asynchronous step at the foot of the chain, so each request went to a thread for the
    middleware, back to the event loop for that step, and to the thread again for the view: three hand-overs
    where one does (about a tenth more bookings a second through the API at 16 clients: docs/operations.md,
    issue 20's eighth step). The chain is built as WSGI builds it and handed to a thread once; an async view,
    were one added, would still run (Django calls it through async_to_sync from the synchronous chain).
    """

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)
        self._middleware_chain = sync_to_async(self._middleware_chain, thread_sensitive=True)  # type: ignore[has-type]


# Django first: the websocket side imports models.
django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application
django_application = PortalASGIHandler()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from kernel.runtime import freeze_loaded_objects  # noqa: E402
from live.auth import LiveAuthMiddleware  # noqa: E402
from live.outages import LiveOutageGuard  # noqa: E402
from live.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_application,
        # The database or Redis away: the socket closes with words (4503) and the page reconnects (live/outages.py).
        "websocket": LiveOutageGuard(LiveAuthMiddleware(URLRouter(websocket_urlpatterns))),
    }
)

# Loaded: what the server holds from now on for as long as it runs is left out of garbage collection.
freeze_loaded_objects()
