"""MaxText's PEP 695 aliases read as assignments on a Python older than 3.12, and nothing else
(`mhc_parity.maxtext_parity.type_aliases`, a stated source accommodation).

The reading itself is tested on any Python; the import hook only where it is needed (Python
3.11: `make test-compat`), against fake packages and the installed MaxText.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("maxtext")  # the `maxtext` extra, where it installs (docs/accelerators.md)

from mhc_parity.harness.engine.implementations import (  # noqa: E402 - after the skip
    ImplementationError,
    accommodation_record,
    load_implementations,
    wrap_external,
)
from mhc_parity.maxtext_parity import type_aliases  # noqa: E402
from mhc_parity.maxtext_parity.type_aliases import AliasFinder, AliasRead, NewerSyntaxError, read_aliases  # noqa: E402
from mhc_parity.reports.markdown import _accommodation_lines  # noqa: E402
from tests.cli_support import ROOT  # noqa: E402

older_python = pytest.mark.skipif(not type_aliases.needed(), reason="Python 3.12 parses PEP 695 aliases itself")

SOURCE = textwrap.dedent(
    '''\
    """type X = not this: a docstring"""
    from typing import Literal
    type Implementation = Literal["mosaic", "xla"]  # a comment
    kind = type(3)
    if True:
        type Nested = tuple[
            int, str]
    text = "type Y = Z"
    after = 1
    '''
).encode()


def test_only_the_type_statements_lose_their_keyword_and_lines_stay_put():
    read, reads = read_aliases(SOURCE, "pkg.mod")
    assert reads == (AliasRead("pkg.mod", 3, "Implementation"), AliasRead("pkg.mod", 6, "Nested"))
    expected = SOURCE.replace(b"type Implementation =", b"Implementation =").replace(b"    type Nested", b"    Nested")
    assert read == expected
    assert read.count(b"\n") == SOURCE.count(b"\n")
    namespace: dict = {}
    exec(compile(read, "mod.py", "exec"), namespace)
    assert namespace["Nested"] == tuple[int, str] and namespace["kind"] is int and namespace["after"] == 1


def test_a_generic_alias_is_refused_naming_module_and_line():
    with pytest.raises(NewerSyntaxError, match=r"pkg\.mod: line 2: the generic alias `type Pair\[\.\.\.\]"):
        read_aliases(b"x = 1\ntype Pair[T] = tuple[T, T]\n", "pkg.mod")


def test_the_record_names_each_alias_read():
    reads = (AliasRead("maxtext.kernels.mhc.api", 21, "Implementation"),)
    line = type_aliases.record_line(reads)
    assert "PEP 695" in line and "maxtext.kernels.mhc.api:21 Implementation" in line
    assert type_aliases.record_line(()) == ""


def test_the_run_records_and_reports_an_implementation_s_accommodation():
    class Declares:
        name = "declares"
        source_accommodations = ("read this way",)

        def pre(self, *args):
            raise AssertionError("not run")

        post = pre

    impl = wrap_external(Declares())
    assert impl.source_accommodations == ("read this way",)
    record = accommodation_record([impl, impl])
    assert record == {"source_accommodations": "read this way"}
    assert "Source accommodation applied" in "\n".join(_accommodation_lines(record))
    assert accommodation_record([wrap_external(type("Plain", (Declares,), {"source_accommodations": ()})())]) == {}


def test_a_malformed_accommodation_is_refused():
    class Bad:
        name = "bad"
        source_accommodations = (3,)
        pre = post = staticmethod(lambda *a: None)

    with pytest.raises(ImplementationError, match="source_accommodations"):
        wrap_external(Bad())


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """A package `aliased_pkg` on the path with an alias-reading finder for it; yields its folder."""
    package = tmp_path / "aliased_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    finder = AliasFinder("aliased_pkg")
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    yield package
    for name in [m for m in sys.modules if m.split(".")[0] == "aliased_pkg"]:
        del sys.modules[name]


@older_python
def test_the_finder_reads_aliases_and_caches_no_bytecode_of_a_read_module(fake_package, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # PYTHONDONTWRITEBYTECODE may be set
    (fake_package / "kinds.py").write_text("from typing import Literal\ntype Kind = Literal['a', 'b']\n")
    (fake_package / "plain.py").write_text("VALUE = 2\n")
    from aliased_pkg import kinds, plain  # type: ignore[import-not-found]

    assert kinds.Kind.__args__ == ("a", "b") and plain.VALUE == 2
    assert type_aliases.applied("aliased_pkg") == (AliasRead("aliased_pkg.kinds", 2, "Kind"),)
    cached = {p.name.split(".")[0] for p in (fake_package / "__pycache__").glob("*.pyc")}
    assert "plain" in cached and "kinds" not in cached


@older_python
def test_a_module_needing_more_fails_with_one_line_naming_module_and_line(fake_package):
    (fake_package / "generic.py").write_text("x = 1\n\n\ndef first[T](items: list[T]) -> T:\n    return items[0]\n")
    with pytest.raises(NewerSyntaxError, match=r"aliased_pkg\.generic: .*generic\.py: line 4: .*newer Python"):
        __import__("aliased_pkg.generic")
    (fake_package / "factory.py").write_text("from aliased_pkg import generic\n\n\ndef make():\n    return []\n")
    with pytest.raises(ImplementationError, match=r"cannot import 'aliased_pkg\.factory'.*line 4") as info:
        load_implementations("aliased_pkg.factory:make")
    assert "\n" not in str(info.value)


@older_python
def test_maxtext_s_kernel_api_imports_through_the_accommodation_and_not_without_it():
    """On Python 3.11 the installed MaxText's two aliases are the only lines read otherwise, and
    a plain import (no finder) still fails on them: nothing was cached."""
    from maxtext.kernels.mhc import api

    assert callable(api.pre) and callable(api.post) and api.MhcKernelConfig
    line = type_aliases.record_line()
    assert "maxtext.kernels.mhc.api:21 Implementation" in line
    assert "maxtext.kernels.mhc.common:58 KernelContext" in line
    assert len(type_aliases.applied()) == 2, type_aliases.applied()
    plain = subprocess.run(
        [sys.executable, "-c", "import maxtext.kernels.mhc.api"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert plain.returncode != 0 and "SyntaxError" in plain.stderr


def test_every_maxtext_implementation_declares_the_accommodation_exactly_where_it_is_needed():
    from mhc_parity.maxtext_parity import implementations

    declared = {line for impl in implementations() for line in impl.source_accommodations}
    assert bool(declared) == type_aliases.needed()
