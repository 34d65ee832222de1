"""The Django app: ``INSTALLED_APPS = [..., "anarchon.integrations.django"]``."""

from __future__ import annotations

from django.apps import AppConfig


class AnarchonConfig(AppConfig):
    """Checks every key of the ``ANARCHON`` setting when Django starts, connecting to nothing, so
    a mistake fails every process (web workers too) at once rather than the scheduler later."""

    name = "anarchon.integrations.django"
    label = "anarchon"
    verbose_name = "anarchon"

    def ready(self) -> None:
        """Check the settings (:func:`anarchon.integrations.django.check_settings`)."""
        from . import check_settings

        check_settings()
