"""No pages: the example is about jobs."""

from __future__ import annotations

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
