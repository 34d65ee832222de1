"""Independent references that anarchon's schedules are checked against (no code shared with it)."""
