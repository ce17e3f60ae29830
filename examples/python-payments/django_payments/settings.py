"""The app's settings: the database from DATABASE_URL (business.py lists the environment)."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

import business

_url = conninfo_to_dict(business.DATABASE_URL)
_named = {"dbname": "NAME", "user": "USER", "password": "PASSWORD", "host": "HOST", "port": "PORT"}

SECRET_KEY = "not-used: no sessions, no signing"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = ["django_payments"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "django_payments.urls"
USE_TZ = True
DATA_UPLOAD_MAX_MEMORY_SIZE = business.MAX_BODY_BYTES
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        **{_named[k]: v for k, v in _url.items() if k in _named},
        # A session per server thread, kept; the sessions' other parameters as given.
        "CONN_MAX_AGE": None,
        "OPTIONS": {
            **{k: v for k, v in _url.items() if k not in _named},
            "application_name": "payments-django",
        },
    }
}
