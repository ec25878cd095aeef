"""The fenced blocks of the user documentation (README.md and docs/*.md), found by section,
so that tests run the commands the pages show, as they show them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEADING = re.compile(r"(#{1,6}) ")
SHELL_LANGUAGES = frozenset({"bash", "sh", "shell", "console"})


def user_documents() -> list[str]:
    """README.md and every page of the site, as paths relative to the repository."""
    return ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Block:
    document: str
    headings: tuple[str, ...]  # the sections it is in, outermost first: ("# Title", "## Quick start")
    language: str  # the fence's info string: "bash", "text", "toml", "" when none is given
    text: str

    @property
    def heading(self) -> str:
        """The nearest heading above the block, as written."""
        return self.headings[-1] if self.headings else ""

    @property
    def is_shell(self) -> bool:
        return self.language in SHELL_LANGUAGES


def fenced_blocks(document: str) -> list[Block]:
    """Every fenced block of `document`, in order. Lines starting with # inside a fence are
    comments, not headings."""
    blocks: list[Block] = []
    trail: list[tuple[int, str]] = []  # (level, heading) of the sections the line is in
    language, lines = "", list[str]()
    fenced = False
    for line in (REPO / document).read_text("utf-8").splitlines():
        if line.startswith("```"):
            if fenced:
                headings = tuple(heading for _, heading in trail)
                blocks.append(Block(document, headings, language, "".join(lines)))
            else:
                language, lines = line[3:].strip(), []
            fenced = not fenced
        elif fenced:
            lines.append(line + "\n")
        elif match := HEADING.match(line):
            level = len(match.group(1))
            trail = [*(entry for entry in trail if entry[0] < level), (level, line)]
    return blocks


def section_blocks(document: str, heading: str) -> list[Block]:
    """The fenced blocks of the section under `heading`, its subsections included."""
    return [block for block in fenced_blocks(document) if heading in block.headings]
