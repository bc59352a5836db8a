"""The HTML report in a real browser: headless Chromium loads it offline.

Two loads of the same report: the page exactly as written (any console message —
the page has no scripts, so a message means a failed load or a parse problem —
fails the test), and a copy with a small probe script appended that records, after
the load event, whether the summary, every heatmap table and the worst-offenders
table are rendered with a non-zero size; which matplotlib figures are drawn (each
histogram's and failing-leaves plot's SVG with its axes, tick marks and tick labels,
every `<use>` and clip path resolving to an element of the page); where the gate's verdict
against the baseline sits (on the first screen of a 1400 × 1000 window); and whether the
page is wider than that window (it must never scroll sideways). The probed copy is
served over HTTP on the loopback interface, so that whatever else the page asked for
(an image, a font, a style sheet) would reach the server and the browser's resource
timing: nothing does, it is one self-contained file. Chromium's `--dump-dom` prints
the DOM after the load event, so the probe's findings are read back from it.

Chromium is Debian's `chromium` package (`CHROMIUM` may point elsewhere). Without
it the test is skipped locally, but fails when the `CI` environment variable is set.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mhc_parity.reports import to_frame, write_all
from mhc_parity.reports.html.figures import bound_panels, histograms
from mhc_parity.reports.samples import sample_rows

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
  function all(root, selector) {
    return Array.prototype.slice.call(root.querySelectorAll(selector));
  }
  function groups(svg, kind) {  // matplotlib's groups of one kind: ids "<figure prefix>-<kind>_<n>"
    return all(svg, "g[id]").filter(function (g) { return new RegExp("-" + kind + "_[0-9]+$").test(g.id); });
  }
  function figure(element) {
    var svg = element.querySelector("svg.plot");
    if (!svg) return {id: element.id, shown: false, axes: 0, xticks: 0, yticks: 0, tickLabels: 0, resolved: false};
    var resolved = all(element, "use").every(function (use) {
      return document.getElementById((use.getAttribute("xlink:href") || use.getAttribute("href")).slice(1));
    }) && all(element, "[clip-path]").every(function (clipped) {
      return document.getElementById(clipped.getAttribute("clip-path").slice(5, -1));
    });
    var tickLabels = groups(svg, "xtick").concat(groups(svg, "ytick")).filter(function (tick) {
      var text = tick.querySelector("text");
      return text && text.textContent.trim() && text.getBBox().width > 0;
    });
    return {
      id: element.id,
      shown: shown(svg),
      axes: groups(svg, "axes").length,
      xticks: groups(svg, "xtick").length,
      yticks: groups(svg, "ytick").length,
      tickLabels: tickLabels.length,
      resolved: resolved
    };
  }
  var heatmaps = all(document, "#heatmaps figure.heatmap table");
  var gateVerdict = document.querySelector("#gate-verdict");
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
    histograms: all(document, "#histograms figure.histogram").map(figure),
    boundPlots: all(document, "#bound-plots figure.bound-plot").map(figure),
    gateVerdictBottom: gateVerdict ? gateVerdict.getBoundingClientRect().bottom : null,
    gateVerdictText: gateVerdict ? gateVerdict.innerText : "",
    windowWidth: window.innerWidth,
    windowHeight: window.innerHeight,
    pageWidth: document.documentElement.scrollWidth,
    viewportWidth: document.documentElement.clientWidth,
    resources: performance.getEntriesByType("resource").map(function (entry) { return entry.name; }),
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


def load(chromium: str, page: Path | str, profile: Path) -> tuple[str, str]:
    """(dumped DOM, stderr) of one headless load of `page` (a file, or a URL)."""
    url = page if isinstance(page, str) else page.resolve().as_uri()
    completed = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    return completed.stdout, completed.stderr


@contextlib.contextmanager
def served(folder: Path) -> Iterator[tuple[str, list[str]]]:
    """(base URL, the paths requested so far) of an HTTP server on 127.0.0.1 serving `folder`."""
    requested: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def do_GET(self):
            requested.append(self.path)
            super().do_GET()

        def log_message(self, *args):  # the requests are counted, not printed
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", requested
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def page_requests(requested: list[str]) -> list[str]:
    """The requests a page made itself: the browser's own favicon request left out."""
    return [path for path in requested if path != "/favicon.ico"]


def probe_result(dom: str) -> dict:
    """The probe's findings in a dumped DOM."""
    match = re.search(r'<pre id="probe-result">(.*?)</pre>', dom, re.S)
    assert match, "the probe did not run"
    return json.loads(
        match.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    )


def console_messages(stderr: str) -> list[str]:
    """Console lines Chromium logged for the page (errors, warnings, logs)."""
    return [line for line in stderr.splitlines() if CONSOLE_LINE.search(line)]


def test_report_loads_without_console_messages(chromium, report, tmp_path):
    dom, stderr = load(chromium, report, tmp_path / "profile")
    assert console_messages(stderr) == []
    assert 'id="summary"' in dom and 'id="worst-offenders-table"' in dom
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom  # still text after the browser parsed it


@pytest.fixture(scope="module")
def probed(chromium, report, tmp_path_factory) -> dict:
    """What the probe found on the page, served over HTTP, and the paths the server was asked for ("requested")."""
    return probe_page(chromium, report, tmp_path_factory.mktemp("probed"))


def probe_page(chromium: str, report: Path, folder: Path) -> dict:
    """The probe's findings on `report`, served over HTTP from `folder`, with the paths requested."""
    site = folder / "site"
    site.mkdir()
    page = site / "probed.html"
    page.write_text(report.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    with served(site) as (url, requested):
        dom, stderr = load(chromium, f"{url}/probed.html", folder / "profile")
    assert console_messages(stderr) == []
    return {**probe_result(dom), "requested": page_requests(requested)}


def test_summary_heatmaps_and_worst_offenders_are_rendered(probed):
    result = probed
    assert result["scripts"] == 1  # only the probe: the report itself has none, and the case name stayed text
    assert result["summary"] and "mHC parity: FAIL" in result["summaryText"]
    assert "error 1" in " ".join(result["summaryText"].split())
    assert result["heatmaps"] == 4 and result["heatmapsShown"] == 4
    assert result["offenders"] and result["offenderRows"] == 25
    assert result["firstOffenderCase"] == "<script>alert(1)</script>"


def test_every_figure_is_drawn_with_axes_and_ticks_and_nothing_is_fetched(probed):
    frame = to_frame(sample_rows())
    expected = {f"histogram-{dtype}": len(h.panels) for dtype, h in histograms(frame).items() if h is not None}
    assert {f["id"]: f["axes"] for f in probed["histograms"]} == expected  # a panel per leaf kind × dtype with data
    panels, _ = bound_panels(frame)
    assert [f["id"] for f in probed["boundPlots"]] == [f"bound-plot-{i}" for i in range(len(panels))]
    assert panels and any(p.failing for p in panels)
    for drawn, panel in zip(probed["boundPlots"], panels):
        assert drawn["axes"] == 1 and drawn["xticks"] == len(panel.leaves)  # a tick per leaf
    for drawn in probed["histograms"] + probed["boundPlots"]:
        assert drawn["shown"] and drawn["resolved"], drawn
        assert drawn["xticks"] >= drawn["axes"] and drawn["yticks"] >= 2 * drawn["axes"], drawn
        assert drawn["tickLabels"] >= drawn["axes"] + 2, drawn  # labelled ticks, laid out with a width
    assert probed["requested"] == ["/probed.html"]  # no image, font, style sheet or other request
    assert probed["resources"] == []


def test_the_gates_verdict_is_on_the_first_screen(probed):
    """The gate's verdict against the baseline is in the banner, on the
    window's first screen (headless Chromium's 1400 × 1000 window shows about 860 pixels of
    page), not at the foot of the page."""
    assert probed["gateVerdictBottom"] is not None, "no gate verdict on the page"
    assert 0 < probed["gateVerdictBottom"] <= probed["windowHeight"], probed["gateVerdictBottom"]
    assert "Gate against the baseline rows: FAIL" in probed["gateVerdictText"]


@pytest.fixture(scope="module")
def wide_report(tmp_path_factory) -> Path:
    """The sample report with one more case under a long name (a case file names its cases
    freely): its heatmap rows are wider than a 1400-pixel window."""
    long_name = "lite-n4-c128-b2s64-f32-w32-identity-default-" * 6
    rows = sample_rows()
    rows += [dict(r, case=long_name) for r in rows if r["case"] == "f32_small"]
    return write_all(rows, {}, tmp_path_factory.mktemp("wide-report"))["html"]


def test_the_page_never_scrolls_sideways_in_a_1400_pixel_window(chromium, wide_report, tmp_path):
    """A table or figure wider than the window scrolls inside its own box; the page does not."""
    probed = probe_page(chromium, wide_report, tmp_path)
    assert probed["windowWidth"] == 1400
    assert probed["pageWidth"] <= probed["viewportWidth"], (probed["pageWidth"], probed["viewportWidth"])


def test_request_detection_sees_a_fetched_image(chromium, tmp_path):
    """A control: the same serving and probe see a page that loads an image."""
    (tmp_path / "pixel.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>')
    (tmp_path / "page.html").write_text(
        '<!DOCTYPE html><html><body><img src="pixel.svg"><svg class="plot"></svg>' + PROBE + "</body></html>"
    )
    with served(tmp_path) as (url, requested):
        dom, _ = load(chromium, f"{url}/page.html", tmp_path / "profile")
    assert page_requests(requested) == ["/page.html", "/pixel.svg"]
    assert probe_result(dom)["resources"] == [f"{url}/pixel.svg"]


def test_console_detection_sees_errors(chromium, tmp_path):
    """A control: the same load reports a page that does log errors."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><script>console.error('x'); undefinedCall();</script></body></html>")
    _, stderr = load(chromium, page, tmp_path / "profile")
    assert len(console_messages(stderr)) == 2
