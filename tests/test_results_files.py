"""docs/results/*.md: a command's Markdown with its provenance (mhc_parity.reports.writers.write_results)."""

from __future__ import annotations

from mhc_parity.reports.writers import provenance_lines, write_results

METADATA = {
    "git_commit": "0123abc",
    "host_cpu": "Some CPU (isa 1234)",
    "platform": "Linux-x86_64",
    "backend": "cpu",
    "device_kind": "cpu",
    "jax_version": "0.12.0.1",
    "end_time": "2026-12-01T18:00:00+00:00",
}


def test_the_provenance_names_command_date_commit_and_machine():
    lines = provenance_lines("make faults", METADATA)
    assert lines[0] == "Written by `make faults` on 2026-12-01T18:00:00+00:00, commit `0123abc`."
    assert lines[1] == "Machine: Some CPU (isa 1234), Linux-x86_64; backend cpu (cpu); jax 0.12.0.1."
    assert "unrecorded" in provenance_lines("x", {})[0]


def test_a_results_file_keeps_the_title_first_and_the_body_whole(tmp_path):
    path = write_results(tmp_path / "sub" / "r.md", "# Title\n\nbody line\n| a | b |\n", "make x", METADATA)
    lines = path.read_text().splitlines()
    assert lines[0] == "# Title" and lines[2].startswith("Written by `make x`")
    assert lines[-2:] == ["body line", "| a | b |"]
    again = write_results(path, "# Title\n\nnew body\n", "make x", METADATA)
    assert again.read_text().splitlines()[-1] == "new body", "a rerun rewrites the file"
