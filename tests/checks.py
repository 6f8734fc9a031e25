"""Checks and input strategies that tests of both layers share."""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import strategies as st

from conftest import CHROMIUM_ARGS
from tuner.traces.records import Trace


def assert_valid(trace: Trace) -> None:
    assert trace.requests
    arrivals = [r.arrival_s for r in trace.requests]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0
    for r in trace.requests:
        assert r.input_tokens >= 1 and r.output_tokens >= 1 and math.isfinite(r.arrival_s)
        assert all(isinstance(b, int) and b >= 0 for b in r.prefix_blocks)


def mostly(plausible: st.SearchStrategy, junk: st.SearchStrategy) -> st.SearchStrategy:
    """`plausible` nine times in ten, so that fuzzing reaches valid traces as well as every error."""
    return st.integers(0, 9).flatmap(lambda k: junk if k == 0 else plausible)


def check_page_in_chromium(page_path: Path, screenshot: Path) -> dict:
    """Open the page from file:// in headless Chromium: every plot drawn, no JavaScript error, nothing
    fetched from a network. Returns what was found, for further checks."""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    fetched: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
            page.on("console", lambda msg: errors.append(f"console {msg.type}: {msg.text}")
                    if msg.type == "error" else None)
            page.on("request", lambda r: fetched.append(r.url))
            page.goto(page_path.resolve().as_uri(), wait_until="load")
            expected = page.eval_on_selector_all("[data-figure]", "els => els.map(e => e.dataset.figure)")
            page.wait_for_function(
                "n => document.querySelectorAll('.js-plotly-plot .main-svg').length >= n", arg=len(expected))
            drawn = page.eval_on_selector_all(".js-plotly-plot", """els => els.map(el => ({
                id: el.id, svg: el.querySelectorAll('svg.main-svg').length,
                traces: (el._fullData || []).length,
                marks: el.querySelectorAll('.point, .js-line, .bars path').length,
                figure: el.closest('[data-figure]') ? el.closest('[data-figure]').dataset.figure : null}))""")
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    assert not errors, errors
    remote = [u for u in fetched if not u.startswith(("file:", "data:", "blob:"))]
    assert not remote, f"the page fetched {remote}"
    assert sorted(d["figure"] for d in drawn) == sorted(expected)
    for d in drawn:
        assert d["svg"] > 0 and d["traces"] > 0 and d["marks"] > 0, d
    return {"figures": expected, "drawn": drawn}
