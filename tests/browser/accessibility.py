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
        page.add_script_tag(content=AXE.read_text())
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
