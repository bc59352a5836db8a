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


def test_prepared_programs_run_as_if_compiled_on_first_use_and_report_their_compile_time():
    """`prepare` compiles a case's programs concurrently; each `run` then reports its share
    of that time and computes what a program compiled on first use computes. A path that
    cannot run is left for `run` to report."""
    from cases.fixtures import make_fixture
    from cases.spec import Case
    from harness.implementations import INTERPRET, REFERENCE
    from harness.paths import Path

    case = Case(name="prepare-small", batch=1, sequence=16, streams=2, embedding=128, branch="tanh")
    fixture = make_fixture(case)
    paths = [Path(REFERENCE), Path(INTERPRET), Path(REFERENCE, mesh=(2, 4))]  # batch 1 does not split 2 ways
    prepared = ProgramCache()
    prepared.prepare(paths, case, fixture)
    assert len(prepared) == 2
    on_first_use = ProgramCache()
    for path in paths[:2]:
        outputs, expected = prepared.run(path, case, fixture), on_first_use.run(path, case, fixture)
        assert outputs.compile_s > 0
        for name, value in expected.leaves.items():
            assert (outputs.leaves[name] == value).all(), (path.name, name)
        assert prepared.run(path, case, fixture).compile_s == 0.0  # reported once
    with pytest.raises(ValueError, match="not divisible"):
        prepared.run(paths[2], case, fixture)
