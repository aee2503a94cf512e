from django.urls import path

from .consumers import ChatConsumer

# The page learns it from the server (chat/pages/page_constants.py).
WS_PATH = "/ws/chat/"

websocket_urlpatterns = [path(WS_PATH.removeprefix("/"), ChatConsumer.as_asgi())]
