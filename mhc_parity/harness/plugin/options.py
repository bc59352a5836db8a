"""The plugin's options: `--parity-<name>`, or `parity_<name>` in the ini file (the command line wins; ini
paths relative to the ini file's folder), and the command that writes a session's baseline."""

from __future__ import annotations

import os
import shlex

import pytest
from _pytest.config.findpaths import determine_setup

from mhc_parity.records.settings import setting as environment_setting

SUITE_VARIABLE = "MHC_PARITY_SUITE"
UPDATE_OPTION = "--parity-update-baseline"
LEGACY_OPTION = "--parity-allow-legacy-baseline"
LEGACY_INI = "parity_allow_legacy_baseline"
BUILTIN_INI = "parity_builtin"
OPTIONS = {  # name: help; each is `--parity-<name>` on the command line and `parity_<name>` in the ini file
    "impl": "MODULE:FACTORY of the implementation whose parity the parity_check tests check",
    "suite": "case suite the parity-matrix tests run (default: $MHC_PARITY_SUITE or smoke)",
    "dtype": "keep the cases of this activation dtype only: float32|bfloat16 (f32, bf16)",
    "report": "write the run folder (manifest, rows, CSV/JSON/HTML/Markdown reports) here",
    "baseline": f"gate each parity test against this baseline file (which {UPDATE_OPTION} writes)",
}
VALUE_OPTIONS = tuple(f"--parity-{name}" for name in OPTIONS)
# Options whose ini value is a path, taken relative to the ini file's folder.
PATH_OPTIONS = ("report", "baseline")
# The options an update command repeats (the others do not change which rows it writes).
UPDATE_COMMAND_OPTIONS = ("impl", "suite", "dtype", "baseline")


def add_options(parser) -> None:
    group = parser.getgroup("mhc-parity", "numerical parity of an mHC implementation (mhc-parity)")
    for name, help_text in OPTIONS.items():
        group.addoption(f"--parity-{name}", default=None, help=help_text)
        parser.addini(f"parity_{name}", help=help_text, default=None)
    group.addoption(
        UPDATE_OPTION,
        action="store_true",
        default=False,
        help="write the baseline (parity_baseline, else baselines/<name>.csv) from this run's rows instead of gating",
    )
    group.addoption(
        LEGACY_OPTION,
        action="store_true",
        default=False,
        help="let a baseline in a legacy format (whose header or rows no digest covers) judge the session",
    )
    parser.addini(
        LEGACY_INI,
        type="bool",
        default=False,
        help="as --parity-allow-legacy-baseline: let a legacy-format baseline judge the session",
    )
    parser.addini(
        BUILTIN_INI,
        type="bool",
        default=False,
        help="without parity_impl, run the matrix over mhc-parity's own paths (its own test suite)",
    )


def setting(config, name: str) -> str | None:
    value = config.getoption(f"--parity-{name}")
    if value:
        return value
    value = config.getini(f"parity_{name}")
    if value and name in PATH_OPTIONS:
        return str(config.rootpath / value)
    return value or None


def enabled(config) -> bool:
    """Whether the session checks anything: an implementation, or this project's own paths."""
    return bool(setting(config, "impl") or config.getini(BUILTIN_INI))


def given_options(config) -> list[str]:
    names = [f"--parity-{name}" for name in OPTIONS] + [UPDATE_OPTION, LEGACY_OPTION]
    return [name for name in names if config.getoption(name)]


def refuse_options_without_implementation(config) -> None:
    """pytest.UsageError naming the `--parity-*` options of a session that checks nothing: a gate asked for
    but never run would read as a pass."""
    given = given_options(config)
    if given:
        raise pytest.UsageError(
            f"mhc-parity: {', '.join(given)}: no implementation to check; pass --parity-impl MODULE:FACTORY "
            "(or set parity_impl in the pytest configuration)"
        )


def refuse_value_taken_as_path(early_config, parser) -> None:
    """pytest.UsageError when pytest took a `--parity-<name> VALUE`'s value for a test path choosing its
    rootdir and configuration file.

    pytest decides those before loading plugins, so `--parity-baseline ../b.csv` may move the rootdir and
    leave `parity_impl` unread, switching the plugin off silently. Here the choice is made again with the
    options known; a different one is refused, naming the `=` form.
    """
    words = [*shlex.split(os.environ.get("PYTEST_ADDOPTS", "")), *map(str, early_config.invocation_params.args)]
    separate = [(word, value) for word, value in zip(words, words[1:]) if word in VALUE_OPTIONS]
    if not separate:
        return
    namespace = parser.parse_known_args(words)
    rootpath, inipath, _, _ = determine_setup(
        inifile=namespace.inifilename,
        override_ini=namespace.override_ini,
        args=namespace.file_or_dir,
        rootdir_cmd_arg=namespace.rootdir or None,
        invocation_dir=early_config.invocation_params.dir,
    )
    if (rootpath, inipath) == (early_config.rootpath, early_config.inipath):
        return
    option, value = next(((o, v) for o, v in separate if os.path.exists(v)), separate[0])
    read = early_config.inipath or f"no configuration file (rootdir {early_config.rootpath})"
    raise pytest.UsageError(
        f"mhc-parity: pytest took the value of {option} {value} for a test path and read {read} "
        f"instead of {inipath or rootpath}; write {shlex.quote(f'{option}={value}')}"
    )


def enabled_early(early_config) -> bool:
    """`enabled` before pytest parsed its whole command line: the option from `known_args_namespace` (the
    ini file is read by then)."""
    impl = getattr(early_config.known_args_namespace, "parity_impl", None)
    return bool(impl or early_config.getini("parity_impl") or early_config.getini(BUILTIN_INI))


def ini_overrides(args) -> list[str]:
    found, args, index = [], [str(a) for a in args], 0
    while index < len(args):
        arg, value = args[index], None
        if arg in ("-o", "--override-ini") and index + 1 < len(args):
            value, index = args[index + 1], index + 1
        elif arg.startswith("--override-ini="):
            value = arg.partition("=")[2]
        elif arg.startswith("-o") and not arg.startswith("--"):
            value = arg[2:]
        if value and value.startswith("parity_"):
            found += ["-o", value]
        index += 1
    return found


def update_command(config) -> str:
    """The pytest command that writes this session's baseline: its parity options and ini overrides, the
    suite it took from $MHC_PARITY_SUITE, and the update flag."""
    words = ["pytest"]
    for name in UPDATE_COMMAND_OPTIONS:
        value = config.getoption(f"--parity-{name}")
        if value:  # one word: pytest takes the value of `--parity-<name> VALUE` for a test path
            words.append(f"--parity-{name}={value}")
    words += ini_overrides(config.invocation_params.args)
    if not setting(config, "suite") and environment_setting(SUITE_VARIABLE):
        words.append(f"--parity-suite={environment_setting(SUITE_VARIABLE)}")
    return shlex.join([*words, UPDATE_OPTION])
