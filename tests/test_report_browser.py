"""The HTML report in a real browser: headless Chromium loads it offline.

Two loads of the same report: the page exactly as written (any console message —
the page has no scripts, so a message means a failed load or a parse problem —
fails the test), and a copy with a small probe script appended that records, after
the load event, whether the summary, every heatmap table and the worst-offenders
table are rendered with a non-zero size. Chromium's `--dump-dom` prints the DOM
after the load event, so the probe's findings are read back from it.

Chromium is Debian's `chromium` package (`CHROMIUM` may point elsewhere). Without
it the test is skipped locally, but fails when the `CI` environment variable is set.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from reports import write_all
from reports.samples import sample_rows

pytestmark = pytest.mark.browser

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--enable-logging=stderr",
    "--v=0",
    "--window-size=1400,1000",
)
CONSOLE_LINE = re.compile(r":CONSOLE[:(]")

PROBE = """
<script>
window.addEventListener("load", function () {
  function shown(element) {
    if (!element) return false;
    var box = element.getBoundingClientRect();
    return box.width > 0 && box.height > 0 && getComputedStyle(element).visibility !== "hidden";
  }
  var heatmaps = Array.prototype.slice.call(document.querySelectorAll("#heatmaps figure.heatmap table"));
  var offenders = document.querySelector("#worst-offenders-table");
  var result = {
    summary: shown(document.querySelector("#summary")),
    summaryText: (document.querySelector("#summary") || {}).innerText || "",
    heatmaps: heatmaps.length,
    heatmapsShown: heatmaps.filter(function (table) {
      return shown(table) && table.querySelectorAll("td.hm").length > 0;
    }).length,
    offenders: shown(offenders),
    offenderRows: offenders ? offenders.querySelectorAll("tbody tr").length : 0,
    firstOffenderCase: offenders ? offenders.querySelector("tbody tr a").textContent : "",
    scripts: document.scripts.length
  };
  var out = document.createElement("pre");
  out.id = "probe-result";
  out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
});
</script>
"""


def find_chromium() -> str | None:
    """The Chromium binary to use, or None."""
    configured = os.environ.get("CHROMIUM")
    if configured:
        return configured if shutil.which(configured) else None
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def chromium() -> str:
    binary = find_chromium()
    if binary is None:
        message = "headless Chromium not found (install Debian's `chromium` package or set CHROMIUM)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; it is required when CI is set")
        pytest.skip(message)
    return binary


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("browser-report")
    baseline = [dict(r) for r in sample_rows()]
    baseline[0]["cand_oracle_max_err"] /= 4.0  # gives the drift section something to show
    metadata = {"git_commit": "0123abcd", "backend": "cpu", "policy_hash": "sha256:0"}
    return write_all(sample_rows(), metadata, folder, baseline=baseline)["html"]


def load(chromium: str, page: Path, profile: Path) -> tuple[str, str]:
    """(dumped DOM, stderr) of one headless load of `page`."""
    completed = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    return completed.stdout, completed.stderr


def console_messages(stderr: str) -> list[str]:
    """Console lines Chromium logged for the page (errors, warnings, logs)."""
    return [line for line in stderr.splitlines() if CONSOLE_LINE.search(line)]


def test_report_loads_without_console_messages(chromium, report, tmp_path):
    dom, stderr = load(chromium, report, tmp_path / "profile")
    assert console_messages(stderr) == []
    assert 'id="summary"' in dom and 'id="worst-offenders-table"' in dom
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom  # still text after the browser parsed it


def test_summary_heatmaps_and_worst_offenders_are_rendered(chromium, report, tmp_path):
    probed = tmp_path / "probed.html"
    probed.write_text(report.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom, stderr = load(chromium, probed, tmp_path / "profile")
    assert console_messages(stderr) == []
    match = re.search(r'<pre id="probe-result">(.*?)</pre>', dom, re.S)
    assert match, "the probe did not run"
    result = json.loads(
        match.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    )
    assert result["scripts"] == 1  # only the probe: the report itself has none, and the case name stayed text
    assert result["summary"] and "mHC parity: FAIL" in result["summaryText"]
    assert "error 1" in " ".join(result["summaryText"].split())
    assert result["heatmaps"] == 4 and result["heatmapsShown"] == 4
    assert result["offenders"] and result["offenderRows"] == 25
    assert result["firstOffenderCase"] == "<script>alert(1)</script>"


def test_console_detection_sees_errors(chromium, tmp_path):
    """A control: the same load reports a page that does log errors."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><script>console.error('x'); undefinedCall();</script></body></html>")
    _, stderr = load(chromium, page, tmp_path / "profile")
    assert len(console_messages(stderr)) == 2
