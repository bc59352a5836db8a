"""The content-addressed stores under the cache folder: `artifact_store` (the entry format),
`program_store` (compiled path programs, the kernels' lowering results) and `oracle_cache`
(the oracle's answers)."""
