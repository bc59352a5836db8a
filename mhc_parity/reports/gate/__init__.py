"""The gate: a run judged against a baseline (the why of every rule: docs/gate.md). Plain Python and pandas, no
matplotlib: `mhc-parity gate` and the pytest plugin load this wing without drawing anything.

    baseline_file   the baseline CSV: its format, written and read back with every check in one place
    drift           a matched row's growth and systematic shift, and the rule's two parameters (checked once)
    rule            the gate itself: rows matched by key, findings by category (`gate`, `GateResult`), and the
                    findings as a table for every printer
    comparability   whether a baseline can judge a run at all, and whether rows may replace a baseline
    judgement       the one judgement `mhc-parity gate`, the API and the reports share (`judge`, `gate_run`)
"""
