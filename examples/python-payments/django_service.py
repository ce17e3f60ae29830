"""POST /payments with an Idempotency-Key, on the tombstoned client's Django adapter
(clients/python), under waitress: the same service as service.py (FastAPI), the payment row
written by Django's ORM inside the claim's transaction. The app is django_payments/, the
business it shares with service.py is business.py (which lists the environment), and
examples/README.md has the contract the examples share.
"""

from __future__ import annotations

import os

import django
from django.core.wsgi import get_wsgi_application
from waitress.server import create_server

import business


def main() -> None:
    listener = business.listen()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_payments.settings")
    django.setup()
    # A thread per request being served, each with its database session (CONN_MAX_AGE).
    server = create_server(get_wsgi_application(), sockets=[listener], threads=8)
    server.run()


if __name__ == "__main__":
    main()
