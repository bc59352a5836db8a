"""The Speed section's per-program figures: device time, bytes, GB/s and the fraction of the chip's peak.

mhc_parity/records/roofline.py (the arithmetic, shared with bench/device_speed.py) and
mhc_parity/reports/speed.py (the table, the plot, speed.csv), on small frames of a
simulated v5e run and of a CPU run, whose bytes and times are chosen so the figures are known.
"""

from __future__ import annotations

import csv
import math
from xml.etree import ElementTree

import numpy as np
import pytest

from mhc_parity.cases import registry
from mhc_parity.mhc.common import layer_flops
from mhc_parity.records.roofline import PEAKS, array_bytes, peaks_of, throughput
from mhc_parity.records.schema import empty_row
from mhc_parity.reports import render_html, to_frame, write_all
from mhc_parity.reports.html.svg import roofline_svg
from mhc_parity.reports.markdown import render_markdown
from mhc_parity.reports.speed import NO_PEAK, SPEED_COLUMNS, program_speeds, roofline_figure
from tests.cli_support import bench_script

V5E = {"backend": "tpu", "device_kind": "TPU v5 lite"}
CPU = {"backend": "cpu", "device_kind": "cpu"}
HOST = "cpu:0-7 (host: tpu has 1 device)"


def _row(case, candidate, partner, comparison, execute_s, bytes_moved, devices, runs=50.0, leaf="out"):
    return empty_row(
        case=case,
        candidate=candidate,
        partner=partner,
        comparison=comparison,
        leaf=leaf,
        leaf_kind="output",
        verdict="pass",
        execute_s=execute_s,
        execute_first_s=2 * execute_s,
        execute_runs=runs,
        bytes_moved=bytes_moved,
        devices=devices,
    )


def _v5e_run() -> list[dict]:
    return [
        # 819 MB in 1 ms: 819 GB/s, the whole of v5e's peak
        _row("a", "reference/unsharded", "oracle", "vs_oracle", 1e-3, 819e6, "tpu:0"),
        _row("a", "reference/unsharded", "oracle", "vs_oracle", 1e-3, 819e6, "tpu:0", leaf="d_x"),
        # 81.9 MB in 1 ms: a tenth of it
        _row("a", "mosaic/unsharded", "reference/unsharded", "vs_reference", 1e-3, 81.9e6, "tpu:0"),
        _row("a", "maxtext-kernel-fwd-fixed/unsharded", "oracle", "vs_oracle", 4e-3, 81.9e6, "tpu:0"),
        # a host path: on the CPU, no stated peak
        _row("a", "reference/sharded(data=2,fsdp=4)@cpu", "oracle", "vs_oracle", 0.5, 1e6, HOST, runs=1.0),
        _row("b", "mosaic/unsharded", "oracle", "vs_oracle", 2e-3, 1.638e6, "tpu:0"),
    ]


def test_bandwidth_and_fraction_of_peak_from_known_bytes_and_time():
    rates = throughput(819e6, 1e-3, "TPU v5 lite", flops=197e9)
    assert rates.gb_per_s == pytest.approx(819.0)
    assert rates.hbm_fraction == pytest.approx(1.0)
    assert rates.flops_per_s == pytest.approx(197e12) and rates.flop_fraction == pytest.approx(1.0)
    assert throughput(81.9e6, 1e-3, "TPU v5 lite").hbm_fraction == pytest.approx(0.1)
    assert peaks_of("TPU v5 lite") is PEAKS["TPU v5 lite"] and PEAKS["TPU v5 lite"].hbm_bytes_per_s == 819e9


def test_a_cpu_has_no_stated_peak_and_gets_bandwidth_only():
    rates = throughput(1e9, 0.5, "cpu")
    assert peaks_of("cpu") is None and rates.peaks is None
    assert rates.gb_per_s == pytest.approx(2.0)
    assert math.isnan(rates.hbm_fraction) and math.isnan(rates.flop_fraction)


def test_no_time_or_no_bytes_gives_no_rate():
    assert math.isnan(throughput(1e6, 0.0, "TPU v5 lite").gb_per_s)
    assert math.isnan(throughput(math.nan, 1e-3, "TPU v5 lite").hbm_fraction)
    assert math.isnan(throughput(1e6, math.nan, "TPU v5 lite").gb_per_s)


def test_array_bytes_counts_every_element_at_its_width():
    arrays = [np.zeros((2, 3), np.float32), np.zeros((4,), np.float16), np.zeros((), np.float64)]
    assert array_bytes(arrays) == 24 + 8 + 8


def test_each_program_of_each_case_once_with_its_chip():
    speeds = program_speeds(to_frame(_v5e_run()), V5E)
    assert [(s.case, s.path) for s in speeds] == [
        ("a", "reference/unsharded"),
        ("a", "mosaic/unsharded"),
        ("a", "maxtext-kernel-fwd-fixed/unsharded"),
        ("a", "reference/sharded(data=2,fsdp=4)@cpu"),
        ("b", "mosaic/unsharded"),
    ]
    by_path = {(s.case, s.path): s for s in speeds}
    reference = by_path[("a", "reference/unsharded")]
    assert reference.device_kind == "TPU v5 lite" and reference.rates.hbm_fraction == pytest.approx(1.0)
    assert reference.alone and reference.timing == "tpu: 50 runs back to back, alone"
    assert by_path[("a", "mosaic/unsharded")].rates.hbm_fraction == pytest.approx(0.1)
    assert by_path[("a", "maxtext-kernel-fwd-fixed/unsharded")].rates.hbm_fraction == pytest.approx(0.025)
    host = by_path[("a", "reference/sharded(data=2,fsdp=4)@cpu")]
    assert host.device_kind == "cpu" and host.rates.peaks is None and not host.alone
    assert host.rates.gb_per_s == pytest.approx(0.002)


def test_a_run_written_before_the_device_timing_says_so():
    rows = [_row("a", "reference/unsharded", "oracle", "vs_oracle", 0.185, math.nan, "tpu:0", runs=5.0)]
    (speed,) = program_speeds(to_frame(rows), V5E)
    assert not speed.alone and "before the device timing" in speed.timing
    assert math.isnan(speed.rates.hbm_fraction)


def test_the_plot_holds_the_chip_programs_fractions_and_is_drawn():
    figure = roofline_figure(program_speeds(to_frame(_v5e_run()), V5E))
    assert figure.device_kind == "TPU v5 lite" and figure.peak_gb_per_s == pytest.approx(819.0)
    points = {(case, path): fraction for case, path, fraction in figure.points}
    assert ("a", "reference/sharded(data=2,fsdp=4)@cpu") not in points  # no peak: not on the plot
    assert points[("b", "mosaic/unsharded")] == pytest.approx(1.638e6 / 2e-3 / 819e9)
    svg = roofline_svg(figure)
    assert svg.startswith("<svg") and "maxtext-kernel-fwd-fixed/unsharded" in svg and "819 GB/s" in svg


def test_the_html_page_and_the_summary_show_the_programs_against_the_peak():
    frame = to_frame(_v5e_run())
    html = render_html(frame, V5E)
    section = html[html.index('<section id="speed">') :]
    section = section[: section.index("</section>")]
    assert 'id="roofline"' in section and "<svg" in section and 'id="program-speed-table"' in section
    assert "maxtext-kernel-fwd-fixed/unsharded" in section and NO_PEAK in section
    markdown = render_markdown(frame, metadata=V5E)
    speed = markdown[markdown.index("<summary>Speed") :]
    assert "| a | mosaic/unsharded | tpu:0 | 1 | 81.9 | 81.9 | 0.1 |" in speed
    assert "| a | reference/unsharded | tpu:0 | 1 | 819 | 819 | 1 |" in speed


def test_a_cpu_run_shows_bandwidth_without_a_peak_and_draws_no_plot():
    rows = [_row("a", "reference/unsharded", "oracle", "vs_oracle", 0.5, 1e9, "cpu:0", runs=1.0)]
    frame = to_frame(rows)
    assert roofline_figure(program_speeds(frame, CPU)) is None
    html = render_html(frame, CPU)
    section = html[html.index('<section id="speed">') :]
    assert 'id="roofline"' not in section and "no stated peak" in section
    markdown = render_markdown(frame, metadata=CPU)
    assert "| a | reference/unsharded | cpu:0 | 500 | 1e+03 | 2 | no stated peak |" in markdown


def test_write_all_writes_speed_csv(tmp_path):
    paths = write_all(_v5e_run(), V5E, tmp_path)
    assert paths["speed"] == tmp_path / "speed.csv"
    with paths["speed"].open(newline="") as handle:
        lines = list(csv.DictReader(handle))
    assert tuple(lines[0]) == SPEED_COLUMNS and len(lines) == 5
    reference = lines[0]
    assert (reference["case"], reference["path"], reference["device_kind"]) == (
        "a",
        "reference/unsharded",
        "TPU v5 lite",
    )
    assert float(reference["device_s"]) == 1e-3 and float(reference["bytes_moved"]) == 819e6
    assert float(reference["gb_per_s"]) == pytest.approx(819.0) and float(
        reference["fraction_of_peak"]
    ) == pytest.approx(1)
    host = lines[3]
    assert host["peak_gb_per_s"] == host["fraction_of_peak"] == "nan" and float(host["gb_per_s"]) == pytest.approx(
        0.002
    )


@pytest.mark.parametrize("chip", [True, False], ids=["v5e", "cpu"])
def test_speed_run_from_a_finished_run_writes_the_table_and_the_plot_into_a_new_folder(tmp_path, chip):
    run = tmp_path / "run"
    if chip:
        write_all(_v5e_run(), V5E, run)
    else:
        write_all([_row("a", "reference/unsharded", "oracle", "vs_oracle", 0.5, 1e9, "cpu:0", runs=1.0)], CPU, run)
    out = tmp_path / "not" / "yet"
    assert bench_script("speed_run").main(["--out", str(out), "--suite", "tpu", "--from", str(run)]) == 0
    with (run / "speed.csv").open(newline="") as handle:
        speed = list(csv.DictReader(handle))
    with (out / "speed-tpu.csv").open(newline="") as handle:
        copied = list(csv.DictReader(handle))
    # the run's speed.csv, then the FLOP columns: none for "a", which the case registry does not hold
    assert [{k: v for k, v in line.items() if k in SPEED_COLUMNS} for line in copied] == speed
    assert all(line["flops"] == line["tflop_per_s"] == line["fraction_of_bf16_peak"] == "nan" for line in copied)
    markdown = (out / "speed-tpu.md").read_text()
    assert f"The run folder `{run}`" in markdown and "| a | reference/unsharded |" in markdown
    if chip:  # a file of its own, so its SVG namespace is declared
        root = ElementTree.parse(out / "speed-tpu.svg").getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        assert "(speed-tpu.svg)" in markdown and "TPU v5 lite's 819 GB/s" in markdown
    else:
        assert not (out / "speed-tpu.svg").exists() and "no plot" in markdown


def test_speed_run_counts_the_flops_of_each_cases_reference_program(tmp_path):
    # A registered case: XLA's count of its reference program (forward and VJP), lowered here, on
    # every program of the case; the rate over 1 ms, and its share of v5e's 197 TFLOP/s.
    case = registry.get("lite-n4-c96-b2s64-f32-w32-identity-default")
    run = tmp_path / "run"
    write_all(
        [
            _row(case.name, "reference/unsharded", "oracle", "vs_oracle", 1e-3, 1e6, "tpu:0"),
            _row(case.name, "mosaic/unsharded", "reference/unsharded", "vs_reference", 2e-3, 1e6, "tpu:0"),
        ],
        V5E,
        run,
    )
    assert bench_script("speed_run").main(["--out", str(tmp_path), "--suite", "x", "--from", str(run)]) == 0
    with (tmp_path / "speed-x.csv").open(newline="") as handle:
        reference, mosaic = csv.DictReader(handle)
    flops = float(reference["flops"])
    assert float(mosaic["flops"]) == flops
    # Independent of XLA: one VJP costs about twice the forward pass, which mhc.common.layer_flops
    # counts by hand (measured: 3.03x here, 3.09x at 2048 features and 2048 tokens)
    forward = sum(layer_flops(case.tokens, case.dims).values())
    assert 2.9 < flops / forward < 3.3
    assert float(reference["tflop_per_s"]) == pytest.approx(flops / 1e-3 / 1e12)
    assert float(mosaic["fraction_of_bf16_peak"]) == pytest.approx(flops / 2e-3 / 197e12)
    table = (tmp_path / "speed-x.md").read_text()
    assert f"| {flops / 1e9:.3g} | {flops / 1e-3 / 1e12:.3g} |" in table


def test_speed_run_keeps_the_runs_columns_when_no_program_was_timed(tmp_path):
    run = tmp_path / "run"
    write_all([_row("a", "reference/unsharded", "oracle", "vs_oracle", math.nan, math.nan, "tpu:0")], V5E, run)
    assert bench_script("speed_run").main(["--out", str(tmp_path), "--suite", "x", "--from", str(run)]) == 0
    with (tmp_path / "speed-x.csv").open(newline="") as handle:
        reader = csv.DictReader(handle)
        assert list(reader) == []
    assert tuple(reader.fieldnames) == (*SPEED_COLUMNS, "flops", "tflop_per_s", "fraction_of_bf16_peak")
