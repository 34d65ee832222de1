"""Build glue: the README as PyPI's long description, with its relative links made absolute.

Everything else is in pyproject.toml. The README's links are relative to the repository
(``docs/guides/fastapi.md``, the screenshot ``docs/img/dashboard-jobs.png``), which GitHub
resolves and PyPI, showing the same text, does not. For the long description, with the URLs of
``[project.urls]``: a page of the docs site (``docs/X.md``) becomes its page under
``Documentation``, an image the raw file of ``Repository`` on the main branch, any other file its
page there, and an anchor of the README (``#development``) the README's anchor on
``Repository``. setuptools runs this file for every build (wheel, sdist, and the wheel from the
sdist).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent
BRANCH = "main"
LINK = re.compile(r"(?P<bang>!?)\[(?P<label>[^\]]*)\]\((?P<target>[^)\s]+)\)")
# The docs' pages that are not on the site (mkdocs.yml's exclude_docs).
OFF_SITE = ("docs/examples/", "docs/hooks/")


def absolute(text: str, docs: str, repository: str) -> str:
    """``text`` (Markdown) with every relative link and image made an absolute URL."""
    docs, repository = docs.rstrip("/"), repository.rstrip("/")
    raw = repository.replace("https://github.com/", "https://raw.githubusercontent.com/", 1)

    def fix(match: re.Match[str]) -> str:
        bang, label, target = match.group("bang", "label", "target")
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            return match.group(0)
        path, _, anchor = target.partition("#")
        anchor = f"#{anchor}" if anchor else ""
        if not path:
            url = f"{repository}{anchor}"  # the README's own anchor, on the repository's page
        elif bang:
            url = f"{raw}/{BRANCH}/{path}"
        elif path.startswith("docs/") and path.endswith(".md") and not path.startswith(OFF_SITE):
            page = path.removeprefix("docs/").removesuffix(".md")
            page = page.removesuffix("index")
            url = f"{docs}/{page}{'/' if page and not page.endswith('/') else ''}{anchor}"
        else:
            url = f"{repository}/blob/{BRANCH}/{path}{anchor}"
        return f"{bang}[{label}]({url})"

    return LINK.sub(fix, text)


def long_description() -> str:
    """The README with absolute links, for PyPI."""
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return absolute(readme, urls["Documentation"], urls["Repository"])


if __name__ == "__main__":
    from setuptools import setup

    setup(long_description=long_description(), long_description_content_type="text/markdown")
