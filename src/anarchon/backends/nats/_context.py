"""What the parts of one NATS backend share: the connection, the duplicate window and the
subject prefix, built once by the backend and handed to each part that works on the stream."""

from __future__ import annotations

from dataclasses import dataclass

from ._connection import Connection
from ._window import Window

__all__ = ["Context"]


@dataclass(frozen=True, slots=True)
class Context:
    """One backend's stream access: its :class:`~._connection.Connection`, its
    :class:`~._window.Window` and its subject prefix (``<prefix><job>.claims``)."""

    connection: Connection
    window: Window
    prefix: str
