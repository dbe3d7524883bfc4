"""The dashboard at `/`: a static page (HTML, JS, CSS and the vendored Chart.js, no CDN) that calls the
`/v1` API with the key the user enters; and the latest characterization report, linked from it.

The page and its assets are open (they hold no data); every number on the page comes from `/v1`, which
needs a key. The report is derived from the public benchmark; of the directory `finetwin report` recorded
as the latest (`calibrate.report.latest`), only the files the report itself wrote are served (its
report.md, numbers.json and figures, as the pointer lists them), as text, JSON or PNG: never HTML or SVG,
which would run on the dashboard's origin, where the key sits in the browser's storage.

Every answer of this router carries a Content-Security-Policy: the page runs only its own scripts and
styles and talks only to its own origin; a report file may run nothing at all.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, Response
from pydantic import BaseModel

from advisor.deps import get_settings
from advisor.settings import AdvisorSettings

router = APIRouter(tags=["dashboard"])

STATIC = Path(__file__).resolve().parents[1] / "static"
_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".md": "text/plain; charset=utf-8",  # shown, not downloaded
    ".json": "application/json",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".csv": "text/plain; charset=utf-8",
}
# What a report may be served as: nothing a browser would run.
_REPORT_MEDIA_TYPES = {k: _MEDIA_TYPES[k] for k in (".md", ".json", ".png")}

# The dashboard: its own scripts, styles and images, requests to its own API; no inline script, no
# plugin, no framing. Chart.js sets canvas sizes through the CSSOM, which style-src does not restrict.
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
# A report file: shown, never run (a sandbox with no permission, nothing loaded).
REPORT_POLICY = "default-src 'none'; img-src 'self'; sandbox; frame-ancestors 'none'"
# The report rendered as a page: the same, and its one style element (by its hash).
REPORT_PAGE_POLICY = "default-src 'none'; img-src 'self'; style-src {style}; sandbox; frame-ancestors 'none'"


def _headers(policy: str) -> dict[str, str]:
    return {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }


def _inside(root: Path, relative: str) -> Path:
    """The file `relative` under `root`, refusing anything that resolves outside it (../, symlinks)."""
    root = root.resolve()
    candidate = (root / relative).resolve()
    if not candidate.is_relative_to(root) or not candidate.is_file() or candidate.suffix not in _MEDIA_TYPES:
        raise HTTPException(status_code=404, detail=f"no file {relative!r}")
    return candidate


@router.get("/", include_in_schema=False)
def index() -> FileResponse:
    return FileResponse(
        STATIC / "index.html", media_type=_MEDIA_TYPES[".html"], headers=_headers(PAGE_POLICY)
    )


@router.get("/static/{name:path}", include_in_schema=False)
def static(name: str) -> FileResponse:
    path = _inside(STATIC, name)
    return FileResponse(path, media_type=_MEDIA_TYPES[path.suffix], headers=_headers(PAGE_POLICY))


class LatestReport(BaseModel):
    available: bool
    url: str | None = None
    generated_at: str | None = None
    source: str | None = None


def _latest(settings: AdvisorSettings) -> dict | None:
    from calibrate.report.latest import latest_report

    return latest_report(settings)


@router.get("/v1/reports/latest", response_model=LatestReport, tags=["reports"], summary="The latest report")
def latest_report_info(settings: AdvisorSettings = Depends(get_settings)) -> LatestReport:
    pointer = _latest(settings)
    if pointer is None:
        return LatestReport(available=False)
    return LatestReport(
        available=True,
        url="/reports/latest/",
        generated_at=str(pointer.get("generated_at") or "") or None,
        source=str(pointer.get("source") or "") or None,
    )


def report_files(pointer: dict) -> dict[str, Path]:
    """The files the report wrote, by their path under its directory: what the pointer lists (report.md,
    numbers.json, the figures), inside the directory, of a type that is only ever shown."""
    root = Path(pointer["out_dir"]).resolve()
    figures = pointer.get("figures") or {}
    listed = [pointer.get("report_md"), pointer.get("numbers_json"), *figures.values()]
    files: dict[str, Path] = {}
    for entry in listed:
        if not isinstance(entry, str) or not entry:
            continue
        path = Path(entry).resolve()
        if path.is_relative_to(root) and path.suffix in _REPORT_MEDIA_TYPES:
            files[path.relative_to(root).as_posix()] = path
    return files


@router.get("/reports/latest/", include_in_schema=False)
def latest_report_page(settings: AdvisorSettings = Depends(get_settings)) -> HTMLResponse:
    """The report as a page: report.md rendered (it was served as its Markdown text, which a browser shows
    raw), its figures linked to the files beside it, under a policy that runs nothing."""
    from calibrate.report.html import html_document, markdown_body, style_source

    pointer = _latest(settings)
    if pointer is None:
        raise HTTPException(status_code=404, detail="no report yet: run `finetwin report`")
    files = report_files(pointer)
    # Only the report's own figures: a source it did not write shows the figure's words instead.
    markdown = Path(pointer["report_md"]).read_text(encoding="utf-8")
    body = markdown_body(markdown, lambda src: src if src in files else "")
    source = str(pointer.get("source") or "")
    page = html_document(body, title=f"Characterization report{': ' + source if source else ''}")
    return HTMLResponse(page, headers=_headers(REPORT_PAGE_POLICY.format(style=style_source())))


@router.get("/reports/latest/{name:path}", include_in_schema=False)
def latest_report_file(name: str, settings: AdvisorSettings = Depends(get_settings)) -> Response:
    pointer = _latest(settings)
    if pointer is None:
        raise HTTPException(status_code=404, detail="no report yet: run `finetwin report`")
    path = report_files(pointer).get(name)
    if path is None or not path.is_file():
        raise HTTPException(status_code=404, detail=f"the report has no file {name!r}")
    return FileResponse(path, media_type=_REPORT_MEDIA_TYPES[path.suffix], headers=_headers(REPORT_POLICY))
