"""Every relative link of the documentation resolves, anchors included.

Checks, over every Markdown file of the checkout (found by
``tests.docs.markdown_files``, so new pages are checked at once): each
relative link or image names an existing file or directory, and each
``#anchor`` (in the page or in ``other.md#anchor``) names a heading of the
target as GitHub slugs it, or an explicit ``<a id>``/``<a name>``; anchors
into other files are GitHub's line anchors (``#L10``, ``#L10-L20``) within
the file. Absolute URLs are not dialled. All broken links are reported at
once, ``file:line: link (why)``.

Also checks the helpers themselves on hand-made Markdown: GitHub's slugs
(examples from pages GitHub renders), the fenced blocks with their markers,
and the link finder's lines and kinds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import docs


def test_every_relative_link_and_anchor_resolves() -> None:
    files = docs.markdown_files()
    assert docs.REPO_ROOT / "README.md" in files, files
    broken = list(docs.broken_links(files))
    assert not broken, f"{len(broken)} broken links:\n" + "\n".join(broken)


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        # Headings of GitHub-rendered READMEs and the anchors GitHub gives them.
        ("Getting Started", "getting-started"),
        ("What's new in v0.2.0?", "whats-new-in-v020"),
        ("`kubectl explain` and the API", "kubectl-explain-and-the-api"),
        ("Install / uninstall", "install--uninstall"),
        ("snake_case and kebab-case", "snake_case-and-kebab-case"),
        ("Ünïcödé headings", "ünïcödé-headings"),
        ("C++ & Python: 100% (fast!)", "c--python-100-fast"),
        ("🚀 Quick start", "-quick-start"),
    ],
)
def test_github_slug(heading: str, slug: str) -> None:
    assert docs.github_slug(heading) == slug


def test_anchors_of_a_page(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Usage\n\n## Usage\n\n## Usage\n\nUsage-1\n---\n\n"
        "## The `lmeval` CLI, [linked](x.md) ![logo](l.png)\n\n"
        '<a id="kept-here"></a>\n\nText <a name="inline-one"></a>.\n\n'
        "```md\n# not a heading\n```\n"
    )
    assert docs.anchors(page) == {
        "usage",
        "usage-1",
        "usage-2",
        # A heading whose own slug was already taken gets the next free one.
        "usage-1-1",
        "the-lmeval-cli-linked-",
        "kept-here",
        "inline-one",
    }


def test_blocks_carry_their_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Intro\n\n"
        "<!-- first-job -->\n```yaml\nkind: LMEvalJob\n```\n\n"  # lines 3-6
        "<!-- runnable -->\n\nSome words.\n\n```bash\necho unmarked\n```\n\n"  # 8-14
        "- a step\n\n  <!-- runnable -->\n  ```bash\n  echo in a list\n  ```\n\n"  # 16-22
        "````md\n<!-- runnable -->\n```bash\necho quoted\n```\n````\n"  # 23-28
    )
    found = docs.blocks(page)
    assert [(b.line, b.language, b.marker) for b in found] == [
        (4, "yaml", "first-job"),
        (12, "bash", None),
        (19, "bash", "runnable"),
        (23, "md", None),
    ]
    assert found[2].text == "echo in a list\n"
    assert found[0].where.endswith("page.md:4")
    assert docs.marked_blocks("runnable", [page], "bash") == [found[2]]


def test_links_are_found_with_their_lines(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "See [a](a.md) and\n[b](b.md#x), ![i](i.png), <https://example.com>.\n\n"
        "| t |\n|---|\n| [c](c/) |\n\n"
        '<p><a href="d.md">d</a></p>\n\n'
        "[ref]: e.md#y\n\nBy [reference][ref]. `[no](link.md)`\n\n"
        "```\n[not](a-link.md)\n```\n"
    )
    assert [(link.line, link.target) for link in docs.links(page)] == [
        (1, "a.md"),
        (2, "b.md#x"),
        (2, "i.png"),
        (6, "c/"),
        (8, "d.md"),
        (12, "e.md#y"),
    ]


def test_broken_links_name_file_line_and_reason(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "other.md").write_text("# Other page\n\nline\n")
    (tmp_path / "code.py").write_text("a = 1\nb = 2\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Here\n\n"
        "[ok](../other.md#other-page) [ok](#here) [ok](../code.py#L1-L2) [ok](/other.md)\n"
        "[ok](https://example.com/missing.md) [ok](mailto:a@b.c) [ok](../docs/)\n"
        "[bad](missing.md) [bad](../other.md#nope) [bad](#there)\n"
        "[bad](../code.py#L3) [bad](../code.py#main) [bad](../docs#x)\n"
    )
    assert list(docs.broken_links([page], root=tmp_path)) == [
        f"{page}:5: missing.md (no such file or directory)",
        f"{page}:5: ../other.md#nope (no heading or anchor #nope)",
        f"{page}:5: #there (no heading or anchor #there)",
        f"{page}:6: ../code.py#L3 (#L3: the file has 2 lines)",
        f"{page}:6: ../code.py#main (#main in a file GitHub does not render as Markdown)",
        f"{page}:6: ../docs#x (#x on a directory)",
    ]
