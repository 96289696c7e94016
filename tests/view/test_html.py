"""The HTML report in a real browser: headless Chromium, network cut, every chart drawn, nothing fetched."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.view.browser import Browser, chromium
from tests.view.conftest import make_trials

pytest.importorskip("plotly", reason="the HTML report needs the report extra (Plotly)")
BINARY = chromium()
pytestmark = pytest.mark.skipif(BINARY is None, reason="no Chromium here (apt-get install chromium; CI installs it)")

#: Text that would run as markup if the page ever set trial text as HTML.
HOSTILE = "echo '<img src=x onerror=\"window.pwned=1\"></script><script>window.pwned=2</script>'"


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("html")
    rules = {"max_calls": 4, "max_call_tokens": 50}
    make_trials(root, "abc", ["echo hello", "seq 1 300", "sleep 0.2; exit 1", HOSTILE, "echo refused"], rules)
    make_trials(root, ["odd"], ["echo hi"], {**rules, "max_tokens": 10})
    # Trial c tampered with: its second call's record edited, so the chain breaks at the third (line 4).
    log = root / "c" / "l.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"status":"truncated"', b'"status":"ok"')
    log.write_bytes(b"".join(lines))
    out = root / "report.html"
    done = subprocess.run(
        [sys.executable, "-m", "trialtool", "report", "--format", "html", "-o", str(out), str(root)],
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr  # trial c failed
    return out


@pytest.fixture
def browser() -> Iterator[Browser]:
    assert BINARY is not None
    opened = Browser(BINARY)
    try:
        yield opened
    finally:
        opened.close()


def test_the_page_is_self_contained(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert text.count("<script") == 5  # Plotly, three JSON documents, our script
    start = text.index("<script>")
    ours = text[:start] + text[text.index("</script>", start) :]  # all but Plotly's own bundle
    assert "http://" not in ours and "https://" not in ours and "<link" not in ours


@pytest.mark.timeout(180)
def test_the_report_renders_offline_without_errors(page: Path, browser: Browser, tmp_path: Path) -> None:
    browser.open(page.as_uri())
    assert browser.evaluate("document.body.dataset.ready") == "yes"
    # Four overview charts drawn by Plotly, each with its SVG.
    assert browser.evaluate("document.querySelectorAll('.charts .js-plotly-plot .main-svg').length") >= 4
    assert browser.evaluate("document.querySelectorAll('#trials tbody tr.trial').length") == 4
    # Two markers, told apart by a legend: other rules (odd) and a failed verdict (c), with its reason in the row.
    assert browser.evaluate("document.querySelectorAll('#trials tbody tr.other-rules').length") == 1
    assert browser.evaluate("document.querySelectorAll('#trials tbody td.other-rules-cell').length") == 1
    failed = browser.evaluate("[...document.querySelectorAll('#trials tbody td.v-failed')].map(c => c.textContent)")
    assert len(failed) == 1 and failed[0].startswith("failed: line 4") and "chain broken" in failed[0], failed
    legend = browser.evaluate("document.getElementById('legend').textContent")
    assert "other rules" in legend and "failed" in legend
    assert "fairness: 1 trial differs" in browser.evaluate("document.getElementById('overview-list').textContent")
    # Open the first trial of the majority: its burn-down, its timeline, its calls with what the agent read.
    browser.evaluate("document.querySelectorAll('#trials tbody tr.trial')[1].click()")
    assert browser.evaluate("document.querySelectorAll('.detail .js-plotly-plot .main-svg').length") >= 2
    assert browser.evaluate("document.querySelectorAll('.detail table.calls tbody tr').length") == 5
    shown = browser.evaluate("document.querySelector('.detail').textContent")
    assert "hello" in shown and "clipped" in shown and "window.pwned=2" in shown
    assert browser.evaluate("typeof window.pwned") == "undefined"  # trial text stays text
    assert browser.evaluate("document.querySelectorAll('.detail img').length") == 0
    # The timeline lists the calls by call number, with the trial's time limit drawn.
    order = browser.evaluate("document.querySelectorAll('.detail .js-plotly-plot')[1].layout.yaxis.categoryarray")
    assert order == ["#1 r2", "#2 r3", "#3 r4", "#4 r5", "#5 r6"], order
    assert "trial limit 3600 s" in browser.evaluate("document.querySelector('.detail').textContent")
    # The tampered trial: its first bad record is highlighted in its calls, the reason beside it.
    browser.evaluate("document.querySelector('.detail-row').remove()")
    browser.evaluate(
        "[...document.querySelectorAll('#trials tbody tr.trial')].find(r => r.textContent.includes('c/s.json')).click()"
    )
    bad = browser.evaluate("[...document.querySelectorAll('.detail tr.bad-record')].map(r => r.textContent)")
    assert len(bad) == 1 and bad[0].startswith("43") and "failed here: line 4" in bad[0], bad
    # The filter narrows the table.
    browser.evaluate(
        "const f = document.getElementById('filter'); f.value = 'odd'; f.dispatchEvent(new Event('input'))"
    )
    assert browser.evaluate("document.querySelectorAll('#trials tbody tr.trial').length") == 1
    screenshot = tmp_path / "report.png"
    browser.screenshot(screenshot)
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 10_000
    assert browser.errors() == []
    assert browser.requests() == [page.as_uri()]
