"""The registry of the in-memory backend: a dict per backend object, shared by every scheduler
that shares the object (one process)."""

from __future__ import annotations

from anarchon.registry import InstanceRecord

__all__ = ["MemoryRegistry"]


class MemoryRegistry:
    """A :class:`~anarchon.registry.RegistryStore` in a dict; every step is atomic (one event
    loop, no await inside a step)."""

    def __init__(self) -> None:
        self._records: dict[str, InstanceRecord] = {}
        self._recorded = False

    async def record(self, instance: InstanceRecord) -> None:
        """See :meth:`anarchon.registry.RegistryStore.record`."""
        self._records[instance.id] = instance
        self._recorded = True

    async def instances(self) -> list[InstanceRecord]:
        """See :meth:`anarchon.registry.RegistryStore.instances`."""
        return list(self._records.values())

    async def exists(self) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.exists`."""
        return self._recorded

    async def remove(self, instance_id: str) -> None:
        """See :meth:`anarchon.registry.RegistryStore.remove`."""
        self._records.pop(instance_id, None)

    async def remove_silent(self, cutoff_ms: int) -> list[str]:
        """See :meth:`anarchon.registry.RegistryStore.remove_silent`."""
        silent = [i for i, r in self._records.items() if r.heartbeat_ms < cutoff_ms]
        for instance_id in silent:
            del self._records[instance_id]
        return silent
