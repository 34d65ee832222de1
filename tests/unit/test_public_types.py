"""Every type the public API takes or hands out can be named in typed code (mypy --strict).

The public names are those in the ``__all__`` of ``anarchon`` and of every module whose path
has no part starting with ``_`` (``anarchon.backend``, ``anarchon.kit.*``, ``anarchon.testing*``,
the integrations ...). For each of them (a function, a class with its fields, methods and
properties, its anarchon bases' too, a module constant, a type alias), the annotations are
resolved (:func:`typing.get_type_hints`) and every type in them, its arguments recursively, must
be a builtin, standard library or third-party type, or an anarchon type that some public module
lists in its ``__all__`` (mypy --strict imports only what a module exports). An anarchon type
reached this way is walked in turn, exported or not.

A ``Literal`` alias (``ObservedState = Literal[...]``) resolves to the ``Literal`` itself: it is
matched to the aliases anarchon's modules define, by identity, else by equality (the same
values); one that only a private module or a private name holds is an offender. A ``Literal``
written out in a signature is its own name.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import sys
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.public_modules import module_names

# Dunder methods whose types a user meets (the rest are the data model's, typed by typeshed).
DUNDERS = frozenset({"__init__", "__call__", "__enter__", "__aenter__", "__iter__", "__aiter__"})
# (where, type): a public name's annotation that may name a private type, and why.
EXEMPT = {
    # The scheduler's own way to build the snapshot it hands out (users receive a Metrics).
    "anarchon.Metrics.of(counters)": "anarchon._metrics.Counters",
}
CHECKING = ("TYPE_CHECKING", "typing.TYPE_CHECKING")
# Forms that name themselves (typing's special forms, not classes).
FORMS = (typing.Any, typing.NoReturn, typing.Never, typing.Self, typing.LiteralString)


def public_modules() -> list[types.ModuleType]:
    return [importlib.import_module(name) for name in module_names()]


def exported(modules: list[types.ModuleType]) -> Iterator[tuple[str, object]]:
    """``(module.name, value)`` for each name in each public module's ``__all__``."""
    for module in modules:
        for name in getattr(module, "__all__", ()):
            yield f"{module.__name__}.{name}", getattr(module, name)


def is_alias(value: object) -> bool:
    """A type alias's value: a subscripted generic or ``Literal``, a union."""
    return typing.get_origin(value) is not None and not isinstance(value, type)


@functools.cache
def typing_namespace(module_name: str) -> dict[str, Any]:
    """The module's globals with what it imports ``if TYPE_CHECKING:`` (the names its
    annotations use that a type checker sees, and the running program does not)."""
    module = sys.modules[module_name]
    namespace = dict(vars(module))
    tree = ast.parse(Path(module.__file__ or "").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) in CHECKING:
            block = ast.Module(body=node.body, type_ignores=[])
            exec(compile(block, module.__file__ or "", "exec"), namespace)
    return namespace


@functools.cache
def checker_only_names() -> dict[str, Any]:
    """Every name an anarchon module imports only for the type checker: an alias of one module
    used in another's annotation may name them (``TokenCheck``: ``Request``)."""
    found: dict[str, Any] = {}
    for name, module in list(sys.modules.items()):
        if module is not None and name.split(".")[0] == "anarchon" and hasattr(module, "__file__"):
            namespace = typing_namespace(name)
            found.update({k: v for k, v in namespace.items() if k not in vars(module)})
    return found


def private_aliases(public: dict[int, str]) -> list[tuple[str, object]]:
    """Module-level type aliases of anarchon that no public module exports."""
    found = []
    for module_name, module in sorted(sys.modules.items()):
        if module is None or not (module_name == "anarchon" or module_name.startswith("anarchon.")):
            continue
        for name, value in vars(module).items():
            if is_alias(value) and id(value) not in public:
                found.append((f"{module_name}.{name}", value))
    return found


class Walk:
    """The walk of the public names' annotations, and what it found that cannot be named."""

    def __init__(self) -> None:
        modules = public_modules()
        self.public: dict[int, str] = {}
        self.public_aliases: list[tuple[str, object]] = []
        for where, value in exported(modules):
            self.public.setdefault(id(value), where)
            if is_alias(value):
                self.public_aliases.append((where, value))
        self.private_aliases = private_aliases(self.public)
        self.modules = modules
        self.seen: set[int] = set()
        self.offenders: dict[str, set[str]] = {}

    def offend(self, name: str, where: str) -> None:
        self.offenders.setdefault(name, set()).add(where)

    def run(self) -> dict[str, set[str]]:
        for where, value in exported(self.modules):
            if inspect.isclass(value):
                self.walk_class(value)
            elif inspect.isfunction(value):
                self.walk_callable(where, value)
            elif is_alias(value):  # resolved: an alias may quote a name (TokenCheck)
                home = where.rpartition(".")[0]
                for hint in self.hints(where, {"alias": value}, home).values():
                    self.check(hint, where)
        for module in self.modules:
            annotations = getattr(module, "__annotations__", {})
            for name in getattr(module, "__all__", ()):
                # Final: the value's type; TypeAlias: the value is a type, walked above.
                if name in annotations and annotations[name] not in ("Final", "TypeAlias"):
                    where = f"{module.__name__}.{name}"
                    for hint in self.hints(where, {name: annotations[name]}, module.__name__):
                        self.check(hint, where)
        return self.offenders

    def hints(self, where: str, annotations: dict[str, Any], module: str) -> dict[str, Any]:
        """``annotations`` resolved in ``module``'s namespace as a type checker sees it, one at
        a time: each one that does not resolve is reported."""
        resolved = {}
        for name, annotation in annotations.items():
            # A class of one annotation: get_type_hints takes ClassVar and Final there.
            holder = type("Holder", (), {"__annotations__": {name: annotation}})
            namespace = {**checker_only_names(), **typing_namespace(module)}
            try:
                hints = typing.get_type_hints(holder, namespace, include_extras=True)
            except Exception as exc:  # every unresolvable annotation is reported, not the first
                self.offend(f"unresolvable annotation {annotation!r}: {exc}", where)
                continue
            resolved[name] = hints[name]
        return resolved

    def walk_callable(self, where: str, function: Callable[..., object]) -> None:
        annotations = getattr(function, "__annotations__", {})
        for name, hint in self.hints(where, annotations, function.__module__).items():
            if not name.startswith("_"):  # a private field in a dataclass's __init__
                self.check(hint, f"{where}({name})" if name != "return" else f"{where} ->")

    def walk_class(self, cls: type) -> None:
        if id(cls) in self.seen or not cls.__module__.startswith("anarchon"):
            return
        self.seen.add(id(cls))
        where = self.public.get(id(cls)) or f"{cls.__module__}.{cls.__qualname__}"
        for base in cls.__mro__:
            if base.__module__.startswith("anarchon"):
                annotations = inspect.get_annotations(base)
                public = {k: v for k, v in annotations.items() if not k.startswith("_")}
                for name, hint in self.hints(where, public, base.__module__).items():
                    self.check(hint, f"{where}.{name}")
                for attr, member in vars(base).items():
                    if not attr.startswith("_") or attr in DUNDERS:
                        for function in functions_of(member):
                            self.walk_callable(f"{where}.{attr}", function)
                        if inspect.isclass(member):
                            self.walk_class(member)

    def check(self, hint: Any, where: str) -> None:
        """Every type in ``hint`` can be named; an anarchon class is walked in turn."""
        if hint is None or hint is type(None) or hint is Ellipsis or any(hint is f for f in FORMS):
            return
        if isinstance(hint, list | tuple):  # Callable's parameters
            for arg in hint:
                self.check(arg, where)
        elif isinstance(hint, str | typing.ForwardRef):
            self.offend(f"unresolved {hint!r}", where)
        elif isinstance(hint, typing.TypeVar):
            for arg in (hint.__bound__, *hint.__constraints__):
                self.check(arg, where)
        elif isinstance(hint, dataclasses.InitVar):
            self.check(hint.type, where)
        elif typing.get_origin(hint) is not None:
            self.check_generic(hint, where)
        elif hasattr(hint, "__supertype__"):  # typing.NewType
            self.check_named(hint, where)
            self.check(hint.__supertype__, where)
        elif inspect.isclass(hint):
            if EXEMPT.get(where) != f"{hint.__module__}.{hint.__qualname__}":
                self.check_named(hint, where)
                self.walk_class(hint)
        elif not isinstance(hint, typing.ParamSpec | typing.ParamSpecArgs | typing.ParamSpecKwargs):
            self.offend(f"unknown annotation {hint!r}", where)

    def check_generic(self, hint: Any, where: str) -> None:
        """A subscripted form: ``Literal``, ``Annotated``, a generic, a union ..."""
        origin = typing.get_origin(hint)
        if origin is typing.Annotated:
            self.check(hint.__origin__, where)
        elif origin is typing.ClassVar or origin is typing.Final:
            self.check(typing.get_args(hint)[0], where)
        elif origin is typing.Literal:
            self.check_literal(hint, where)
        else:
            private = self.private_alias_of(hint)
            if private is not None:
                self.offend(private, where)
            if inspect.isclass(origin):  # not Union, Unpack
                self.check(origin, where)
            for arg in typing.get_args(hint):
                self.check(arg, where)

    def check_named(self, hint: Any, where: str) -> None:
        """A class (or NewType) is the standard library's, a third party's, or exported."""
        if not hint.__module__.startswith("anarchon") or id(hint) in self.public:
            return
        outer, _, _ = hint.__qualname__.partition(".")
        owner = getattr(sys.modules.get(hint.__module__), outer, None)
        if owner is not hint and id(owner) in self.public:  # a class nested in a public one
            return
        self.offend(f"{hint.__module__}.{hint.__qualname__}", where)

    def check_literal(self, hint: Any, where: str) -> None:
        """A Literal alias is exported; a Literal of enum members names its enum."""
        for arg in typing.get_args(hint):
            if not isinstance(arg, str | int | bool | bytes | None):
                self.check(type(arg), where)
        private = self.private_alias_of(hint)
        if private is not None:
            self.offend(private, where)

    def private_alias_of(self, hint: Any) -> str | None:
        """The private alias ``hint`` is (when no public one is), by identity, else for a
        ``Literal`` by equality."""
        for match in (operator_is, literal_equal):
            if any(match(hint, value) for _, value in self.public_aliases):
                return None
            names = [name for name, value in self.private_aliases if match(hint, value)]
            if names:
                return f"private alias {' = '.join(names)}"
        return None


def operator_is(hint: object, value: object) -> bool:
    return hint is value


def literal_equal(hint: object, value: object) -> bool:
    return (
        typing.get_origin(hint) is typing.Literal
        and typing.get_origin(value) is typing.Literal
        and hint == value
    )


def functions_of(member: object) -> list[Callable[..., object]]:
    """The functions behind a class attribute: a method, a property's accessors, a
    cached_property's, a pytest fixture's."""
    if isinstance(member, classmethod | staticmethod):
        member = member.__func__
    if isinstance(member, property):
        return [f for f in (member.fget, member.fset) if f is not None]
    if isinstance(member, functools.cached_property):
        return [member.func]
    if not inspect.isfunction(member) and callable(member):
        member = inspect.unwrap(member)
    return [member] if inspect.isfunction(member) else []


def test_the_walk_covers_the_public_modules() -> None:
    names = module_names()
    for name in (
        "anarchon.backend",
        "anarchon.control",
        "anarchon.errors",
        "anarchon.explain",
        "anarchon.health",
        "anarchon.integrations.django",
        "anarchon.integrations.starlette",
        "anarchon.kit.lease",
        "anarchon.logs",
        "anarchon.prometheus",
        "anarchon.registry",
        "anarchon.steering",
        "anarchon.testing",
        "anarchon.testing.contract",
    ):
        assert name in names
    assert not [name for name in names if "._" in name]


def test_every_public_type_can_be_named() -> None:
    walk = Walk()
    offenders = walk.run()
    assert len(walk.seen) > 90
    report = [f"{name}\n    in {', '.join(sorted(places))}" for name, places in offenders.items()]
    assert not offenders, f"{len(offenders)} types cannot be named:\n" + "\n".join(sorted(report))


def test_the_walk_finds_a_private_alias_and_a_private_class() -> None:
    walk = Walk()
    walk.private_aliases.append(("anarchon._hidden.Mode", typing.Literal["a", "b"]))
    walk.check(typing.Optional[typing.Literal["b", "a"]], "x")  # noqa: UP045  (as resolved)
    assert walk.offenders == {"private alias anarchon._hidden.Mode": {"x"}}

    class Hidden:
        pass

    Hidden.__module__ = "anarchon._hidden"
    walk.offenders.clear()
    walk.check(list[Hidden], "y")
    assert "anarchon._hidden" in next(iter(walk.offenders))
