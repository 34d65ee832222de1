"""The ``anarchon`` command's parts: :mod:`anarchon.cli` parses the command line and calls them.

``common`` opens backends without creating anything; ``output`` prints for people (text from
the backend escaped, tables in 100 columns); ``run`` runs a Scheduler (and its metrics server);
``history`` has ``history`` and ``next``; ``cluster`` has ``jobs`` and ``instances``; ``health``
has ``health``; ``steer`` has ``explain``, ``pause``, ``resume`` and ``trigger``; ``requests``
has ``requests`` and ``cancel``. ``dashboard`` is :mod:`anarchon.web._command`'s, ``demo``
:mod:`anarchon._demo`'s.
"""
