"""The Prometheus text exposition format (0.0.4), written by anarchon itself: the families of a
scrape (:mod:`anarchon._families`) as the text a ``/metrics`` answer carries, each value
written once per render.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ._families import Labels, _Family


def _escape(value: str) -> str:
    """A label value as the text format writes it."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _number(value: float) -> str:
    """A sample's value as the text format writes it: whole numbers without a fraction."""
    if type(value) is int:
        return str(value)
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


class _Numbers(dict[float, str]):
    """Values to their text, each written once per render (most counts are 0 or repeat)."""

    def __missing__(self, value: float) -> str:
        text = self[value] = _number(value)
        return text


def _labels(pairs: Labels) -> str:
    """Label pairs as the text format writes them inside braces, comma-separated."""
    return ",".join(f'{name}="{_escape(value)}"' for name, value in pairs)


def _text(families: Sequence[_Family], jobs: Sequence[str]) -> str:
    """The text format (0.0.4) of ``families``, ``jobs`` naming the per-job values."""
    job_labels = [f'anarchon_job="{_escape(name)}"' for name in jobs]
    numbers = _Numbers()
    parts: list[str] = []
    add = parts.append
    for family in families:
        exposed = family.name + ("_total" if family.kind == "counter" else "")
        if family.kind == "info":
            exposed, kind = family.name + "_info", "gauge"
        else:
            kind = family.kind
        help = family.help.replace("\\", "\\\\").replace("\n", "\\n")
        add(f"# HELP {exposed} {help}\n# TYPE {exposed} {kind}\n")
        if family.per_job and family.kind == "histogram":
            # A histogram's series stay together, job after job.
            heads = [
                (f"{family.name}{suffix}{{", ("," + _labels(labels) if labels else "") + "} ")
                for suffix, labels, _ in family.columns
            ]
            written = [[numbers[v] for v in values] for _, _, values in family.columns]
            for n, job in enumerate(job_labels):
                for (head, tail), texts in zip(heads, written, strict=True):
                    add(f"{head}{job}{tail}{texts[n]}\n")
        elif family.per_job:
            for suffix, labels, column in family.columns:
                rest = "," + _labels(labels) if labels else ""
                head = f"{family.name}{suffix}{{"
                tail = rest + "} "
                parts.extend(
                    [
                        f"{head}{job}{tail}{numbers[v]}\n"
                        for job, v in zip(job_labels, column, strict=True)
                    ]
                )
        else:
            for suffix, labels, column in family.columns:
                inner = f"{{{_labels(labels)}}}" if labels else ""
                add(f"{family.name}{suffix}{inner} {_number(column[0])}\n")
    return "".join(parts)
