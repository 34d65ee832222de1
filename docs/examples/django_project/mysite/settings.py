"""Settings of the Django guide's example project: PostgreSQL when ``POSTGRES_DB`` is set (claims
and history then live in the same database, schema ``anarchon``), else SQLite."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS: list[str] = []
ROOT_URLCONF = "mysite.urls"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "anarchon.integrations.django",
    "reports",
]

DATABASES: dict[str, dict[str, Any]]
ANARCHON: dict[str, Any]

if os.environ.get("POSTGRES_DB"):
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ["POSTGRES_DB"],
            "HOST": os.environ.get("POSTGRES_HOST", "127.0.0.1"),
            "PORT": os.environ.get("POSTGRES_PORT", "5432"),
            "USER": os.environ.get("POSTGRES_USER", ""),
            "PASSWORD": os.environ.get("POSTGRES_PASSWORD", ""),
            "OPTIONS": {"application_name": "mysite"},
        }
    }
    # Reuse the database above; anarchon's eight tables go into a schema of their own.
    ANARCHON = {"database": "default", "backend_options": {"schema": "anarchon"}}
else:
    DATABASES = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3"}
    }
    # anarchon's own SQLite file (not Django's), at one absolute path for every process.
    ANARCHON = {"backend": f"sqlite:///{BASE_DIR / 'anarchon.db'}"}
