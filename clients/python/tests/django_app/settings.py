"""The Django test app's settings, from the suite's variables."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

from support import SERVICE_URL

APPLICATION_NAME = "py-django-tests"
_db = conninfo_to_dict(SERVICE_URL)

SECRET_KEY = "tombstoned-tests"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = ["django_app"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "django_app.urls"
USE_TZ = True
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname"),
        "USER": _db.get("user"),
        "PASSWORD": _db.get("password"),
        "HOST": _db.get("host"),
        "PORT": _db.get("port"),
        # A session per server thread, kept; and a transaction per request, which idempotent()
        # views must not be inside.
        "CONN_MAX_AGE": None,
        "ATOMIC_REQUESTS": True,
        "OPTIONS": {"application_name": APPLICATION_NAME},
    }
}
