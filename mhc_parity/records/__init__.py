"""Records: the row schema and the files that hold a run's rows, below both `harness` and
`reports`, so the engine writes and the reports read one format.

    schema        the row columns, verdicts, comparison and leaf kinds
    rows          reading, validating and encoding cells (`to_frame`, `encode_float`)
    manifest      manifest.json: what a run asked, selected, whether it finished; source digests
    store         rows.jsonl while a run is in progress (resumable) and each case's record
    kill_records  the kill matrix's results as plain data
    environment   what a run's backend / precision record means for comparing runs
    identity      what a stored verdict rests on (code, policy, selection, environment), one comparison
    outputs       writable output paths, the writer lock, the one phrase for a failed write, a closed stdout
    files         content digests and atomic writes
    dtypes, text  dtype facts from NumPy / ml_dtypes; the one number formatter and table

Plain Python, NumPy and pandas: no JAX and nothing else of the project
(tests/test_import_graph.py holds that).
"""
