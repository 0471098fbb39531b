"""The repository's Markdown, read the way the documentation tests need it.

The docs are tested like code: links and anchors must resolve, YAML samples
must be accepted by the API server, and shell blocks marked for it must run.
Those tests find what to check in the files themselves (every Markdown file
of the checkout, every fenced block and the marker comment before it), so a
new page is checked as soon as it exists. Parsing is markdown-it-py's
CommonMark parser (with GitHub's tables), not regular expressions: a link in
a code block is no link, a fence inside a list item is still a fence.

Markers are HTML comments alone on the line before a fenced block, such as
``<!-- runnable -->`` or ``<!-- first-job: results -->``; GitHub does not
render them.
"""

from __future__ import annotations

import functools
import re
import subprocess
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from markdown_it import MarkdownIt
from markdown_it.token import Token

__all__ = [
    "REPO_ROOT",
    "Block",
    "Link",
    "anchors",
    "blocks",
    "broken_links",
    "github_slug",
    "links",
    "markdown_files",
    "marked_blocks",
]

REPO_ROOT = Path(__file__).resolve().parents[1]

MARKER = re.compile(r"\A<!--\s*(.*?)\s*-->\s*\Z", re.S)
# <a id="x"> and <a name="x">: explicit anchors, which GitHub keeps.
EXPLICIT_ANCHOR = re.compile(r"""<a\s[^>]*?\b(?:id|name)\s*=\s*["']([^"']+)["']""", re.I)
HTML_LINK = re.compile(r"""<(?:a|img)\s[^>]*?\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.I)
# GitHub's anchors for lines of a file that is not rendered as Markdown.
LINE_ANCHOR = re.compile(r"L(\d+)(?:-L(\d+))?")


@dataclass(frozen=True)
class Block:
    """A fenced code block: where it starts, its language, text and marker."""

    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    marker: str | None  # the comment's text right before the fence, e.g. "runnable"

    @property
    def where(self) -> str:
        """``README.md:120``, relative to the repository (for ids and messages)."""
        return f"{_relative(self.path)}:{self.line}"


@dataclass(frozen=True)
class Link:
    """A link or image target as written, and the 1-based line it is on."""

    path: Path
    line: int
    target: str


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _in_virtualenv(path: Path, root: Path) -> bool:
    return any((parent / "pyvenv.cfg").exists() for parent in path.parents if parent != root)


def markdown_files(root: Path = REPO_ROOT) -> list[Path]:
    """Every Markdown file of the checkout, tracked or new, that git does not ignore.

    git's ignore rules leave out caches (.pytest_cache, .mypy_cache, build
    outputs); a virtualenv inside the tree is left out too, ignored or not.
    """
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "*.md"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = {root / name for name in listed.split("\0") if name}
    return sorted(p for p in found if p.is_file() and not _in_virtualenv(p, root))


@functools.lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    # CommonMark plus the GitHub extensions that change what is a link or a heading.
    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


def _tokens(text: str) -> list[Token]:
    return _parser().parse(text)


def _marker(token: Token) -> str | None:
    found = MARKER.match(token.content.strip()) if token.type == "html_block" else None
    return found.group(1) if found else None


def blocks(path: Path, text: str | None = None) -> list[Block]:
    """The fenced blocks of one Markdown file, each with its marker (if any)."""
    source = path.read_text() if text is None else text
    found: list[Block] = []
    marker: str | None = None
    for token in _tokens(source):
        if token.type == "html_block":
            marker = _marker(token)
        elif token.type == "fence" and token.map is not None:
            language = token.info.split()[0] if token.info.strip() else ""
            found.append(Block(path, token.map[0] + 1, language, token.content, marker))
            marker = None
        elif token.type == "inline" or (
            # Anything with content between the comment and the fence (not a
            # list or quote opening, nor a closing token, which has no map):
            # the comment marks no block.
            token.map is not None and not token.type.endswith("_open")
        ):
            marker = None
    return found


def marked_blocks(
    marker: str, files: Iterable[Path] | None = None, language: str | None = None
) -> list[Block]:
    """Every block marked `marker` in `files` (default: all Markdown files)."""
    chosen = markdown_files() if files is None else files
    return [
        block
        for path in chosen
        for block in blocks(path)
        if block.marker == marker and (language is None or block.language == language)
    ]


def _inline_line(token: Token, children_before: list[Token]) -> int:
    assert token.map is not None
    breaks = sum(1 for c in children_before if c.type in ("softbreak", "hardbreak"))
    return token.map[0] + 1 + breaks


def links(path: Path, text: str | None = None) -> list[Link]:
    """Every link and image of a Markdown file (inline, reference and HTML ones)."""
    source = path.read_text() if text is None else text
    found: list[Link] = []
    for token in _tokens(source):
        if token.type == "html_block" and token.map is not None:
            for number, text_line in enumerate(token.content.splitlines(), token.map[0] + 1):
                found += [Link(path, number, t) for t in HTML_LINK.findall(text_line)]
        if token.type != "inline" or token.map is None:
            continue
        children = token.children or []
        for index, child in enumerate(children):
            line = _inline_line(token, children[:index])
            if child.type == "link_open" and child.markup != "autolink":
                found.append(Link(path, line, str(child.attrs.get("href", ""))))
            elif child.type == "image":
                found.append(Link(path, line, str(child.attrs.get("src", ""))))
            elif child.type == "html_inline":
                found += [Link(path, line, t) for t in HTML_LINK.findall(child.content)]
    return found


# -- anchors, as GitHub makes them ---------------------------------------------------------


def github_slug(text: str) -> str:
    """A heading's anchor as GitHub makes it (github-slugger): lowercase;
    every character but letters, digits, marks, ``-`` and ``_`` dropped, except
    spaces, which become ``-`` one for one."""
    kept = []
    for char in text.lower():
        if char == " ":
            kept.append("-")
        elif char in "-_" or unicodedata.category(char)[0] in "LNM":
            kept.append(char)
    return "".join(kept)


class _Slugger:
    """Unique slugs within one page: the second "Usage" is ``usage-1``."""

    def __init__(self) -> None:
        self.occurrences: dict[str, int] = {}

    def slug(self, text: str) -> str:
        base = result = github_slug(text)
        while result in self.occurrences:
            self.occurrences[base] += 1
            result = f"{base}-{self.occurrences[base]}"
        self.occurrences[result] = 0
        return result


def _heading_text(inline: Token) -> str:
    # The rendered heading's text content: text and code spans; not image
    # alt text, not HTML tags.
    return "".join(
        child.content for child in inline.children or [] if child.type in ("text", "code_inline")
    )


def _anchors_of(text: str) -> frozenset[str]:
    slugger = _Slugger()
    found: set[str] = set()
    tokens = _tokens(text)
    for index, token in enumerate(tokens):
        if token.type == "heading_open":
            found.add(slugger.slug(_heading_text(tokens[index + 1])))
        elif token.type in ("html_block", "inline"):
            pieces = [token.content] + [
                c.content for c in token.children or [] if c.type == "html_inline"
            ]
            for piece in pieces:
                found.update(EXPLICIT_ANCHOR.findall(piece))
    return frozenset(found)


def anchors(path: Path) -> frozenset[str]:
    """Every anchor a link may name in a Markdown file: its headings' slugs
    and its explicit ``<a id>``/``<a name>`` anchors."""
    return _anchors_of(path.read_text())


# -- links -----------------------------------------------------------------------------------


def _is_external(target: str) -> bool:
    # http:, https:, mailto:, ftp:... and protocol-relative //host/...
    return bool(urlsplit(target).scheme) or target.startswith("//")


def _problem(link: Link, root: Path, cache: dict[Path, frozenset[str]]) -> str | None:
    """Why `link` does not resolve, or None."""
    parts = urlsplit(link.target)
    path_part, anchor = unquote(parts.path), unquote(parts.fragment)
    if path_part.startswith("/"):  # GitHub resolves these against the repository's root
        target = root / path_part.lstrip("/")
    elif path_part:
        target = link.path.parent / path_part
    else:
        target = link.path
    if not target.exists():
        return "no such file or directory"
    if not parts.fragment:
        return None
    if target.is_dir():
        return f"#{anchor} on a directory"
    if target.suffix.lower() in (".md", ".markdown"):
        if target not in cache:
            cache[target] = anchors(target)
        return None if anchor in cache[target] else f"no heading or anchor #{anchor}"
    lines = LINE_ANCHOR.fullmatch(anchor)
    if lines is None:
        return f"#{anchor} in a file GitHub does not render as Markdown"
    count = len(target.read_text(errors="replace").splitlines())
    last = int(lines.group(2) or lines.group(1))
    return None if last <= count else f"#{anchor}: the file has {count} lines"


def broken_links(files: Iterable[Path], root: Path = REPO_ROOT) -> Iterator[str]:
    """``file:line: target (why)`` for every relative link of `files` that does not resolve."""
    cache: dict[Path, frozenset[str]] = {}
    for path in files:
        for link in links(path):
            if not link.target or _is_external(link.target):
                continue
            problem = _problem(link, root, cache)
            if problem:
                # As written: the parser percent-encodes what a URL may not hold.
                yield f"{_relative(link.path)}:{link.line}: {unquote(link.target)} ({problem})"
