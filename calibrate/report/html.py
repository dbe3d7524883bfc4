"""report.html: the same report as report.md in one self-contained file, for people who share it by mail.

The Markdown is converted by markdown-it-py (CommonMark plus tables, the dialect report.md is written in)
and every figure is embedded as a base64 PNG data URI, so the file shows its figures with nothing beside
it, offline, and without fetching anything: no scripts, no external style sheets, no links to files.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt

HTML_FILE = "report.html"

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; line-height: 1.45;
       max-width: 70rem; margin: 2rem auto; padding: 0 1rem; color: #1d1d1f; }
h1, h2, h3 { line-height: 1.2; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: .2rem; margin-top: 2.2rem; }
table { border-collapse: collapse; margin: 1rem 0; font-size: .9rem; }
th, td { border: 1px solid #ccc; padding: .25rem .55rem; text-align: left; vertical-align: top; }
th { background: #f3f5f8; }
tr:nth-child(even) td { background: #fafbfc; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
code { background: #f3f3f3; padding: 0 .2rem; border-radius: 3px; }
"""


class FigureMissingError(ValueError):
    """report.md names a figure that is not in the report's directory, so the HTML could not embed it."""


def render_html(markdown_text: str, out_dir: Path, *, title: str) -> str:
    """report.md's text as one HTML document whose figures (files in `out_dir`) are embedded."""
    return html_document(markdown_body(markdown_text, lambda src: _data_uri(out_dir, src)), title=title)


def markdown_body(markdown_text: str, image_src: Callable[[str], str]) -> str:
    """The Markdown as HTML (raw HTML in it escaped, not passed through); each image's source is what
    `image_src` makes of the one written (it may raise to refuse it)."""
    converter = MarkdownIt("commonmark", {"html": False}).enable("table")
    default_image = converter.renderer.rules["image"]

    def image(renderer: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
        token = tokens[idx]
        token.attrSet("src", image_src(str(token.attrGet("src"))))
        return str(default_image(tokens, idx, options, env))

    converter.add_render_rule("image", image)
    return str(converter.render(markdown_text))


def html_document(body: str, *, title: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n"
        f"<body>\n{body}</body>\n</html>\n"
    )


def style_source() -> str:
    """The CSP source that lets the document's one style element apply and nothing else (its hash): a page
    served under a policy without 'unsafe-inline' would show unstyled."""
    digest = hashlib.sha256(_STYLE.encode()).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


def _data_uri(out_dir: Path, src: str) -> str:
    path = (out_dir / src).resolve()
    # Only the report's own PNG figures are embedded; anything else would make the file depend on the disk.
    if path.parent != out_dir.resolve() or path.suffix != ".png" or not path.is_file():
        raise FigureMissingError(f"report.md shows {src!r}, which is not a PNG figure in {out_dir}")
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")
