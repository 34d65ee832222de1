"""The registry: which instances run, which jobs they carry, and where their definitions differ.

Every running :class:`~anarchon.Scheduler` records itself in its backend (an
:class:`InstanceRecord`) every ``heartbeat_ms``. Anyone with the backend's URL can read the
picture back as a :class:`ClusterView` (``await scheduler.cluster()``, ``anarchon instances``,
``anarchon jobs``, the dashboard).

One rule decides which records are live (:func:`is_live`): a record not refreshed for
:data:`SILENT_HEARTBEATS` of its own heartbeat intervals is not, whatever the backend. Every view
leaves such records out of its instances (they are listed apart, in :attr:`ClusterView.silent`),
so an instance killed with ``kill -9`` stops counting as live at the same moment for every
reader, even when no live instance is left to remove its record; the next live instance's
heartbeat removes it from the store.

A record is small (version 2, about 320 bytes): the instance's own fields, the number of jobs it
carries and the sha256 ``definitions`` digest of the set of their :class:`JobDefinition`. Each
set is saved once per digest, compressed, beside the records (:func:`record_instance`), and
read back once per digest by each reader (:func:`read_instances`), so a heartbeat of 100 000
jobs writes a few hundred bytes. Version 1 records (the definitions inline) are still read.

A backend offers the registry through :meth:`anarchon.backend.Backend.registry`, which returns a
:class:`RegistryStore`: one record per instance, written whole, and definition sets as opaque
bytes under their digest. Nothing in the claim path reads or waits on the registry.

Times in the records are epoch milliseconds on the backend's clock as the writing instance
measured it (its wall clock plus its measured clock offset).
"""

from __future__ import annotations

# This module's names are defined in two private modules, neither of which imports this one:
# the records and their storage (anarchon._records) and the cluster's views built from them
# (anarchon._cluster). The names outside __all__ are re-exported with "as" for type checkers.
from ._cluster import (
    DESCRIBE_BATCH,
    DESCRIBE_READS,
    RECENT_RUNS,
    ClusterView,
    Drift,
    JobView,
    build_view,
    carrier_warning,
    describe_jobs,
    latest_runs,
    split_live,
    trigger_refusal,
)
from ._records import READABLE_VERSIONS as READABLE_VERSIONS
from ._records import RECHECK_S as RECHECK_S
from ._records import RECORD_VERSION as RECORD_VERSION
from ._records import SILENT_HEARTBEATS as SILENT_HEARTBEATS
from ._records import (
    InstanceRecord,
    JobDefinition,
    OptionValue,
    RegistryStore,
    decode_definitions,
    encode_definitions,
    is_live,
    read_instances,
    record_instance,
)
from ._records import logger as logger

__all__ = [
    "DESCRIBE_BATCH",
    "DESCRIBE_READS",
    "RECENT_RUNS",
    "ClusterView",
    "Drift",
    "InstanceRecord",
    "JobDefinition",
    "JobView",
    "OptionValue",
    "RegistryStore",
    "build_view",
    "carrier_warning",
    "decode_definitions",
    "describe_jobs",
    "encode_definitions",
    "is_live",
    "latest_runs",
    "read_instances",
    "record_instance",
    "split_live",
    "trigger_refusal",
]
