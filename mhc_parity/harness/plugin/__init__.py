"""The parts of the pytest plugin (`mhc_parity.harness.pytest_plugin` holds the hooks): `options`, `session`
(one process's run), `regressions` (one bug, one failure) and `checks` (the test items)."""
