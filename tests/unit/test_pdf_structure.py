"""The Markdown of titles, tables of contents, examples, hyphens, code and ruled tables.

Each PDF is written here with PyMuPDF (``Story`` lays HTML out; ``insert_text`` and
``draw_line`` place text and rules where a TeX document would), then read the way
``rayorch run pdf`` reads it: ``RenderPdf`` and ``AssembleDocument``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from rayorch.pipelines.pdf import AssembleDocument, RenderPdf

pymupdf: Any = pytest.importorskip("pymupdf")

FILLER = ("Every page of every document keeps its place in the lineage, whatever the order "
          "in which the actors finish.")


def markdown_of(path: Path, *, tables: bool = False) -> str:
    [(pages, meta)] = RenderPdf(tables=tables)([str(path)])
    assert pages == []
    [doc] = AssembleDocument()([[]], [meta])
    return str(doc["markdown"])


def story_pdf(path: Path, body: str) -> Path:
    """HTML laid out on A4 pages by PyMuPDF's Story."""
    story = pymupdf.Story(html=body)
    writer = pymupdf.DocumentWriter(str(path))
    mediabox = pymupdf.paper_rect("a4")
    more = 1
    while more:
        device = writer.begin_page(mediabox)
        more, _ = story.place(pymupdf.Rect(72, 72, mediabox.width - 72, mediabox.height - 72))
        story.draw(device)
        writer.end_page()
    writer.close()
    return path


def text_pdf(path: Path, runs: list[tuple[float, float, str, float, str]],
             rules: list[tuple[float, float, float, float]] = ()) -> Path:  # type: ignore[assignment]
    """One page: ``(x, y, text, size, font)`` runs and ``(x0, y0, x1, y1)`` ruling lines."""
    doc = pymupdf.open()
    page = doc.new_page(width=595, height=842)
    for x, y, text, size, font in runs:
        page.insert_text((x, y), text, fontsize=size, fontname=font)
    for x0, y0, x1, y1 in rules:
        page.draw_line((x0, y0), (x1, y1), width=0.4)
    doc.save(path)
    return path


def test_a_title_over_three_lines_is_the_whole_h1_and_not_a_heading_again(tmp_path: Path) -> None:
    title = ("A Study of Lineage in Very Large Document Pipelines and the Ways in Which "
             "They Fail")
    markdown = markdown_of(story_pdf(tmp_path / "t.pdf", f"<h1>{title}</h1><h2>1 Start</h2>"
                                     f"<p>{FILLER * 6}</p>"))
    assert markdown.startswith(f"# {title}\n")
    assert markdown.count("A Study of Lineage") == 1  # not repeated as a heading of page 1
    assert "\n## 1 Start\n" in markdown  # the sections keep the level below the title


def test_a_table_of_contents_is_a_list_of_entries_not_headings(tmp_path: Path) -> None:
    """As LaTeX sets one: bold chapter entries without leaders, sections with dot
    leaders; number, title, leaders and page number are runs of their own."""
    runs = [(72, 150, "The Manual", 20, "hebo"), (72, 190, "Contents", 14, "hebo")]
    y = 220.0
    for number, name, page, bold in (("1", "Introduction", "2", True),
                                     ("1.1", "Examples with running numbers", "3", False),
                                     ("1.2", "Examples with other identifiers", "4", False),
                                     ("2", "Glosses", "6", True)):
        x = 72 if bold else 90
        font = "hebo" if bold else "helv"
        runs.append((x, y, number, 10, font))
        runs.append((x + 24, y, name, 10, font))
        if not bold:
            runs.append((300, y, " .".join([""] * 20), 10, "helv"))
        runs.append((500, y, page, 10, font))
        y += 16
    runs += [(72, y + 30 + 13 * i, FILLER, 10, "helv") for i in range(3)]
    runs.append((72, y + 80, "2 more examples follow in section 3", 10, "helv"))
    markdown = markdown_of(text_pdf(tmp_path / "toc.pdf", runs))
    assert "- 1 Introduction\n  - 1.1 Examples with running numbers\n" \
           "  - 1.2 Examples with other identifiers\n- 2 Glosses" in markdown
    assert ". . ." not in markdown
    assert not re.search(r"^#+ .*(Introduction|Glosses)", markdown, re.MULTILINE)
    assert FILLER in markdown  # the text after the TOC is a paragraph again
    assert "\n2 more examples follow in section 3" in markdown  # not an entry: the TOC ended


def test_a_judged_example_starting_with_an_asterisk_is_not_a_list_item(tmp_path: Path) -> None:
    runs = [(72, 90 + 13 * i, FILLER, 10, "helv") for i in range(4)]
    runs += [(72, 160, "(2)", 10, "helv"), (100, 160, "* Here another is.", 10, "helv")]
    lines = markdown_of(text_pdf(tmp_path / "ex.pdf", runs)).splitlines()
    assert "\\* Here another is." in lines  # escaped, so Markdown shows the asterisk
    assert not any(line.startswith(("- Here", "* Here")) for line in lines)


def test_a_line_end_hyphen_is_joined_only_into_a_word_the_document_has(tmp_path: Path) -> None:
    runs = [(72, 90, "Each example sits in an exe-", 10, "helv"),
            (72, 103, "environment, and words hyphen-", 10, "helv"),
            (72, 116, "ated at a line end are joined when hyphenated occurs whole.", 10, "helv")]
    runs += [(72, 150 + 13 * i, FILLER, 10, "helv") for i in range(3)]
    markdown = markdown_of(text_pdf(tmp_path / "hy.pdf", runs))
    assert "exe-environment" in markdown and "exeenvironment" not in markdown
    assert "words hyphenated at a line end" in markdown


def test_monospaced_listings_are_fenced_with_their_indentation(tmp_path: Path) -> None:
    code = "def total(items):\n    count = 0\n    for item in items:\n        count += item\n" \
           "    return count"
    markdown = markdown_of(story_pdf(tmp_path / "code.pdf", f"<p>{FILLER}</p><pre>{code}</pre>"
                                     f"<p>{FILLER}</p>"))
    assert f"```\n{code}\n```" in markdown


def test_a_numbered_listing_is_one_fenced_block_without_its_line_numbers(tmp_path: Path) -> None:
    code = ["\\begin{exe}", "\\ex Here is one.", "\\ex[*]{Here another is.}", "\\end{exe}"]
    runs = [(72, 90 + 13 * i, FILLER, 10, "helv") for i in range(3)]
    for i, line in enumerate(code):
        runs.append((80, 150 + 12 * i, str(i + 1), 7, "helv"))  # the listing's line numbers
        runs.append((100, 150 + 12 * i, line, 10, "cour"))
    markdown = markdown_of(text_pdf(tmp_path / "listing.pdf", runs))
    assert "```\n" + "\n".join(code) + "\n```" in markdown


def test_a_grid_table_is_one_pipe_row_per_table_row(tmp_path: Path) -> None:
    cell = 'style="border: 1px solid black; padding: 2px"'
    rows = [["Name", "Value", "Unit"], ["alpha", "1.5", "s"], ["beta", "2", "m"],
            ["gamma", "30", "kg"]]
    html = "<table>" + "".join("<tr>" + "".join(f"<td {cell}>{c}</td>" for c in row) + "</tr>"
                               for row in rows) + "</table>"
    path = story_pdf(tmp_path / "grid.pdf", f"<p>{FILLER}</p>{html}<p>{FILLER}</p>")
    markdown = markdown_of(path, tables=True)
    assert "| Name | Value | Unit |\n| --- | --- | --- |\n| alpha | 1.5 | s |\n" \
           "| beta | 2 | m |\n| gamma | 30 | kg |" in markdown
    assert "Col2" not in markdown and "<br>" not in markdown
    assert "#### Name" not in markdown  # the header row is in the table, not a heading


def test_a_table_ruled_only_between_sections_is_one_row_per_line(tmp_path: Path) -> None:
    """As in a cheat sheet: rules around each section; inside, one line per entry in each
    of two columns (the old output put a section's lines into one ``<br>``-joined cell)."""
    runs: list[tuple[float, float, str, float, str]] = []
    rules = []
    y = 100.0
    for section, entries in (("Setup", [("line numbers", "\\makeverselinenumbers"),
                                        ("running heads", "\\leftheader{}"),
                                        ("indexing", "\\indexingontrue")]),
                             ("Notes", [("text notes", "\\textnote{}"),
                                        ("emendations", "\\emendation{}")])):
        rules.append((72, y, 520, y))
        runs.append((76, y + 12, section, 10, "hebo"))
        y += 16
        rules.append((72, y, 520, y))
        for left, right in entries:
            runs += [(76, y + 12, left, 10, "helv"), (270, y + 12, right, 10, "cour")]
            y += 14
        y += 4
    rules.append((72, y, 520, y))
    markdown = markdown_of(text_pdf(tmp_path / "sheet.pdf", runs, rules), tables=True)
    assert "| Setup |  |\n| --- | --- |\n| line numbers | \\makeverselinenumbers |\n" \
           "| running heads | \\leftheader{} |\n| indexing | \\indexingontrue |\n" \
           "| Notes |  |\n| text notes | \\textnote{} |\n| emendations | \\emendation{} |" \
           in markdown
    assert "<br>" not in markdown


def test_the_authors_and_date_under_a_title_are_text_not_headings(tmp_path: Path) -> None:
    """LaTeX's title block: a 17 pt title, 12 pt authors and date (larger than the body,
    not bold), then a bold section heading and the body."""
    runs = [(200, 150, "The langnames package", 17, "helv"),
            (180, 180, "Alejandro Garcia Matarredona", 12, "helv"),
            (380, 180, "Niranjan", 12, "helv"),
            (240, 205, "January 4, 2023", 12, "helv"),
            (72, 250, "1 Introduction", 14, "hebo")]
    runs += [(72, 275 + 13 * i, FILLER, 10, "helv") for i in range(8)]
    runs += [(72, 400, "1.1 Scope", 12, "hebo")]  # 12 pt stays a heading size
    runs += [(72, 425 + 13 * i, FILLER, 10, "helv") for i in range(8)]
    markdown = markdown_of(text_pdf(tmp_path / "byline.pdf", runs))
    assert markdown.startswith("# The langnames package\n")
    lines = markdown.splitlines()
    assert "January 4, 2023" in lines and "Alejandro Garcia Matarredona" in markdown
    assert not any(line.startswith("#") and ("January" in line or "Alejandro" in line)
                   for line in lines)
    assert "## 1 Introduction" in lines and "### 1.1 Scope" in lines


def test_an_index_with_leaders_and_page_lists_stays_text(tmp_path: Path) -> None:
    """ltxdoc's index: dot leaders, then lists of page numbers. Not a TOC: no list, and
    no reference is lost."""
    runs = [(72, 150, "Index", 14, "hebo")]
    names = ("\\@astanza@line", "\\@auxout", "\\@chapter", "\\@checking", "\\@currentlabel",
             "\\@cs@linesinparL")
    for i, name in enumerate(names):
        pages = f"{1730 + i}, {1733 + i}, {1741 + i}" if i < 3 else f"{2202 + i}"
        runs += [(72, 180 + 14 * i, name, 10, "helv"),
                 (200, 180 + 14 * i, " .".join([""] * 20), 10, "helv"),
                 (320, 180 + 14 * i, pages, 10, "helv")]
    runs += [(72, 300 + 13 * i, FILLER, 10, "helv") for i in range(3)]
    markdown = markdown_of(text_pdf(tmp_path / "index.pdf", runs))
    assert "\n- \\@" not in markdown and "1730, 1733, 1741" in markdown and "2205" in markdown
