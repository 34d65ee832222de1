"""``python -m anarchon`` is the ``anarchon`` command.

SIGINT and SIGTERM are caught before this module runs: Python imports the package first, and the
package's first import (:mod:`anarchon._early`) catches them in this process, so a deploy's
SIGTERM during the seconds the imports take ends ``anarchon run`` the documented way (exit 0).
"""

from __future__ import annotations

from .cli import main

main()
