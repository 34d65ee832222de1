"""The ``anarchon`` command's parts: :mod:`anarchon.cli` parses the command line and calls them.

``common`` opens backends without creating anything and formats tables; ``cluster`` has
``jobs`` and ``instances``; ``steer`` has ``explain``, ``pause``, ``resume`` and ``trigger``.
"""
