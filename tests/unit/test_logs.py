"""Logs as a contract: every action logged anywhere in anarchon is an ``Action``, and the
fields of a record about a slot are built one way."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

import anarchon
from anarchon import Trigger
from anarchon.backend import Ticket
from anarchon.logs import Action, backend_logger, job_logger, log_fields, slot_iso

SOURCE = Path(anarchon.__file__).parent
DOCS = Path(__file__).resolve().parents[2] / "docs" / "logging.md"
HELPERS = {"_log", "log_fields"}  # called as helper(level, action, ...) / helper(action, ...)


def logged_actions() -> list[tuple[str, ast.expr]]:
    """Every expression given as an action under src/anarchon, with where it is."""
    found: list[tuple[str, ast.expr]] = []
    for path in sorted(SOURCE.rglob("*.py")):
        if path.name == "logs.py":  # the enum and the helper themselves
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(SOURCE)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "action":
                        found.append((where, value))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
                name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                if name == "_log" and len(node.args) >= 2:
                    found.append((where, node.args[1]))
                elif name == "log_fields" and node.args:
                    found.append((where, node.args[0]))
                for keyword in node.keywords:
                    if name in HELPERS and keyword.arg == "action":
                        found.append((where, keyword.value))
    return found


def test_every_logged_action_is_a_member_of_the_enum() -> None:
    members = {a.value for a in Action}
    found = logged_actions()
    assert len(found) > 50, "the scan found too little to be looking at the right code"
    wrong = []
    for where, value in found:
        if isinstance(value, ast.Constant):
            ok = value.value in members
        elif (
            isinstance(value, ast.Attribute)
            and isinstance(value.value, ast.Name)
            and value.value.id == "Action"
        ):
            ok = value.attr in Action.__members__
        else:  # a parameter passed on (the helpers themselves), or a local chosen from members
            ok = isinstance(value, ast.Name) and value.id == "action"
        if not ok:
            wrong.append(f"{where}: {ast.unparse(value)}")
    assert not wrong, "actions that are not anarchon.logs.Action members:\n" + "\n".join(wrong)


def test_every_action_is_in_the_docs_table() -> None:
    text = DOCS.read_text()
    missing = [a.value for a in Action if f"| `{a.value}` |" not in text]
    assert not missing, f"docs/logging.md has no row for {missing}"


def test_the_shared_outage_actions_are_members() -> None:
    for name in ("backend_unavailable", "backend_recovered"):
        assert Action(name)
    for name in ("notifications_lost", "notifications_resumed"):
        assert Action(name)


def test_log_fields_give_the_slot_as_epoch_ms_and_iso() -> None:
    fields = log_fields(Action.TOO_LATE, "report", 1_767_225_600_000, holder="a")
    assert fields == {
        "action": "too_late",
        "job": "report",
        "slot": 1_767_225_600_000,
        "slot_iso": "2026-01-01T00:00:00.000+00:00",
        "holder": "a",
    }
    assert type(fields["action"]) is str  # a plain string in records, for any formatter
    assert log_fields(Action.CATCH_UP_FAILED) == {"action": "catch_up_failed"}
    manual = log_fields(Action.CLAIM_WON, "report", None)
    assert manual["slot"] is None and manual["slot_iso"] is None
    assert slot_iso(1_767_225_600_123) == "2026-01-01T00:00:00.123+00:00"


def test_log_fields_of_a_ticket_name_the_run() -> None:
    ticket = Ticket(
        job="report",
        slot=1_767_225_600_000,
        slot_key="1767225600000",
        run_id="r1",
        token="t",
        instance="a",
        trigger=Trigger.SCHEDULE,
        attempt=2,
        fence=7,
        started_at_ms=1_767_225_600_001,
    )
    fields = log_fields(Action.LEASE_LOST, ticket=ticket)
    assert {k: fields[k] for k in ("job", "slot", "run_id", "attempt", "fence")} == {
        "job": "report",
        "slot": 1_767_225_600_000,
        "run_id": "r1",
        "attempt": 2,
        "fence": 7,
    }
    assert fields["slot_iso"].startswith("2026-01-01T00:00:00")


def hand_made_slot_fields() -> list[str]:
    """Where a record's fields with a ``slot`` are written by hand under src/anarchon: a dict
    literal with a ``slot`` key inside a call's ``extra=``, or beside an ``action`` key.
    :func:`log_fields` builds them, with ``slot_iso`` beside the slot."""
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        if path.name == "logs.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        dicts = [node for node in ast.walk(tree) if isinstance(node, ast.Dict)]
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                for keyword in node.keywords:
                    if keyword.arg == "extra":
                        dicts += [d for d in ast.walk(keyword.value) if isinstance(d, ast.Dict)]
        for node in dicts:
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if "slot" in keys and ("action" in keys or _in_extra(tree, node)):
                found.append(f"{path.relative_to(SOURCE)}:{node.lineno}")
    return sorted(set(found))


def _in_extra(tree: ast.AST, wanted: ast.Dict) -> bool:
    """``wanted`` is (inside) some call's ``extra=``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "extra" and any(d is wanted for d in ast.walk(keyword.value)):
                    return True
    return False


def test_every_record_with_a_slot_gets_its_fields_from_log_fields() -> None:
    # docs/logging.md: a record about a slot carries job, slot and slot_iso. A slot written by
    # hand (NATS claim_duplicate, Redis claim_refused_unknown did) lacks slot_iso.
    assert hand_made_slot_fields() == []
    for action in Action:  # every action that may carry a slot gets slot_iso beside it
        fields = log_fields(action, "report", 1_767_225_600_000)
        assert fields["slot_iso"] == "2026-01-01T00:00:00.000+00:00", action
        assert log_fields(action, "report", None)["slot_iso"] is None


@pytest.mark.parametrize(
    ("logger", "name"),
    [
        (job_logger("report"), "anarchon.job.report"),
        (backend_logger("redis"), "anarchon.backends.redis"),
    ],
)
def test_logger_names(logger: logging.Logger, name: str) -> None:
    assert logger.name == name


def test_the_logging_page_config_runs() -> None:
    """The dictConfig block of docs/logging.md (marked logging-page-config) configures."""
    text = DOCS.read_text()
    block = text.split("logging-page-config -->\n```python\n", 1)[1].split("```", 1)[0]
    saved = {name: logging.getLogger(name) for name in ("anarchon", "anarchon.job.report")}
    levels = {name: (lg.level, list(lg.handlers)) for name, lg in saved.items()}
    try:
        exec(compile(block, "docs/logging.md", "exec"), {})
        assert logging.getLogger("anarchon.job.report").isEnabledFor(logging.DEBUG)
        assert logging.getLogger("anarchon").level == logging.INFO
    finally:
        for name, (level, handlers) in levels.items():
            saved[name].setLevel(level)
            saved[name].handlers[:] = handlers
