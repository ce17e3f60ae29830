"""The test apps under real servers, each in a thread of this process on a port of its own:
the FastAPI app under uvicorn, the Django app under waitress (a production WSGI server)."""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass

from support import PATIENCE


@dataclass(frozen=True)
class Running:
    """A server: its base URL, and the application_name of its database sessions."""

    name: str
    base: str
    application_name: str


class Uvicorn:
    def __init__(self) -> None:
        import uvicorn

        from fastapi_app import APPLICATION_NAME, make_app

        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.server = uvicorn.Server(
            uvicorn.Config(make_app(), log_level="warning", access_log=False, lifespan="on")
        )
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True
        )
        port = self.socket.getsockname()[1]
        self.running = Running("fastapi", f"http://127.0.0.1:{port}", APPLICATION_NAME)

    def __enter__(self) -> Running:
        self.thread.start()
        deadline = time.monotonic() + PATIENCE
        while not self.server.started:  # the lifespan (the pool's opening) done, serving
            assert self.thread.is_alive(), "uvicorn stopped while starting"
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        return self.running

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(PATIENCE)


class Waitress:
    def __init__(self) -> None:
        import django
        from django.core.wsgi import get_wsgi_application
        from waitress.server import TcpWSGIServer, create_server

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_app.settings")
        django.setup()
        from django_app.settings import APPLICATION_NAME

        server = create_server(
            get_wsgi_application(), host="127.0.0.1", port=0, threads=10, channel_timeout=60
        )
        assert isinstance(server, TcpWSGIServer)
        self.server = server
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        port = server.getsockname()[1]
        self.running = Running("django", f"http://127.0.0.1:{port}", APPLICATION_NAME)

    def __enter__(self) -> Running:
        self.thread.start()  # the socket listens already: requests queue until it runs
        return self.running

    def __exit__(self, *exc: object) -> None:
        self.server.close()
        self.thread.join(PATIENCE)
