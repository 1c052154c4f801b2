"""The documentation holds together: every relative link in README.md, CONTRIBUTING.md, docs/*.md and
tests/benchmarks/RESULTS.md points to a file that exists (with a #fragment, to a heading in it, as
GitHub spells anchors); the README stays a front page (at most 10 KB) and links every page in docs/.
Reads text only: milliseconds."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *DOCS, REPO / "tests" / "benchmarks" / "RESULTS.md"]
README_MAX_BYTES = 10 * 1024

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+).+?\1", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code, where a `[x](y)` is not a link."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    return LINK.findall(prose(path.read_text()))


def test_the_pages_exist():
    assert DOCS, "docs/ has no pages"
    assert (REPO / "CONTRIBUTING.md").is_file()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:: not checked here
            continue
        file_part, _, fragment = target.partition("#")
        resolved = (page.parent / file_part).resolve() if file_part else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif not resolved.is_relative_to(REPO):
            broken.append(f"{target}: outside the repository")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading #{fragment} in {resolved.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_readme_is_at_most_10_kb_and_links_every_docs_page():
    readme = REPO / "README.md"
    size = len(readme.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes, over {README_MAX_BYTES}: move detail into docs/"
    linked = {(REPO / target.partition("#")[0]).resolve() for target in links(readme)}
    missing = [str(page.relative_to(REPO)) for page in DOCS if page.resolve() not in linked]
    assert not missing, f"README.md links no page {missing}"
    assert (REPO / "CONTRIBUTING.md").resolve() in linked, "README.md does not link CONTRIBUTING.md"


def test_the_slugs_follow_github():
    assert slug('What "exact" means') == "what-exact-means"
    assert slug("Draft sources: `--spec`") == "draft-sources---spec"
    assert slug("K per step: `--k auto`") == "k-per-step---k-auto"
    assert slug("The Qwen pair: `qwen2.5-coder-1.5b`") == "the-qwen-pair-qwen25-coder-15b"
