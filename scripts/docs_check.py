"""`make docs-check`: the docs name only files, folders and sections that exist.

Reads every Markdown file of the documentation (README.md, each part's README.md, docs/)
and fails, one line per problem with its file and line, on

- a relative link (``[text](path)``, ``![alt](path)``) to a file that does not exist, or
  to a heading (``path.md#anchor``, ``#anchor``) that the target does not have, by
  GitHub's rule for heading anchors;
- a repository path named in the text (``gateway/telemetry/metrics.py``,
  ``bench/loadgen.py``: anything under one of the project's top-level folders) that does
  not exist, from the root or from the file's folder, except build outputs
  (:data:`BUILT`) and names the file declares are not paths
  (``<!-- docs-check: not a path: deploy/tokenpace-gateway -->``).

    .venv/bin/python scripts/docs_check.py [--root DIR] [FILE ...]

CHANGELOG.md is left out: it records what the tree was.
"""

from __future__ import annotations

import argparse
import re
import sys
import unicodedata
from pathlib import Path

ROOTS = (
    "bench",
    "deploy",
    "docs",
    "examples",
    "gateway",
    "qos",
    "scripts",
    "sdk_python",
    "sdk_web",
    "tests",
    "tokenpace",
    "webui",
)
"""The top-level folders whose paths the docs name."""

BUILT = (
    "webui/dist",
    "webui/test-artifacts",
    "webui/node_modules",
    "sdk_web/dist",
    "sdk_web/node_modules",
)
"""Paths that a build makes (not committed): named in the docs, never checked."""

DOCS = ("README.md", "*/README.md", "docs/**/*.md")
"""The documentation, as globs from the repository root."""

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
PATH = re.compile(r"(?<![\w/.\-@:])((?:" + "|".join(ROOTS) + r")/[\w./\-]*[\w/])")
NOT_A_PATH = re.compile(r"<!-- docs-check: not a path: (\S+) -->")
"""A name that looks like a path and is not one (``kubectl rollout status deploy/NAME``),
declared in the file that uses it."""
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading (github-slugger): lower case, code and link markup
    and emphasis asterisks dropped, then every character but letters, digits, ``_``,
    ``-`` and spaces, spaces to hyphens (``## The reader guard (qos/policy/reader.py)`` ->
    ``the-reader-guard-qospolicyreaderpy``)."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFC", text.replace("*", "")).lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (repeats get -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        m = None if in_fence else HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def _link_problem(root: Path, doc: Path, target: str) -> str | None:
    if re.match(r"^[a-z][a-z0-9+.\-]*:", target, re.I) or target.startswith("//"):
        return None  # a URL (https:, mailto:, ...)
    file_part, _, anchor = target.partition("#")
    dest = doc if not file_part else (doc.parent / file_part).resolve()
    if not dest.exists():
        return f"link to a missing file: {target}"
    if root.resolve() not in (dest, *dest.parents):
        return f"link outside the repository: {target}"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"link to a missing section: {target}"
    return None


def _path_problem(root: Path, doc: Path, name: str) -> str | None:
    clean = name.rstrip("/")
    if any(clean == b or clean.startswith(b + "/") for b in BUILT):
        return None
    if (root / clean).exists() or (doc.parent / clean).exists():
        return None  # from the root, or from the file's folder (deploy/README.md: gateway/...)
    return f"names a path that does not exist: {name}"


def check_file(root: Path, doc: Path) -> list[str]:
    """The problems of one Markdown file, each ``file:line: what``."""
    problems = []
    rel = doc.relative_to(root)
    text = doc.read_text(encoding="utf-8")
    not_paths = set(NOT_A_PATH.findall(text))
    for number, line in enumerate(text.splitlines(), start=1):
        for m in LINK.finditer(line):
            problem = _link_problem(root, doc, m.group(1))
            if problem:
                problems.append(f"{rel}:{number}: {problem}")
        prose = LINK.sub(lambda m: m.group(0).split("](")[0], line)  # link targets done above
        for m in PATH.finditer(prose):
            if m.group(1) in not_paths:
                continue
            problem = _path_problem(root, doc, m.group(1))
            if problem:
                problems.append(f"{rel}:{number}: {problem}")
    return problems


def doc_files(root: Path) -> list[Path]:
    found: set[Path] = set()
    for pattern in DOCS:
        found.update(p for p in root.glob(pattern) if "node_modules" not in p.parts)
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("files", nargs="*", type=Path, help="default: all the docs")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    files = [f.resolve() for f in args.files] or doc_files(root)
    problems = [p for f in files for p in check_file(root, f)]
    for p in problems:
        print(p, file=sys.stderr)
    print(f"docs-check: {len(files)} files, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
