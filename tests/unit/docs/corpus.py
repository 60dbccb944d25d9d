"""The prose the docs tests read, split into the pieces a claim is made in.

Every rule here is general (a field path is `spec.` or `status.` followed by dotted names, a metric is
`specdec_...`, a claim about a reason sits in a paragraph, list item or table row that speaks of reasons,
conditions or events), so that docs written later are held to the same rules without a list of phrases.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[3]

# Prose read by users. The runbooks are docs/runbooks.md; the chart README is generated from values.yaml.
TOP_LEVEL_DOCS = (
    "README.md",
    "SECURITY.md",
    "CONTRIBUTING.md",
    "charts/specdec-operator/README.md",
    "runtime/README.md",
)


def doc_files(root: Path = REPO_ROOT) -> list[Path]:
    top = [root / name for name in TOP_LEVEL_DOCS if (root / name).exists()]
    return sorted((root / "docs").glob("*.md")) + top


def example_files(root: Path = REPO_ROOT) -> list[Path]:
    return sorted((root / "examples").glob("*.yaml"))


@dataclass(frozen=True)
class Block:
    """A paragraph, list item, heading or table row (with its table's header row as context)."""

    path: Path
    line: int  # 1-based line of the block's first line
    text: str
    context: str  # text that says what the block is about: the block itself, plus a table's header row
    label: str = ""  # where it is when not a file's line (a CRD field's description)

    def where(self, root: Path = REPO_ROOT) -> str:
        if self.label:
            return self.label
        try:
            name = self.path.relative_to(root)
        except ValueError:
            name = self.path
        return f"{name}:{self.line}"


_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")


def blocks(path: Path, text: str | None = None) -> Iterator[Block]:
    """Split markdown (or a YAML file's comments) into blocks; fenced code is one block per fence."""
    lines = (path.read_text() if text is None else text).split("\n")
    current: list[str] = []
    start = 0
    header = ""
    in_fence = False

    def flush() -> Iterator[Block]:
        if current:
            body = "\n".join(current)
            yield Block(path, start + 1, body, body + ("\n" + header if body.startswith("|") else ""))

    for number, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("```"):
            if in_fence:
                current.append(line)
                yield from flush()
                current, in_fence = [], False
                continue
            yield from flush()
            current, start, in_fence = [line], number, True
            continue
        if in_fence:
            current.append(line)
            continue
        is_row = stripped.startswith("|")
        if is_row and (number == 0 or not lines[number - 1].strip().startswith("|")):
            header = stripped  # the first row of a table names its columns
        if not stripped or is_row or _LIST_ITEM.match(line) or stripped.startswith("#"):
            yield from flush()
            current, start = ([line], number) if stripped else ([], number)
            if is_row or stripped.startswith("#"):
                yield from flush()
                current = []
            continue
        if not current:
            start = number
        current.append(line)
    yield from flush()


def all_blocks(root: Path = REPO_ROOT) -> list[Block]:
    """Blocks of every doc, and of every example's comments (YAML keys are checked structurally instead)."""
    found = [block for path in doc_files(root) for block in blocks(path)]
    for path in example_files(root):
        comments = "\n".join(line.split("#", 1)[1] if "#" in line else "" for line in path.read_text().split("\n"))
        found += list(blocks(path, comments))
    return found


def code_spans(text: str) -> list[str]:
    """Inline `code` spans and the lines of fenced blocks: where commands and names are written."""
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    for fence in re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S):
        spans += fence.split("\n")
    return spans


def description_blocks(schema: dict[str, Any]) -> list[Block]:
    """The CRD's field descriptions (what `kubectl explain` shows), one block each, named by field path."""
    found: list[Block] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("description"), str):
                text = node["description"]
                found.append(Block(REPO_ROOT / "crds", 0, text, text, label=f"CRD description of {path}"))
            for key, child in node.get("properties", {}).items():
                walk(child, f"{path}.{key}")
            if isinstance(node.get("items"), dict):
                walk(node["items"], f"{path}[]")

    for part, part_schema in schema.items():
        walk(part_schema, part)
    return found
