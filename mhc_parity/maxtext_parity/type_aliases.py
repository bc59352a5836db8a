"""A stated source accommodation: MaxText's PEP 695 type aliases read on a Python older than 3.12.

MaxText 0.2.5 declares Python >= 3.12; a TPU VM image may bring 3.11. Two lines of the modules the mHC layer
imports are 3.12-only (`type Implementation = ...`, `type KernelContext = ...`); read as plain assignments
they bind the same types. `install()` (below 3.12 only) puts a finder first on `sys.meta_path`, for
`maxtext` alone: a module that compiles gets the ordinary code; one that does not is read with each `type
NAME = ...` as `NAME = ...` (line numbers kept; its bytecode never cached); anything more fails with
`NewerSyntaxError`. `applied()` lists what was read so.
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.machinery
import io
import sys
import threading
import tokenize

PACKAGE = "maxtext"
NATIVE_SINCE = (3, 12)
DESCRIPTION = "PEP 695 `type X = Y` aliases read as `X = Y` (Python {python} is older than 3.12)"


@dataclasses.dataclass(frozen=True)
class AliasRead:
    """One `type NAME = ...` statement read as `NAME = ...`, in `module` at `line` (1-based)."""

    module: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line} {self.name}"


class NewerSyntaxError(ImportError):
    """A MaxText module that needs a newer Python than the accommodation covers."""


_applied: list[AliasRead] = []
_lock = threading.Lock()


def applied(package: str = PACKAGE) -> tuple[AliasRead, ...]:
    with _lock:
        return tuple(r for r in _applied if r.module == package or r.module.startswith(package + "."))


def record_line(reads: tuple[AliasRead, ...] | None = None) -> str:
    """The environment record's line: what was read how, or "" when nothing was."""
    reads = applied() if reads is None else reads
    if not reads:
        return ""
    python = ".".join(map(str, sys.version_info[:3]))
    return f"{DESCRIPTION.format(python=python)}: {', '.join(map(str, reads))}"


def accommodations() -> tuple[str, ...]:
    line = record_line()
    return (line,) if line else ()


def _logical_line_starts(tokens: list[tokenize.TokenInfo]) -> list[int]:
    """Indexes of the tokens that open a logical line (after NEWLINE, INDENT or DEDENT)."""
    opening = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    skipped = {tokenize.NL, tokenize.COMMENT}
    starts, at_start = [], True
    for index, token in enumerate(tokens):
        if token.type in skipped:
            continue
        if at_start and token.type not in opening:
            starts.append(index)
        at_start = token.type in opening
    return starts


def read_aliases(source: bytes, module: str) -> tuple[bytes, tuple[AliasRead, ...]]:
    """`source` with each `type NAME = ...` statement's `type ` removed, and what was removed;
    NewerSyntaxError for a generic alias (`type NAME[...] = ...`)."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    text = source.decode(encoding)
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    lines = text.splitlines(keepends=True)
    reads = []
    for start in _logical_line_starts(tokens):
        if start + 3 > len(tokens):
            continue
        keyword, name, after = tokens[start : start + 3]
        if keyword.type != tokenize.NAME or keyword.string != "type" or name.type != tokenize.NAME:
            continue
        if after.type != tokenize.OP or after.string not in ("=", "["):
            continue  # `type(x)`, `type = ...`, `type.attr`: the builtin, not the statement
        if after.string == "[":
            raise NewerSyntaxError(
                f"{module}: line {keyword.start[0]}: the generic alias `type {name.string}[...] = ...` needs "
                "Python 3.12 (the accommodation reads only `type X = Y`)",
                name=module,
            )
        row, column = keyword.start
        line = lines[row - 1]
        lines[row - 1] = line[:column] + line[name.start[1] :]
        reads.append(AliasRead(module, row, name.string))
    return "".join(lines).encode(encoding), tuple(reads)


class AliasReadingLoader(importlib.machinery.SourceFileLoader):
    """The ordinary source loader; a module that does not compile is read with its aliases as assignments."""

    _reads: tuple[AliasRead, ...] = ()

    def source_to_code(self, data, path, *, _optimize=-1):
        try:
            return super().source_to_code(data, path, _optimize=_optimize)
        except SyntaxError:
            pass
        source, reads = read_aliases(bytes(data), self.name)
        try:
            code = compile(source, path, "exec", dont_inherit=True, optimize=_optimize)
        except SyntaxError as exc:
            raise NewerSyntaxError(
                f"{self.name}: {path}: line {exc.lineno}: {exc.msg}: this MaxText module needs a newer Python "
                f"than {sys.version_info.major}.{sys.version_info.minor}, beyond the PEP 695 aliases this project "
                "reads as assignments",
                name=self.name,
                path=path,
            ) from None
        self._reads = reads
        with _lock:
            _applied.extend(reads)
        return code

    def set_data(self, path, data, *, _mode=0o666):
        # Bytecode of a module read with its aliases as assignments is not cached: a plain
        # import of it must still fail, and the next run must record the accommodation again.
        if not self._reads:
            super().set_data(path, data, _mode=_mode)


class AliasFinder(importlib.abc.MetaPathFinder):
    """Finds `package` and its submodules as the path finder does, with the alias-reading loader."""

    def __init__(self, package: str = PACKAGE):
        self.package = package

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.package and not fullname.startswith(self.package + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or type(spec.loader) is not importlib.machinery.SourceFileLoader:
            return spec
        spec.loader = AliasReadingLoader(spec.loader.name, spec.loader.path)
        return spec


_FINDER = AliasFinder()


def needed(version: tuple[int, ...] = tuple(sys.version_info[:2])) -> bool:
    return tuple(version) < NATIVE_SINCE


def install() -> bool:
    if not needed():
        return False
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    return True
