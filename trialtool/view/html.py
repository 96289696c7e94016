"""The report as one self-contained HTML page: overview, fairness, charts, a trial table, each trial's calls.

Everything is inline (the page makes no request, and works offline and from
a mail attachment): the data as JSON, a little script of our own, and
Plotly's JavaScript library, which draws the charts. Plotly comes with the
optional `trialtool[report]` extra (`pip install 'trialtool[report]'`); only
this module imports it. Text from trials (commands, delivered output) is
only ever set as text in the page, never as markup.

The page embeds the calls of at most `details` trials (flagged ones first),
each call's delivered text cut at report.TEXT_PREVIEW characters, so that a
report of a hundred thousand trials stays a file a browser opens.
"""

from __future__ import annotations

import html
import json
import os
from typing import IO, Any

from ..errors import UsageError
from .render import overview_lines

#: Trials whose calls the page embeds, by default.
DETAILS = 2000


def plotly_js() -> str:
    """Plotly's JavaScript bundle, or UsageError naming the extra that brings it."""
    try:
        from plotly.offline import get_plotlyjs  # type: ignore[import-untyped]
    except ImportError as exc:
        msg = "the HTML report needs Plotly: pip install 'trialtool[report]'"
        raise UsageError(msg) from exc
    return str(get_plotlyjs())


#: Nothing may be fetched: no source but the page's own inline scripts and styles, and data: images.
_CSP = (
    "default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
    "img-src data:; font-src data:; connect-src 'none'"
)


def _static(name: str) -> str:
    """One of the page's own files (view/static/), shipped with the package."""
    with open(os.path.join(os.path.dirname(__file__), "static", name), encoding="utf-8") as handle:
        return handle.read()


def _json(value: Any) -> str:
    """JSON safe inside a <script> element."""
    return json.dumps(value, separators=(",", ":")).replace("<", "\\u003c").replace("\u2028", "\\u2028")


def write(report: Any, out: IO[str], *, details: int = DETAILS, title: str = "trial-tool report") -> None:
    plotly = plotly_js()  # before anything is written: a missing extra leaves no half page
    overview = report.overview
    head = _HEAD.replace("TITLE", html.escape(title)).replace("CSP", _CSP).replace("STYLE", _static("report.css"))
    out.write(head)
    out.write(f"<script>{plotly}</script>\n")
    out.write('<script type="application/json" id="data-overview">' + _json(overview) + "</script>\n")
    out.write('<script type="application/json" id="data-lines">' + _json(overview_lines(overview)) + "</script>\n")
    out.write('<script type="application/json" id="data-trials">[')
    for index, summary in enumerate(report.trials(details=True)):
        if index >= details:
            summary.pop("calls", None)
        out.write(("," if index else "") + _json(summary))
    out.write("]</script>\n")
    out.write(f"<script>{_static('report.js')}</script>\n</body>\n</html>\n")


_HEAD = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="CSP">
<title>TITLE</title>
<style>STYLE</style>
</head>
<body>
<h1>TITLE</h1>
<ul class="overview" id="overview-list"></ul>
<h2>Fairness</h2>
<div id="fairness"></div>
<h2>Budget use across trials</h2>
<div class="charts"><div class="chart" id="chart-calls"></div><div class="chart" id="chart-tokens"></div>
<div class="chart" id="chart-seconds"></div><div class="chart" id="chart-ended"></div></div>
<h2>Trials</h2>
<div class="legend" id="legend">
<span class="other-rules-cell">other rules than the majority's (the fairness check)</span>
<span class="v-failed">failed, or signature_invalid: the files do not add up, or a signature does not hold</span>
<span class="v-doubt">unconfirmed, in flight, unverified or unsigned: not clean, not proven wrong</span></div>
<input id="filter" placeholder="filter: any text of the row (path, id, integrity, ended by)">
<span id="count" class="muted"></span>
<table id="trials"><thead><tr></tr></thead><tbody></tbody></table>
<button id="more" hidden>show more</button>
"""
