"""The content-addressed stores under the cache folder: compiled programs and TPU lowerings
(`program_store`), TPU compiles, the oracle's answers (`oracle_cache`), fits, causes and judged rows.
Most share `mhc_parity.records.artifact_store`'s entry format."""
