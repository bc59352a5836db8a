"""The commands of `mhc-parity`, one module each (`mhc_parity.harness.cli` dispatches to them).

Each parses its arguments and hands them to the layers below (`mhc_parity.harness.api`, the engine,
`reports`); `common` holds what they share: exit codes, the default run folder, parsing.
Importing this package imports nothing else, so `gate`, `render` and `baseline --from`
never load JAX.
"""
