"""The commands of `python -m harness`, one module each (`harness.cli` dispatches to them).

Each parses its arguments and hands them to the layers below (`harness.api`, the engine,
`reports`); `common` holds what they share: exit codes, the default run folder, parsing.
Importing this package imports nothing else, so `gate`, `render` and `baseline --from`
never load JAX.
"""
