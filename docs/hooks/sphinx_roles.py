"""A griffe extension for the API reference: the docstrings' Sphinx roles become cross-references.

anarchon's docstrings are written in reST (``docstring_style: sphinx``). mkdocstrings parses
their ``:param:`` fields but prints inline roles such as ``:class:`~anarchon.SQLiteBackend```
as they are. This extension rewrites, in every docstring of the package, each
``:class:``, ``:meth:``, ``:func:``, ``:attr:``, ``:data:``, ``:mod:``, ``:exc:``, ``:obj:``
and ``:const:`` role into a mkdocstrings cross-reference, resolved the way Sphinx reads it:

- ``~a.b.c`` shows ``c``; an explicit title (``:meth:`title <target>```) shows the title;
  ``!target`` shows the target and links nowhere;
- a dotted name starting with ``anarchon`` is absolute; a name starting with a dot is looked up
  from the docstring's module and its packages; any other name from the docstring's own scope
  outwards (a method's ``:meth:`start``` is its class's ``start``, inherited members count);
  failing that, as an export of ``anarchon``, then as the one object of the package whose path
  ends with the name (Sphinx's own last resort).

A target the reference can show (a path without private parts whose every step is public, an
export such as ``anarchon.Scheduler`` for ``anarchon._scheduler.Scheduler``) becomes a plain
cross-reference: ``mkdocs build --strict`` fails when no page of the reference shows it, so a
docstring cannot point at nothing. Any other target of anarchon (a private constant) becomes an
optional cross-reference, code with its path on hover. A name outside anarchon
(``asyncio.Task``), a ``!target`` or one that resolves to nothing becomes code.

mkdocs.yml loads it (``plugins: mkdocstrings: handlers: python: options: extensions``).
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLES = ("class", "meth", "func", "attr", "data", "mod", "exc", "obj", "const")
ROLE = re.compile(r":(?:py:)?(?P<role>" + "|".join(ROLES) + r"):`(?P<body>[^`]+)`")
TITLED = re.compile(r"(?P<title>.*?)\s*<(?P<target>[^<>]+)>", re.S)
FENCE = re.compile(r"^(\s*)(```|~~~)")
PACKAGE = "anarchon"


def _member(obj: griffe.Object | griffe.Alias, name: str) -> griffe.Object | griffe.Alias | None:
    """``obj``'s member ``name``, inherited ones included for a class."""
    try:
        members = obj.all_members if obj.is_class else obj.members
        return members.get(name)
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def _lookup(collection: griffe.ModulesCollection, path: str) -> griffe.Object | griffe.Alias | None:
    first, *rest = path.split(".")
    found: griffe.Object | griffe.Alias | None = collection.members.get(first)
    for name in rest:
        if found is None:
            return None
        found = _member(found, name)
    return found


def _existing(collection: griffe.ModulesCollection, path: str) -> str | None:
    """``path`` when it names an object (through re-exports and inheritance), else None."""
    return path if _lookup(collection, path) is not None else None


def _public(collection: griffe.ModulesCollection, path: str) -> bool:
    """Whether the reference can show ``path``: no private part, and each member on the way is
    public as griffe sees it (a module with ``__all__`` exports only what it lists)."""
    first, *rest = path.split(".")
    if first != PACKAGE or any(p.startswith("_") for p in rest):
        return False
    found: griffe.Object | griffe.Alias | None = collection.members.get(first)
    for name in rest:
        found = None if found is None else _member(found, name)
        if found is None or not found.is_public:
            return False
    return True


def public_path(collection: griffe.ModulesCollection, path: str) -> str | None:
    """A path the reference can show that names the same object as ``path``: ``path`` itself,
    an export such as ``anarchon.Scheduler`` or one made of its parent's; None when none."""
    found = _lookup(collection, path)
    if found is None:
        return None
    if _public(collection, path):
        return path
    try:
        target = found.final_target if isinstance(found, griffe.Alias) else found
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None
    named = sorted((p for p in [target.path, *target.aliases] if _public(collection, p)), key=len)
    if named:
        return str(named[0])
    if target.parent is None:
        return None
    parent = public_path(collection, target.parent.path)
    if parent is None or not _public(collection, f"{parent}.{target.name}"):
        return None
    return f"{parent}.{target.name}"


def _canonical(collection: griffe.ModulesCollection, path: str) -> str:
    """Where the object ``path`` names is defined (``path`` when that cannot be told)."""
    found = _lookup(collection, path)
    try:
        return path if found is None else str(found.canonical_path)
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return path


def _in_scope(obj: griffe.Object, name: str) -> str | None:
    """The path ``name`` has from ``obj``'s scope outwards: its members (a class's inherited
    ones too), then its parents' (a method's ``start`` is its class's ``start``)."""
    scope: griffe.Object | None = obj
    while scope is not None:
        found = _member(scope, name)
        if found is not None:
            return str(found.target_path if found.is_alias else found.path)  # type: ignore[union-attr]
        if scope.parent is not None and name == scope.parent.name and not scope.parent.is_module:
            return str(scope.parent.path)
        scope = scope.parent
    return None


def _by_suffix(obj: griffe.Object, target: str, collection: griffe.ModulesCollection) -> str | None:
    """The one object of ``obj``'s package whose path ends with ``.target``, as Sphinx looks
    up a name it finds nowhere else; None when there is not exactly one."""
    package = obj.module
    while package.parent is not None and package.parent.is_package:
        package = package.parent  # type: ignore[assignment]
    found = {
        path
        for o in _walk(package, set())
        if o.path.endswith("." + target) and (path := _existing(collection, o.path))
    }
    return found.pop() if len(found) == 1 else None


def resolve(obj: griffe.Object, target: str, collection: griffe.ModulesCollection) -> str | None:
    """A path of the object ``target`` names as written in ``obj``'s docstring, or None."""
    if target.startswith("."):
        # From the docstring's module outwards: `._control` in anarchon.backends.nats.
        module: griffe.Object | None = obj.module
        name = target.lstrip(".")
        while module is not None:
            found = _existing(collection, f"{module.path}.{name}")
            if found:
                return found
            module = module.parent
        return _by_suffix(obj, name, collection)
    if target == PACKAGE or target.startswith(PACKAGE + "."):
        return _existing(collection, target)
    first, _, rest = target.partition(".")
    start = _in_scope(obj, first)
    if start is not None:
        found = _existing(collection, f"{start}.{rest}" if rest else start)
        if found:
            return found
    # What anarchon exports (`Scheduler.health` in a module that does not import Scheduler),
    # then any one object of the package with that name.
    return _existing(collection, f"{PACKAGE}.{target}") or _by_suffix(obj, target, collection)


def convert(text: str, obj: griffe.Object, collection: griffe.ModulesCollection) -> str:
    """``text`` with every role outside a fenced code block made a cross-reference."""
    out: list[str] = []
    fenced = ""
    chunk: list[str] = []

    def flush() -> None:
        if chunk:
            out.append(ROLE.sub(lambda m: _reference(m, obj, collection), "".join(chunk)))
            chunk.clear()

    for line in text.splitlines(keepends=True):
        fence = FENCE.match(line)
        if fenced:
            out.append(line)
            if fence and fence.group(2) == fenced:
                fenced = ""
        elif fence:
            flush()
            fenced = fence.group(2)
            out.append(line)
        else:
            chunk.append(line)
    flush()
    return "".join(out)


def _reference(
    match: re.Match[str], obj: griffe.Object, collection: griffe.ModulesCollection
) -> str:
    body = " ".join(match.group("body").split())
    titled = TITLED.fullmatch(body)
    if titled:
        title, target = titled.group("title"), "".join(titled.group("target").split())
    else:
        body = "".join(body.split())  # a target broken over two lines
        target = body.lstrip("~!")
        title = target.rsplit(".", 1)[-1] if body.startswith("~") else target.lstrip(".")
    if body.startswith("!"):
        return f"`{title}`"
    path = resolve(obj, target.lstrip("~"), collection)
    if path is None:
        return f"`{title}`"
    shown = public_path(collection, path)
    if shown is not None:
        return f"[`{title}`][{shown}]"
    code = f"<code>{html.escape(title)}</code>"
    identifier = html.escape(_canonical(collection, path))
    return f'<autoref identifier="{identifier}" optional>{code}</autoref>'


def _walk(obj: griffe.Object, seen: set[str]) -> Any:
    if obj.path in seen:
        return
    seen.add(obj.path)
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member, seen)  # type: ignore[arg-type]


class SphinxRoles(griffe.Extension):
    """Rewrite the Sphinx roles of every docstring in anarchon once the package is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Rewrite the roles of ``pkg``'s docstrings when ``pkg`` is anarchon."""
        if pkg.name != PACKAGE:
            return
        for obj in _walk(pkg, set()):
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = convert(obj.docstring.value, obj, loader.modules_collection)
