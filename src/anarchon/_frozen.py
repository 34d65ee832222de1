"""Records built fast: a maker for a slotted dataclass, frozen or not.

The records a claim passes around (:class:`~anarchon.backend.ClaimRequest`,
:class:`~anarchon.backend.Ticket`, :class:`~anarchon.Run`, ...) are frozen dataclasses. Their
generated ``__init__`` sets each field through ``object.__setattr__`` (a call with an argument
tuple per field, past the class's frozen ``__setattr__``): 1.5 to 3 us for a record of a dozen
fields, and a burst of 10 000 slots builds five of them per slot. :func:`maker` gives a
function with the class's own signature that fills a mutable twin of the class (the same slots,
the same base) with plain attribute stores and then makes it an instance of the class: the same
object ``cls(...)`` gives (equal, same repr and hash, frozen, picklable), about three times as
fast. For a mutable class (the executor's :class:`~anarchon._active.ActiveRun`, one per run) it
stores into a bare instance of the class itself, skipping the class call and ``__init__``:
about half the time of ``cls(...)``. The classes themselves are unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

__all__ = ["maker"]

P = ParamSpec("P")
T = TypeVar("T")


def maker(cls: Callable[P, T]) -> Callable[P, T]:
    """A function that builds ``cls`` (a dataclass with ``slots=True``, frozen or not, whose
    fields are all set by its ``__init__``, with plain defaults and no ``__post_init__``) from
    the same arguments as ``cls(...)``."""
    if not (
        isinstance(cls, type)
        and dataclasses.is_dataclass(cls)
        and "__slots__" in cls.__dict__
        and not hasattr(cls, "__post_init__")
    ):
        raise TypeError(f"{cls!r} is not a slotted dataclass without __post_init__")
    namespace: dict[str, Any] = {"_cls": cls}
    if cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        # The same layout as ``cls``: its base, its slots; the base's frozen __setattr__ and
        # __delattr__ (one slot of the type) and __init__ replaced by object's plain ones.
        namespace["_new"] = type(
            f"_{cls.__name__}Draft",
            cls.__bases__,
            {
                "__slots__": cls.__dict__["__slots__"],
                "__init__": object.__init__,
                "__setattr__": object.__setattr__,
                "__delattr__": object.__delattr__,
            },
        )
        begin, end = "    self = _new()\n", "    self.__class__ = _cls\n"
    else:  # stores into the class's own bare instance
        namespace["_new"] = object.__new__
        begin, end = "    self = _new(_cls)\n", ""
    positional: list[str] = []
    keyword: list[str] = []
    stores: list[str] = []
    for f in dataclasses.fields(cls):
        if not f.init or f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: only fields set by __init__, plain defaults")
        param = f.name
        if f.default is not dataclasses.MISSING:
            namespace[f"_default_{f.name}"] = f.default
            param += f"=_default_{f.name}"
        (keyword if f.kw_only else positional).append(param)
        stores.append(f"    self.{f.name} = {f.name}\n")
    params = ", ".join(positional + (["*", *keyword] if keyword else []))
    source = f"def make_{cls.__name__}({params}):\n{begin}{''.join(stores)}{end}    return self\n"
    exec(source, namespace)  # the source is made above from the field names
    made: Callable[P, T] = namespace[f"make_{cls.__name__}"]
    made.__qualname__ = made.__name__ = f"make_{cls.__name__}"
    made.__doc__ = f"Build a {cls.__name__} as {cls.__name__}(...) does (see anarchon._frozen)."
    return made
