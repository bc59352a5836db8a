"""Processes: `parallel` (the runner over `--jobs N` worker processes), `worker_processes`
(how they start and end), `shards` (`--shard K/N`), `interrupts` (SIGINT and SIGTERM as one
KeyboardInterrupt), `watchdog` (the process that stops a run whose signal handlers cannot
run)."""
