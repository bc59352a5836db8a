"""The engine: cases through paths into judged rows. `runner` (cases x paths into rows) is the entry;
`plan` is the matrix before any compute, `paths` a path's program, `compare` leaves into judged rows.
docs/ARCHITECTURE.md describes every module."""
