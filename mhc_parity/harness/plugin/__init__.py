"""The parts of the pytest plugin, one job each; pytest loads `mhc_parity.harness.pytest_plugin`.

- `options`: the command-line and ini options, and the command that writes a baseline;
- `session`: one process's parity run (configuration, baseline, rows) and what it writes
  at the end;
- `regressions`: which failing rows and gate findings are one regression, and which test
  reports it;
- `checks`: the parametrised test items and their failure messages.
"""
