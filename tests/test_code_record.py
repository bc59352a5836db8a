"""mhc_parity.records.code: module sources parsed for their imports from several threads at once."""

from __future__ import annotations

import gc
import pathlib
import threading
import time

from mhc_parity.records import code

SOURCE = pathlib.Path(code.__file__).read_text(encoding="utf-8")


def test_threads_parse_at_once_without_a_system_error():
    # A garbage collection that hands the GIL over mid-parse (here a callback that sleeps; in a
    # run, a finalizer's Python code) let another thread's parse interleave: on Python 3.11.7,
    # without the lock, "SystemError: AST constructor recursion depth mismatch".
    def hand_over(phase, info):
        time.sleep(0)

    failures, thresholds = [], gc.get_threshold()

    def parse_many(worker):
        try:
            for i in range(50):  # distinct texts: each is parsed, not found in the cache
                assert "ast" in code._names_imported_by(f"{SOURCE}\n# {worker}.{i}\n", False)
        except Exception as exc:  # noqa: BLE001 - any failure of a thread is the test's
            failures.append(exc)

    gc.callbacks.append(hand_over)
    gc.set_threshold(100, 1, 1)
    try:
        threads = [threading.Thread(target=parse_many, args=(w,)) for w in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        gc.callbacks.remove(hand_over)
        gc.set_threshold(*thresholds)
    assert not failures, failures
