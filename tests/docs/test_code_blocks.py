"""Every code block in README.md and docs/ is run by a test or marked as not runnable, with a
reason (the rule is in tests/docs/blocks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.blocks import EXAMPLES, ROOT, Block, blocks, pages

TESTS = {p: p.read_text() for p in (ROOT / "tests").rglob("*.py")}


def problem(block: Block) -> str | None:
    if block.marker == "not runnable":
        return None if block.argument else "says 'not runnable' without a reason"
    if block.marker == "test":
        path, _, name = block.argument.partition(" ")
        test = ROOT / path
        if test not in TESTS:
            return f"names {path!r}, which is no test file"
        wanted = name.strip() or block.page.name
        return None if wanted in TESTS[test] else f"{path} does not mention {wanted!r}"
    if block.is_doctest:
        return None
    if block.snippets:
        for included in block.snippets:
            if not (EXAMPLES / included).is_file():
                return f"includes {included!r}, which is not a file of docs/examples"
            if not any(Path(included).name in text for text in TESTS.values()):
                return f"includes {included!r}, which no test names"
        return None
    return "has no marker: run it in a test (<!-- test: ... -->) or say why not"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_is_run_or_marked(page: Path) -> None:
    problems = [f"{b.where} ({b.lang or 'plain'}) {p}" for b in blocks(page) if (p := problem(b))]
    assert not problems, "\n".join(problems)


def test_the_parser_sees_markers_doctests_and_snippets(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- not runnable: a shell -->\n\n```sh\nls\n```\n\n"
        "```python\n>>> 1 + 1\n2\n\n```\n\n"
        '```python\n--8<-- "quickstart.py"\n```\n\n'
        "<!-- test: tests/docs/test_guides.py some-name -->\n````python\nx = '```'\n````\n"
        "<!-- not runnable: separated from its block by text -->\nsome text\n\n```\nbare\n```\n"
    )
    found = blocks(page)
    assert [(b.lang, b.marker) for b in found] == [
        ("sh", "not runnable"),
        ("python", None),
        ("python", None),
        ("python", "test"),
        ("", None),
    ]
    assert found[1].is_doctest and found[2].snippets == ["quickstart.py"]
    assert found[3].code == "x = '```'\n" and found[3].argument.endswith("some-name")
    assert [problem(b) is None for b in found] == [True, True, True, False, False]
