"""The engine: cases through paths into judged rows.

`implementations` (what runs: built-in and external), `envelope` (what an implementation
supports), `devices` (where a path runs), `leaves` (leaf names and kinds), `paths` (a path
and the forward+VJP program it runs), `program_cache` (compiled programs, built ahead),
`oracle_path` (the float64 oracle as a path), `plan` (the matrix a run will make, before any
compute), `compare` (leaves into judged rows), `runner` (cases x paths into rows),
`lowering_rows` (the kernels' TPU lowering as rows), `run_info` (the run's environment
record).
"""
