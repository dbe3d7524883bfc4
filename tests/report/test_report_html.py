"""`finetwin report --format html`: one self-contained file, its figures embedded, checked as text and in a
real headless Chromium that may fetch nothing but the file itself."""

from __future__ import annotations

import base64
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from calibrate.report import Report, build_report
from calibrate.report.html import FigureMissingError, render_html
from finetwin.cli import main
from tests.report.conftest import row, write_bench

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


class _Collector(HTMLParser):
    """Every URL-bearing attribute and every table of the document."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href") and value is not None:
                self.urls.append((tag, name, value))


def small_bench(path: Path) -> Path:
    return write_bench(
        path,
        [
            row(tps=1000, gpus=1, batch=4),
            row(tps=1300, gpus=1, batch=8),
            row(tps=1900, gpus=2, batch=8),
            row(gpus=2, batch=3),
            row(tps=1100, gpus=1, batch=4, fast_kernels=True),
        ],
    )


@pytest.fixture(scope="module")
def html_report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    """One report with report.html, built once for the tests that only read it."""
    directory = tmp_path_factory.mktemp("html")
    return build_report(small_bench(directory / "b.csv"), directory / "out", formats=("md", "html"))


def test_cli_format_html_writes_a_self_contained_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "report"
    assert (
        main(
            ["report", "--bench", str(small_bench(tmp_path / "b.csv")), "--out", str(out), "--format", "html"]
        )
        == 0
    )
    assert "report.html (self-contained" in capsys.readouterr().out
    html = (out / "report.html").read_text(encoding="utf-8")
    parsed = _Collector()
    parsed.feed(html)
    figures = sorted(p.name for p in out.glob("*.png"))
    images = [value for tag, name, value in parsed.urls if tag == "img"]
    assert len(images) == len(figures) >= 4
    # Nothing outside the file: every URL is an embedded image; no script, no style sheet link.
    assert all(value.startswith("data:image/png;base64,") for _, _, value in parsed.urls)
    assert "script" not in parsed.tags and "link" not in parsed.tags
    embedded = sorted(base64.b64decode(value.split(",", 1)[1]) for value in images)
    assert embedded == sorted((out / name).read_bytes() for name in figures)
    assert all(data.startswith(PNG_MAGIC) for data in embedded)
    # The Markdown tables came through as tables, with Table 1's rounded shares.
    assert parsed.tags.count("table") >= 4
    assert re.search(r"<h2>Q1 — Will the job run\?</h2>", html)
    assert (out / "report.md").is_file() and (out / "numbers.json").is_file()


def test_markdown_format_removes_an_html_file_left_by_an_earlier_report(
    html_report: Report, tmp_path: Path
) -> None:
    assert html_report.report_html is not None and html_report.report_html.is_file()
    out = tmp_path / "out"
    shutil.copytree(html_report.out_dir, out)
    again = build_report(small_bench(tmp_path / "b.csv"), out)
    assert again.report_html is None and not (out / "report.html").exists()


def test_unknown_format_and_a_missing_figure_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown report format.*'pdf'"):
        build_report(small_bench(tmp_path / "b.csv"), tmp_path / "out", formats=("pdf",))
    with pytest.raises(FigureMissingError, match="gone.png"):
        render_html("![a figure](gone.png)", tmp_path, title="t")
    (tmp_path / "secret.png").write_bytes(PNG_MAGIC)
    with pytest.raises(FigureMissingError, match="not a PNG figure"):
        render_html("![outside](../secret.png)", tmp_path / "out", title="t")


@pytest.mark.browser
def test_chromium_shows_every_figure_with_the_network_cut(
    html_report: Report, tmp_path: Path, chromium_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    report = html_report
    assert report.report_html is not None
    # Alone in an empty directory: the PNG files beside report.md cannot help it.
    alone = tmp_path / "mail" / "report.html"
    alone.parent.mkdir()
    alone.write_bytes(report.report_html.read_bytes())
    requested: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium_path), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.route("**/*", lambda route: (requested.append(route.request.url), route.continue_()))
            page.goto(alone.as_uri())
            page.wait_for_load_state("load")
            sizes = page.eval_on_selector_all(
                "img", "imgs => imgs.map(i => [i.complete, i.naturalWidth, i.naturalHeight])"
            )
            headings = page.eval_on_selector_all("h2", "hs => hs.map(h => h.textContent)")
        finally:
            browser.close()
    drawn = [f for f in report.figures.values() if f is not None]
    assert len(sizes) == len(drawn) >= 4
    assert all(complete and width > 300 and height > 200 for complete, width, height in sizes)
    assert requested == [alone.as_uri()]  # the page itself and nothing else
    assert "Q4 — How to go faster?" in headings


@pytest.mark.parametrize(
    ("argv", "formats"),
    [
        (["--bench", "bundled", "--format", "html"], ("md", "html")),
        (["--format", "html", "--bench", "bundled"], ("md", "html")),
        (["--bench", "bundled"], ("md",)),
    ],
)
def test_cli_names_the_bundled_sample_and_the_format_in_any_order(
    argv: list[str],
    formats: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only the command's glue: which table and which formats reach build_report (drawn elsewhere)."""
    import calibrate.report.build as build

    seen: dict[str, object] = {}

    def record(table: object, out_dir: Path, *, source: str, formats: tuple[str, ...]) -> Report:
        seen.update(rows=len(table), source=source, formats=formats)  # type: ignore[arg-type]
        out = Path(out_dir)
        html = out / "report.html" if "html" in formats else None
        return Report(out, out / "report.md", out / "numbers.json", {}, {}, "now", source, html)

    monkeypatch.setattr(build, "build_report", record)
    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    assert main(["report", *argv, "--out", str(tmp_path / "out")]) == 0
    assert seen["rows"] == 3983 and str(seen["source"]).endswith("llmftbench_sample.csv")
    assert seen["formats"] == formats
