"""The commands of `mhc-parity`, one module each; `common` holds what they share. Importing this package
imports nothing else, so `gate`, `render` and `baseline --from` never load JAX."""
