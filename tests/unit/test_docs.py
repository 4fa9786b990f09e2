"""The documentation builds (mkdocs, strictly: every link between pages and every anchor resolves) and every
relative link of README.md and docs/ names a file that exists; the README stays a landing page (≤ 12 KB)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _targets(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # not inside code blocks
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_names_a_file_that_exists(page: Path):
    missing = [target for target in _targets(page)
               if target.split("#", 1)[0] and not (page.parent / target.split("#", 1)[0]).exists()]
    assert not missing, f"{page.relative_to(REPO)} links to files that do not exist: {missing}"


def test_the_docs_site_builds_strictly(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir",
                           str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert (tmp_path / "site" / "configuration" / "index.html").is_file()


def test_the_docs_pages_link_only_to_pages_and_images_inside_docs():
    """A page that linked to a repository file outside docs/ would be a broken link on the built site: such files
    are named as paths instead."""
    outside = {page.name: [t for t in _targets(page) if t.startswith("../")] for page in PAGES[1:]}
    assert not any(outside.values()), {page: links for page, links in outside.items() if links}


def test_the_readme_is_a_landing_page():
    size = len((REPO / "README.md").read_bytes())
    assert size <= 12 * 1024, f"README.md is {size} bytes: move the detail into docs/"
