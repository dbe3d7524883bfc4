"""The dashboard at `/`: a static page (HTML, JS, CSS and the vendored Chart.js, no CDN) that calls the
`/v1` API with the key the user enters; and the latest characterization report, linked from it.

The page and its assets are open (they hold no data); every number on the page comes from `/v1`, which
needs a key. The report is derived from the public benchmark and is served read-only from the directory
`finetwin report` recorded as the latest (`calibrate.report.latest`).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import FileResponse, RedirectResponse
from pydantic import BaseModel

from advisor.deps import get_settings
from twin.settings import Settings

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


def _inside(root: Path, relative: str) -> Path:
    """The file `relative` under `root`, refusing anything that resolves outside it (../, symlinks)."""
    root = root.resolve()
    candidate = (root / relative).resolve()
    if not candidate.is_relative_to(root) or not candidate.is_file() or candidate.suffix not in _MEDIA_TYPES:
        raise HTTPException(status_code=404, detail=f"no file {relative!r}")
    return candidate


@router.get("/", include_in_schema=False)
def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type=_MEDIA_TYPES[".html"])


@router.get("/static/{name:path}", include_in_schema=False)
def static(name: str) -> FileResponse:
    path = _inside(STATIC, name)
    return FileResponse(path, media_type=_MEDIA_TYPES[path.suffix])


class LatestReport(BaseModel):
    available: bool
    url: str | None = None
    generated_at: str | None = None
    source: str | None = None


def _latest(settings: Settings) -> dict | None:
    from calibrate.report.latest import latest_report

    return latest_report(settings)


@router.get("/v1/reports/latest", response_model=LatestReport, tags=["reports"], summary="The latest report")
def latest_report_info(settings: Settings = Depends(get_settings)) -> LatestReport:
    pointer = _latest(settings)
    if pointer is None:
        return LatestReport(available=False)
    return LatestReport(
        available=True,
        url="/reports/latest/",
        generated_at=str(pointer.get("generated_at") or "") or None,
        source=str(pointer.get("source") or "") or None,
    )


@router.get("/reports/latest/", include_in_schema=False)
def latest_report_page(settings: Settings = Depends(get_settings)) -> RedirectResponse:
    pointer = _latest(settings)
    if pointer is None:
        raise HTTPException(status_code=404, detail="no report yet: run `finetwin report`")
    return RedirectResponse(url=f"/reports/latest/{Path(pointer['report_md']).name}")


@router.get("/reports/latest/{name:path}", include_in_schema=False)
def latest_report_file(name: str, settings: Settings = Depends(get_settings)) -> FileResponse:
    pointer = _latest(settings)
    if pointer is None:
        raise HTTPException(status_code=404, detail="no report yet: run `finetwin report`")
    path = _inside(Path(pointer["out_dir"]), name)
    return FileResponse(path, media_type=_MEDIA_TYPES[path.suffix])
