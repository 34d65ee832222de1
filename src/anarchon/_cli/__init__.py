"""The ``anarchon`` command's parts: :mod:`anarchon.cli` parses the command line and calls them.

``common`` opens backends without creating anything; ``output`` prints for people (text from
the backend escaped, tables in 100 columns); ``cluster`` has ``jobs`` and ``instances``;
``steer`` has ``explain``, ``pause``, ``resume`` and ``trigger``.
"""
