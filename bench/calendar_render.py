"""The booking calendar in a real browser: how long a dense week takes to draw, and each interaction after it.

What it measures
    The lab of bench/calendar_data.py (8 nodes x 8 GPUs, two-hour bookings back to back on every GPU:
    5,376 in the current week, the same density in ``--history-weeks`` weeks before it), served by
    daphne (DEBUG=0, static files collected into a temporary folder, started by bench/_server.py). One
    of the 16 booking users logs in with Playwright's sync API in Debian's Chromium (headless, the
    browser tests' arguments) and opens the calendar in the week view; then, on that page:

    1. load: the first paint of a dense day and of the dense week on a fresh page, from the moment
       the range's data arrived (the ``calendar-data`` performance mark calendar.js sets when the
       API answered) to the first frame after the last change to the calendar's DOM;
    2. the interactions: collapse a node, expand it again, previous week, next week (both dense),
       switch to the day view, next day, back to the week view. For each: from the click to the
       first frame after the last DOM change ("wall", network included where the action loads
       data), and the main thread's long tasks (over 50 ms, what makes a page feel stuck) in that
       window ("main thread").

    The page is loaded ``--repeat`` times (a fresh page each time, the interactions after each
    load); printed: p50 and max per measure, in milliseconds, and what was drawn (events, DOM size).
    A frame is seen with requestAnimationFrame, the DOM changes with a MutationObserver (the now
    indicator's own timer left out), long tasks with a PerformanceObserver; the calendar counts as
    drawn when nothing changed for 400 ms. "main thread" leaves out tasks under 50 ms, so it can be
    less than "data to paint", which also holds the frames and the browser's own work in between.

    ``--profile FILE`` also records a CPU profile of the first load and the first interactions
    (Chrome DevTools' .cpuprofile format: open it in the Performance panel).

How to run it
    It needs PostgreSQL, a database whose name contains "bench" (every run empties it and loads the
    lab anew, with COPY), and chromium (apt-get install chromium):

        DATABASE_URL=postgres://portal:portal@127.0.0.1:5432/portal_bench_render \
            .venv/bin/python bench/calendar_render.py
        ... bench/calendar_render.py --repeat 10 --profile var/calendar.cpuprofile

    The machine it runs on matters more than anything else here: figures are for its CPUs (printed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.* and the portal

from bench._server import serving
from bench.benchdb import open_database, percentile_ms
from bench.calendar_data import NODE_COUNT, USER_PREFIX, load_lab
from tests.browser.helpers import CHROMIUM_ARGS, CHROMIUM_CANDIDATES, chromium_path, log_in

PASSWORD = "bench-render-password"  # noqa: S105 - a throw-away user of the benchmark database
VIEW_KEY = "gpu-calendar-view"
QUIET_MS = 400
NODE_TO_TOGGLE = 1  # the second node: in view, with rows in view below it (drawn again)

# Installed before the page's own scripts: frames, DOM changes and long tasks, in page time.
OBSERVERS = """
(() => {
  const b = window.__bench = {lastMutation: 0, frames: [], tasks: []};
  new PerformanceObserver((list) => {
    for (const task of list.getEntries()) b.tasks.push([task.startTime, task.startTime + task.duration]);
  }).observe({type: 'longtask', buffered: true});
  // The now indicator moves on a timer of its own: not drawing.
  const drawing = (record) => !record.target.classList?.contains('ec-now-indicator');
  const observer = new MutationObserver((records) => {
    if (records.some(drawing)) b.lastMutation = performance.now();
  });
  const watch = () => observer.observe(document.getElementById('calendar') || document.body,
    {subtree: true, childList: true, attributes: true, characterData: true});
  document.readyState === 'loading' ? document.addEventListener('DOMContentLoaded', watch) : watch();
  const frame = () => requestAnimationFrame(() => {
    const at = performance.now();
    setTimeout(() => { b.frames.push([at, performance.now()]); if (b.frames.length > 2000) b.frames.splice(0, 1000); });
    frame();
  });
  frame();
})();
"""

# Waits until the calendar is drawn; returns when (page time), the long tasks since `since`, and counts.
SETTLE = """
async ([since, quietMs]) => {
  const b = window.__bench;
  const calendar = document.getElementById('calendar');
  for (;;) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    const busy = calendar.getAttribute('aria-busy') === 'true';
    if (!busy && performance.now() - Math.max(b.lastMutation, since) > quietMs) break;
  }
  const last = Math.max(b.lastMutation, since);
  const frame = b.frames.find(([raf]) => raf > last);
  const end = frame ? frame[1] : last;
  const overlap = ([start, stop]) => Math.max(0, Math.min(stop, end) - Math.max(start, since));
  const work = b.tasks.reduce((sum, task) => sum + overlap(task), 0);
  const marks = performance.getEntriesByName('calendar-data');
  const data = marks.length ? marks[marks.length - 1].startTime : null;
  return {
    end, work, data: data !== null && data >= since ? data : null,
    events: calendar.querySelectorAll('.ec-event').length,
    bgEvents: calendar.querySelectorAll('.ec-bg-event').length,
    nodes: calendar.getElementsByTagName('*').length,
    title: calendar.querySelector('.ec-title')?.textContent ?? '',
  };
}
"""

# Clicks the element in the page (no Playwright actionability round trips) and returns the page time.
CLICK = """
([selector, index]) => {
  const target = document.querySelectorAll(selector)[index];
  if (!target) throw new Error(`nothing matches ${selector} [${index}]`);
  const at = performance.now();
  target.click();
  return at;
}
"""


# --- setup ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat", type=int, default=5, help="page loads, each followed by the interactions (default 5)"
    )
    parser.add_argument(
        "--history-weeks", type=int, default=1, help="dense weeks before the current one (default 1: previous week)"
    )
    parser.add_argument("--profile", type=Path, help="write a CPU profile of the first load and interactions here")
    parser.add_argument("--headed", action="store_true", help="show the browser (needs a display)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.history_weeks < 1:
        parser.error("--repeat and --history-weeks must be at least 1")
    return args


def researcher_with_password() -> Any:
    """One of the booking users (so some bookings are theirs), with a password to log in."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.get(username=f"{USER_PREFIX}0")
    user.set_password(PASSWORD)
    user.save(update_fields=["password"])
    return user


def collect_static(into: Path) -> None:
    from django.core.management import call_command

    call_command("collectstatic", interactive=False, verbosity=0)
    print(f"static files collected into {into}")


# --- measuring ------------------------------------------------------------------------------


class Page:
    """One Playwright page on the calendar, and the figures it collects."""

    def __init__(self, page: Any, base: str) -> None:
        self.page = page
        self.base = base
        self.figures: dict[str, dict[str, list[float]]] = {}
        self.drawn: dict[str, dict[str, Any]] = {}

    def record(self, action: str, since: float, settled: dict[str, Any]) -> None:
        row = self.figures.setdefault(action, {"wall": [], "main thread": [], "data to paint": []})
        row["wall"].append((settled["end"] - since) / 1000)
        row["main thread"].append(settled["work"] / 1000)
        if settled["data"] is not None:
            row["data to paint"].append((settled["end"] - settled["data"]) / 1000)
        self.drawn[action] = settled

    def settle(self, since: float) -> dict[str, Any]:
        return self.page.evaluate(SETTLE, [since, QUIET_MS])

    def load(self, view: str, action: str) -> None:
        self.page.evaluate(f"localStorage.setItem('{VIEW_KEY}', '{view}')")  # the view the page opens in
        self.page.goto(f"{self.base}/")
        self.record(action, 0, self.settle(0))

    def click(self, action: str, selector: str, index: int = 0) -> None:
        since = self.page.evaluate(CLICK, [selector, index])
        self.record(action, since, self.settle(since))

    def toggle_node(self) -> None:
        expander = ".ec-sidebar .ec-expander button"
        label = self.page.evaluate(
            f"document.querySelectorAll('{expander}')[{NODE_TO_TOGGLE}].getAttribute('aria-label')"
        )
        first, second = ("expand", "collapse") if label == "Expand" else ("collapse", "expand")
        self.click(f"{first} a node", expander, NODE_TO_TOGGLE)
        self.click(f"{second} a node", expander, NODE_TO_TOGGLE)

    def interactions(self) -> None:
        self.toggle_node()
        self.click("previous week", ".ec-toolbar .ec-prev")
        self.click("next week", ".ec-toolbar .ec-next")
        self.click("day view", ".ec-toolbar .ec-resourceTimelineDay")
        self.click("next day", ".ec-toolbar .ec-next")
        self.click("week view", ".ec-toolbar .ec-resourceTimelineWeek")


def run_browser(base: str, username: str, chromium: str, args: argparse.Namespace) -> Page:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=not args.headed)
        context = browser.new_context(viewport={"width": 1400, "height": 900}, timezone_id="UTC")
        page = context.new_page()
        log_in(page, base, username, PASSWORD)
        context.add_init_script(OBSERVERS)
        measured = Page(page, base)
        cdp = None
        if args.profile:
            cdp = context.new_cdp_session(page)
            cdp.send("Profiler.enable")
            cdp.send("Profiler.setSamplingInterval", {"interval": 200})
            cdp.send("Profiler.start")
        for round_ in range(args.repeat):
            measured.load("resourceTimelineDay", "load: dense day")
            measured.load("resourceTimelineWeek", "load: dense week")
            measured.interactions()
            if cdp is not None and round_ == 0:
                profile = cdp.send("Profiler.stop")["profile"]
                args.profile.parent.mkdir(parents=True, exist_ok=True)
                args.profile.write_text(json.dumps(profile))
                print(f"CPU profile of the first round written to {args.profile}")
                cdp.detach()
                cdp = None
        browser.close()
    return measured


# --- reporting ------------------------------------------------------------------------------


def print_figures(measured: Page) -> None:
    print()
    print(f"{'action':<20} {'measure':<14} {'p50 ms':>8} {'max ms':>8}  drawn")
    for action, row in measured.figures.items():
        drawn = measured.drawn[action]
        what = f"{drawn['title']}: {drawn['events']} events, {drawn['bgEvents']} background, {drawn['nodes']} elements"
        for measure, latencies in row.items():
            if latencies:
                p50, most = percentile_ms(latencies, 50), max(latencies) * 1000
                print(f"{action:<20} {measure:<14} {p50:8.0f} {most:8.0f}  {what}")
                what = ""


# --- main -----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    chromium = chromium_path()
    if chromium is None:
        print(
            f"bench/calendar_render.py needs chromium at one of {', '.join(CHROMIUM_CANDIDATES)} "
            "(apt-get install chromium)",
            file=sys.stderr,
        )
        return 2
    static_root = Path(tempfile.mkdtemp(prefix="calendar-render-static-"))
    os.environ["STATIC_ROOT"] = str(static_root)  # read by the settings, here and in daphne
    try:
        url = open_database("bench/calendar_render.py", "portal_bench_render")
        began = time.perf_counter()
        _reader, monday = load_lab(url, args.history_weeks, datetime.now(UTC))
        user = researcher_with_password()
        collect_static(static_root)
        print(
            f"calendar render benchmark: {NODE_COUNT} nodes x 8 GPUs, the week of {monday:%Y-%m-%d} booked densely "
            f"(and {args.history_weeks} week(s) before it), loaded in {time.perf_counter() - began:.1f} s; logged in "
            f"as {user.username}; {args.repeat} page loads, each followed by the interactions; headless Chromium "
            f"({chromium}), {os.cpu_count()} CPUs"
        )
        from django.db import connection

        connection.close()
        with serving(url) as (port, _log):
            measured = run_browser(f"http://127.0.0.1:{port}", user.username, chromium, args)
        print_figures(measured)
    finally:
        shutil.rmtree(static_root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
