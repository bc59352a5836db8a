"""The compiled-program cache keeps a bounded number of programs, least recently used out.

Unbounded, a long run kept every XLA executable alive and a one-process kill matrix over
the full suite ran out of memory mappings (harness/paths.py MAX_CACHED_PROGRAMS).
"""

from __future__ import annotations

import gc
import weakref

import jax
import jax.numpy as jnp
import pytest

from harness.paths import MAX_CACHED_PROGRAMS, ProgramCache


def _tiny_program(offset: float):
    return jax.jit(lambda x: x + offset).lower(jnp.float32(0)).compile()


def test_the_least_recently_used_program_is_dropped_beyond_the_bound():
    cache = ProgramCache(max_programs=2)
    cache.remember(("a",), "program a")
    cache.remember(("b",), "program b")
    assert cache.lookup(("a",)) == "program a"  # a is now the most recently used
    cache.remember(("c",), "program c")
    assert len(cache) == 2
    assert cache.lookup(("b",)) is None
    assert cache.lookup(("a",)) == "program a" and cache.lookup(("c",)) == "program c"


def test_an_evicted_program_is_released():
    cache = ProgramCache(max_programs=1)
    first = _tiny_program(1.0)
    released = weakref.ref(first)
    cache.remember(("first",), first)
    del first
    cache.remember(("second",), _tiny_program(2.0))
    gc.collect()
    assert released() is None, "the cache still holds the evicted executable"
    assert float(cache.lookup(("second",))(jnp.float32(1))) == 3.0


def test_the_default_bound_and_a_bad_bound():
    assert ProgramCache().max_programs == MAX_CACHED_PROGRAMS
    with pytest.raises(ValueError, match="at least 1"):
        ProgramCache(max_programs=0)
