"""docs/_ext/dt_docs_check.py, the docs build's check of the Markdown sources: unbalanced
code fences (CommonMark's rules), code comments that became headings, empty sections and
pages that are mostly one code block. Pages are written inline; the last tests run the
check on the files the docs build checks, which must pass as they stand."""

from __future__ import annotations

import re
import runpy
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import dt_docs_check as dc  # noqa: E402

FENCE = "`" * 3  # a fence written out, so this file's own text stays plain


def page(text: str) -> str:
    """A page written with ' for ` in its fences (''' is ```, '''' is ````)."""
    text = textwrap.dedent(text).lstrip("\n")
    return re.sub(r"^( *)('{3,})", lambda m: m[1] + "`" * len(m[2]), text, flags=re.MULTILINE)


def found(text: str) -> list[tuple[int, str]]:
    return [(problem.line, problem.check) for problem in dc.check_text(page(text))]


def messages(text: str) -> list[str]:
    return [problem.message for problem in dc.check_text(page(text))]


CLEAN = """
    # Title

    Some prose.

    ''''markdown
    A nested example:

    '''python
    print("inner")
    '''
    ''''

    ## Included code

    '''{literalinclude} ../examples/models/unet3d.py
    :language: python
    '''

    '''{code-block} python
    # a comment, not a heading
    x = 1
    '''

    ~~~text
    ''' backticks inside a tilde block
    ~~~

    1. A step:

       '''bash
       hatch run docs:build
       '''

    2. Another step.

    :::{note}
    '''python
    y = 2
    '''
    :::

    ### Deeper

    Text.

    ## Last

    More text.
    """


def test_a_clean_page_passes() -> None:
    assert found(CLEAN) == []


def test_a_clean_page_with_front_matter_and_targets_passes() -> None:
    text = """
        ---
        # a YAML comment, not a heading
        orphan: true
        ---
        # Title

        (a-target)=
        ## Section

        Text.
        """
    assert found(text) == []


def test_unclosed_fence() -> None:
    text = """
        # Title

        '''python
        x = 1

        More prose that is now code.
        """
    assert found(text) == [(3, "fence")]
    assert "never closed" in messages(text)[0]


def test_a_lost_opening_fence_makes_the_closing_one_open_a_block() -> None:
    """The guides' defect: the opening fence lost, the code's comment is a heading and the
    closing fence opens a block to the end of the page."""
    text = """
        # dt-cp

        ## Usage

        import dt_cp
        # or torch's own front end:
        out = flex_attention(q, k, v)
        '''

        Prose after the block.
        """
    assert found(text) == [(6, "heading"), (8, "fence")]


def test_closing_fence_shorter_than_opening() -> None:
    text = """
        # Title

        ''''python
        x = 1
        '''

        Prose.
        """
    assert found(text) == [(3, "fence")]
    assert "line 5 has 3 '`', fewer than the 4" in messages(text)[0]


def test_info_string_on_a_would_be_closing_fence() -> None:
    text = """
        # Title

        '''python
        x = 1
        '''python

        Prose.
        """
    assert found(text) == [(3, "fence")]
    assert "line 5 has text after its fence ('python')" in messages(text)[0]


def test_a_closing_fence_of_the_other_character_does_not_close() -> None:
    text = """
        # Title

        ~~~text
        x
        '''

        Prose.
        """
    assert found(text) == [(3, "fence")]


def test_a_longer_closing_fence_closes() -> None:
    text = """
        # Title

        '''text
        x
        ''''''

        Prose.
        """
    assert found(text) == []


def test_backticks_in_the_info_string_make_no_fence() -> None:
    """```a``` b is inline code in a paragraph, not an opening fence."""
    assert dc.check_text(f"# Title\n\n{FENCE}a{FENCE} b\n") == []


def test_a_fence_in_a_list_item_ends_with_the_item() -> None:
    text = """
        # Title

        - A step:

          '''bash
          hatch run docs:build
        - the next item; the block above was never closed
        '''
        """
    problems = found(text)
    assert (5, "fence") in problems
    assert "the list item it sits in ends at line 7" in messages(text)[0]


def test_an_unclosed_fence_inside_a_directive_body() -> None:
    text = """
        # Title

        :::{note}
        '''python
        y = 2
        :::

        Prose.
        """
    assert found(text) == [(4, "fence")]


def test_an_unclosed_colon_fence() -> None:
    text = """
        # Title

        :::{note}
        Text.
        """
    assert found(text) == [(3, "fence")]


def test_a_second_title_is_a_code_comment() -> None:
    text = """
        # Title

        Text.

        # torchrun --nproc-per-node 2 example.py

        More text.
        """
    assert found(text) == [(5, "heading")]


def test_headings_that_read_as_code_comments() -> None:
    text = """
        # Title

        ## import torch

        Text.

        ### x = f(y)  # noqa: E501

        Text.
        """
    assert found(text) == [(3, "heading"), (7, "heading")]


def test_headings_with_parentheses_and_equals_are_fine() -> None:
    text = """
        # Title

        ## dt-cp: memory vs ranks (S=32768, `simple_fsdp(model, mesh)`)

        Text.
        """
    assert found(text) == []


def test_empty_section() -> None:
    text = """
        # Title

        ## Empty

        ## Full

        Text.

        ### Sub

        Text.

        ## Also empty

        <!-- nothing here yet -->

        # Higher
        """
    assert found(text) == [
        (3, "empty-section"),
        (13, "empty-section"),
        (17, "heading"),
        (17, "empty-section"),
    ]
    assert "the heading at line 5 follows it directly" in messages(text)[0]


def test_a_section_with_only_subsections_is_not_empty() -> None:
    text = """
        # Title

        ## Parent

        ### Child

        Text.
        """
    assert found(text) == []


def test_a_page_mostly_one_block() -> None:
    body = "\n".join(f"line_{i} = {i}" for i in range(40))
    text = f"# Title\n\nProse.\n\n{FENCE}python\n{body}\n{FENCE}\n\nMore prose.\n"
    assert [(p.line, p.check) for p in dc.check_text(text)] == [(5, "one-block")]
    assert "holds 42 of the page's 45 non-blank lines" in dc.check_text(text)[0].message


def test_a_short_page_is_not_measured() -> None:
    body = "\n".join(f"line_{i} = {i}" for i in range(30))
    text = f"# Title\n\n{FENCE}python\n{body}\n{FENCE}\n"
    assert dc.check_text(text) == []


def test_a_page_of_many_small_blocks_passes() -> None:
    block = f"{FENCE}python\n" + "\n".join(f"x_{i} = {i}" for i in range(10)) + f"\n{FENCE}\n"
    text = "# Title\n\n" + "\n".join(f"## Part {i}\n\n{block}" for i in range(6))
    assert dc.check_text(text) == []


def test_an_include_directive_is_not_code() -> None:
    """A long toctree or include is not a code block, so not 'mostly one block'."""
    entries = "\n".join(f"page-{i}" for i in range(50))
    text = f"# Title\n\nProse.\n\n{FENCE}{{toctree}}\n{entries}\n{FENCE}\n"
    assert dc.check_text(text) == []


def test_problems_name_file_and_line() -> None:
    (problem,) = dc.check_text(page("# Title\n\n'''python\nx = 1\n"))
    assert problem.format("docs/page.md").startswith("docs/page.md:3: the fence ```python")


def test_source_files_reports_patterns_that_match_nothing(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\nText.\n")
    (tmp_path / "docs" / "_build").mkdir()
    (tmp_path / "docs" / "_build" / "b.md").write_text("# B\n")
    files, unmatched = dc.source_files(tmp_path, ["docs/**/*.md", "README.md"])
    assert files == [tmp_path / "docs" / "a.md"]
    assert unmatched == ["README.md"]


def test_main_exits_nonzero_on_a_broken_page(tmp_path: Path, capsys) -> None:
    broken = tmp_path / "broken.md"
    broken.write_text(page("# Title\n\n'''python\nx = 1\n"))
    clean = tmp_path / "clean.md"
    clean.write_text(page(CLEAN))
    assert dc.main([str(clean)]) == 0
    assert dc.main([str(broken), str(clean)]) == 1
    assert capsys.readouterr().out.startswith(f"{broken}:3: ")


def test_the_checked_pages_pass() -> None:
    """Every file the docs build checks (conf.py's list) passes as it stands."""
    conf = runpy.run_path(str(ROOT / "docs" / "conf.py"))
    root = (ROOT / "docs" / conf["dt_docs_check_root"]).resolve()
    files, unmatched = dc.source_files(root, conf["dt_docs_check_files"])
    assert unmatched == []
    assert ROOT / "docs" / "guide" / "dt-cp.md" in files
    assert ROOT / "README.md" in files
    problems = [
        problem.format(str(path.relative_to(root)))
        for path in files
        for problem in dc.check_text(path.read_text(encoding="utf-8"))
    ]
    assert problems == []


def test_lines_inside_a_directive_body_are_counted_from_the_page() -> None:
    text = """
        # Title

        :::{note}
        Text.

        ''''python
        y = 2
        '''
        :::

        Prose.
        """
    assert found(text) == [(6, "fence")]
    assert "line 8 has 3 '`', fewer than the 4" in messages(text)[0]


def test_a_fence_indented_four_spaces_past_its_block_does_not_close_it() -> None:
    text = """
        # Title

        '''text
        x
            '''

        Prose.
        """
    assert found(text) == [(3, "fence")]
