"""axe-core (tests/browser/axe/, the npm package's build, pinned in its package.json) run in the page: the WCAG
2.0/2.1 A and AA rules, and a failure that names each rule and element."""

from __future__ import annotations

from pathlib import Path
from typing import Any

AXE = Path(__file__).parent / "axe" / "axe.min.js"
WCAG_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]


def axe_violations(page) -> list[dict[str, Any]]:
    """The page's violations of WCAG 2.1 A/AA as axe-core finds them, as it is shown now."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        # Evaluated through the DevTools protocol, which the page's Content-Security-Policy does not govern (an
        # added <script> is an inline one, and the policy refuses it): axe audits the page as the policy lets the
        # browser draw it, and no test needs a context that bypasses the policy.
        page.evaluate(AXE.read_text())
    result = page.evaluate(
        "async (tags) => await axe.run(document, {runOnly: {type: 'tag', values: tags}, resultTypes: ['violations']})",
        WCAG_AA,
    )
    return result["violations"]


def described(violations: list[dict[str, Any]]) -> str:
    """Each violation's rule, impact and the elements it was found on, for a test's failure message."""
    lines = []
    for violation in violations:
        lines.append(f"{violation['id']} ({violation['impact']}): {violation['help']}")
        for node in violation["nodes"][:5]:
            lines.append(f"    {' '.join(node['target'])}: {node['failureSummary'].splitlines()[-1].strip()}")
    return "\n".join(lines)


def assert_accessible(page) -> None:
    violations = axe_violations(page)
    assert not violations, f"{page.url}:\n{described(violations)}"


# The colours a page is drawn in: its root's background and text, the card's background (where it has one),
# each as WCAG relative luminance, and the last stylesheet, which must be dark.css for its rules to win.
COLOURS = """() => {
  const luminance = (css) => {
    const [r, g, b] = css.match(/[\\d.]+/g).slice(0, 3).map((c) => {
      const s = Number(c) / 255;
      return s <= 0.03928 ? s / 12.92 : ((s + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const root = getComputedStyle(document.documentElement);
  const card = document.querySelector('.card, .gpu-card, table');
  const sheets = [...document.styleSheets].map((sheet) => sheet.href || '');
  return {
    background: luminance(root.backgroundColor),
    text: luminance(root.color),
    card: card ? luminance(getComputedStyle(card).backgroundColor) : null,
    scheme: root.colorScheme,
    last_sheet: sheets[sheets.length - 1].split('/').pop(),
  };
}"""


def assert_dark(page) -> None:
    colours = page.evaluate(COLOURS)
    assert colours["last_sheet"] == "dark.css", f"{page.url}: dark.css must come last, after the page's stylesheets"
    assert colours["scheme"] == "dark", page.url
    assert colours["background"] < 0.02, f"{page.url}: the page is not dark: {colours}"
    assert colours["text"] > 0.6, f"{page.url}: the text is not light: {colours}"
    if colours["card"] is not None:
        assert colours["card"] < 0.03, f"{page.url}: its cards are not dark: {colours}"
