"""The judging numerics: per-leaf metrics, the error statistics they share with the oracle's
sensitivities, the rule kinds (`bounds`) and the tolerance policy (`policy` with its one
declarative file, `tolerances.toml`)."""
