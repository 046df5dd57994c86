"""The documents the code and the docs point at exist: every ``docs/<name>.md`` named in the
sources, the tests or the docs is a file of the repository, a section named after it (``docs/
models.md, Errors and retries``) is one of its headings, and every relative link between the docs
(``[workers.md](workers.md#the-grace-policy)``) reaches a file and, with an anchor, a heading.

A citation that points nowhere is worse than none: the reader goes looking for the rule and finds
nothing, and learns to stop looking."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# A cited document, and what follows it up to the end of the parenthesis or clause: the section.
_CITATION = re.compile(r"\bdocs/((?:[\w-]+/)*[\w-]+\.md)(?:,\s+([^);:]+))?")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
# A document named without its folder (``session-log.md, Durability``): the code and the tests
# cite the docs by their path, so a bare name is a document the repository does not have.
# README.md and AGENTS.md (the project instructions andon reads, docs/agent-loop.md, Project
# instructions) are file names, not citations of a document.
_BARE = re.compile(r"""(?<![\w/.'"-])(?!README\.md|AGENTS\.md)([\w-]+\.md)\b""")


def _sources() -> list[Path]:
    files = [*sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "tests").rglob("*.py"))]
    return [*files, *sorted(DOCS.rglob("*.md")), ROOT / "README.md"]


def _flat(text: str) -> str:
    """The text with comment markers gone and whitespace runs as one space, so that a citation
    wrapped over two comment or docstring lines reads as one."""
    lines = (re.sub(r"^\s*#\s?", "", line) for line in text.splitlines())
    return re.sub(r"\s+", " ", " ".join(lines)).replace("`", "")


@cache
def _headings(doc: Path) -> tuple[str, ...]:
    """The headings of ``doc`` (outside code blocks), without backticks."""
    found = []
    fenced = False
    for line in doc.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := _HEADING.match(line)):
            found.append(match[1].replace("`", ""))
    return tuple(found)


def _slug(heading: str) -> str:
    """The anchor a Markdown renderer gives ``heading`` (GitHub's rule)."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _names_section(section: str, doc: Path) -> bool:
    """Whether ``section`` names a heading of ``doc``: the whole of it, or its first words up to a
    mark (``Kubernetes`` for ``Kubernetes: PodLauncher``), followed by more words or not
    (``Cancel, Streaming``, ``Errors and retries: connect 10``)."""
    for heading in _headings(doc):
        if section == heading:
            return True
        for longer, shorter in ((section, heading), (heading, section)):
            if re.match(re.escape(shorter) + r"\W", longer):
                return True
    return False


def test_every_cited_document_and_section_exists() -> None:
    broken = []
    for path in _sources():
        rel = path.relative_to(ROOT)
        for match in _CITATION.finditer(_flat(path.read_text())):
            doc = ROOT / "docs" / match[1]
            if not doc.is_file():
                broken.append(f"{rel}: docs/{match[1]} does not exist")
            elif match[2] is not None and not _names_section(match[2].strip(), doc):
                broken.append(f"{rel}: docs/{match[1]} has no section {match[2].strip()!r}")
    assert broken == []


def test_every_relative_link_in_the_docs_resolves() -> None:
    broken = []
    for page in [*sorted(DOCS.rglob("*.md")), ROOT / "README.md"]:
        for target in _LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):  # https:, mailto: ...
                continue
            file, _, anchor = target.partition("#")
            doc = (page.parent / file).resolve() if file else page
            rel = page.relative_to(ROOT)
            if not doc.exists():
                broken.append(f"{rel}: {target}: no such file")
            elif (
                anchor and doc.suffix == ".md" and anchor not in {_slug(h) for h in _headings(doc)}
            ):
                broken.append(f"{rel}: {target}: no such heading")
    assert broken == []


def test_the_code_names_no_document_without_its_folder() -> None:
    me = Path(__file__).resolve()
    code = [*(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    code += (ROOT / "benchmarks").rglob("*.py")
    bare = [
        f"{path.relative_to(ROOT)}:{number}: {match[1]}"
        for path in sorted(code)
        if path != me
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for match in _BARE.finditer(line)
    ]
    assert bare == []


def test_the_checks_see_a_broken_citation() -> None:
    models = DOCS / "models.md"
    assert _names_section("Errors and retries", models)
    assert _names_section("Errors and retries: connect 10", models)
    assert not _names_section("Wire format", models)
    wrapped = _CITATION.search(_flat("# (docs" + "/models.md, Errors\n    # and retries)"))
    assert wrapped is not None and wrapped[2] == "Errors and retries"
    assert _BARE.findall("(session-log" + ".md, Durability) docs/ci.md README.md") == [
        "session-log" + ".md"
    ]
    assert _slug("Process identity: never touch a stranger") == (
        "process-identity-never-touch-a-stranger"
    )
