"""The backend contract, call by call (anarchon/backend.py), on every backend's real service:
the shipped suite, :mod:`anarchon.testing.contract`, run through each backend's harness."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from anarchon import Backend
from anarchon.testing.contract import LeaseBackendContract
from tests.harness import Namespace


class TestContract(LeaseBackendContract):
    """Every backend; brokers skip the lease classes' tests."""

    control_required = True
    notices_required = True

    @pytest.fixture
    def backend_factory(self, ns: Namespace) -> Callable[[], Backend]:
        return ns.make
