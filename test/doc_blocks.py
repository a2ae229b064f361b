"""The fenced code blocks of README.md and docs/: one reader for every test that runs them.

The executed-docs tests (python blocks run against the in-process node, yaml blocks loaded as
params files), the client test of the README's example and the RGB-D drill's driver profile
all read their blocks here, the same way: a fence may be indented (in a list item: its lines
lose that indent), headings count outside blocks only (a ``#`` comment inside a block is not one).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# docs/bench/ included: its run logs quote the commands that produced them.
DOCS = (REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md")))


@dataclass(frozen=True)
class DocBlock:
    """One fenced block: its document, section heading, first line, fence and source."""

    doc: str  # "README.md", "PLANNERS.md", "bench/fleet-2026-12-01.md"
    heading: str  # the nearest heading above it (without the #s); "<heading> #2" for a second
    line: int  # the block's first line of code in the document
    source: str

    @property
    def key(self) -> str:
        return f"{self.doc}: {self.heading}"


def _name(doc: Path) -> str:
    """The document's path below docs/ (README.md's name alone)."""
    return doc.name if doc.parent == REPO_ROOT else doc.relative_to(REPO_ROOT / "docs").as_posix()


def doc_blocks(fences: Collection[str], docs: Sequence[Path] = DOCS) -> list[DocBlock]:
    """Every block whose fence (``python``, ``yaml``, ...) is in ``fences``, in document order.

    A second block of these fences in one section is keyed ``<heading> #2``, and so on.
    """
    blocks: list[DocBlock] = []
    for doc in docs:
        heading, fence, indent, start, body = "", None, 0, 0, []
        seen: dict[str, int] = {}
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            fence_line = line.lstrip().startswith("```")
            if fence is None:
                if fence_line:  # indented inside a list item too: its lines lose the indent
                    indent = len(line) - len(line.lstrip())
                    fence, start, body = line.strip()[3:].strip().lower(), number + 1, []
                elif re.match(r"#+ ", line):
                    heading = line.lstrip("#").strip()
            elif fence_line:
                if fence in fences:
                    seen[heading] = seen.get(heading, 0) + 1
                    name = heading if seen[heading] == 1 else f"{heading} #{seen[heading]}"
                    blocks.append(DocBlock(_name(doc), name, start, "\n".join(body) + "\n"))
                fence = None
            else:
                body.append(line[indent:] if not line[:indent].strip() else line.lstrip())
    return blocks
