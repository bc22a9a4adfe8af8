"""A report as sections, rendered to Markdown (report.md) and to a self-contained index.html."""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from radixflow.report.tables import Table


@dataclass
class Section:
    title: str
    text: list[str] = field(default_factory=list)  # paragraphs (plain text, Markdown-safe)
    tables: list[Table] = field(default_factory=list)
    image: str | None = None  # PNG file name next to the report
    bullets: list[str] = field(default_factory=list)


def markdown(title: str, sections: list[Section]) -> str:
    out = [f"# {title}", ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        for p in s.text:
            out += [p, ""]
        out += [f"- {b}" for b in s.bullets] + ([""] if s.bullets else [])
        if s.image:
            out += [f"![{s.title}]({s.image})", ""]
        for t in s.tables:
            out += [t.markdown()]
    return "\n".join(out).rstrip() + "\n"


def _table_html(t: Table) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in t.headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in t.rows)
    note = f"<p class='note'>{html.escape(t.note)}</p>" if t.note else ""
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return f"<h3>{html.escape(t.title)}</h3>{table}{note}"


_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1400px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;
text-align:right}th{background:#f0f0f0}td:first-child,td:nth-child(2){text-align:left}
img{max-width:100%;border:1px solid #ddd}.note{font-size:12px;color:#555}.warn{color:#a00}"""


def page(title: str, sections: list[Section]) -> str:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"
    ]
    for s in sections:
        parts.append(f"<h2>{html.escape(s.title)}</h2>")
        parts += [f"<p>{html.escape(p)}</p>" for p in s.text]
        if s.bullets:
            parts.append("<ul>" + "".join(f"<li class='warn'>{html.escape(b)}</li>" for b in s.bullets) + "</ul>")
        if s.image:
            parts.append(f"<img src='{html.escape(s.image)}' alt='{html.escape(s.title)}'>")
        parts += [_table_html(t) for t in s.tables]
    parts.append("</body></html>\n")
    return "\n".join(parts)
