"""The reports page in Chromium: the table, the bar chart and the demand heatmap are drawn."""

from __future__ import annotations

from playwright.sync_api import expect

from tests.accounting.test_report import day  # noqa: F401 (the fixture)
from tests.browser.helpers import log_in


def test_an_admin_reads_the_usage_report_with_its_charts(page, live_server, day, carol, screenshot):  # noqa: F811
    log_in(page, live_server, "carol")
    page.goto(f"{live_server.url}/reports/?start=2030-01-07&end=2030-01-07&by=user")
    table = page.locator(".report-table").first
    expect(table.locator("tbody tr")).to_have_count(3)
    expect(table.locator("tbody tr", has_text="alice")).to_contain_text("40 %")
    # Energy: alice's measured, bob's partly estimated ("≈"), carol's none.
    expect(table.locator("tbody tr", has_text="alice")).to_contain_text("0.42")
    expect(table.locator("tbody tr", has_text="bob")).to_contain_text("≈ 0.12")
    expect(table.locator("thead")).to_contain_text("Idle kWh")
    # Both charts drew something: a canvas that Chart.js has sized and painted.
    for chart in ("#usage-chart", "#demand-chart"):
        assert page.evaluate(f"Chart.getChart(document.querySelector('{chart}')).data.datasets.length") >= 1
    page.get_by_text("The same as a table").click()
    expect(page.locator("#demand-rows tr").nth(10)).to_contain_text("3.0")
    screenshot("report")
    expect(page.locator("#idle-nodes")).to_contain_text("14 of 20 node-hours (70 %) had no booking")

    page.locator("#idle-nodes").get_by_role("link", name="by node").click()
    table = page.locator(".report-table").first
    expect(table.locator("thead")).to_contain_text("Fully idle node-h")
    expect(table.locator("tbody tr", has_text="gpu-a100")).to_contain_text("14.0")
    table.scroll_into_view_if_needed()
    screenshot("report-by-node")
