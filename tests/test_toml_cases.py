"""mhc_parity.cases.toml_cases: user case files load, register and select; malformed ones fail clearly."""

from __future__ import annotations

import textwrap

import pytest

from mhc_parity.cases.registry import DuplicateCaseError, Registry, fresh_registry
from mhc_parity.cases.toml_cases import CaseFileError, load_case_file, register_case_file

GOOD = """
[defaults]
dtype = "bf16"
tags = ["mine"]

[[case]]
name = "my-lite-n4-c256"
batch = 2
sequence = 128
streams = 4
embedding = 256
branch = "mlp"
init = "bf16_inexact_gates"
seed = 3
mesh = [2, 4]
block_tokens = 32
tags = ["extra"]
suites = ["adversarial"]

[[case]]
name = "my-odd-embedding"
batch = 1
sequence = 64
streams = 2
embedding = 96
weight_dtype = "bfloat16"
expect = "unsupported"
expect_reason = "multiple of 128"
"""


def _write(tmp_path, text, name="cases.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_good_file_loads_registers_and_is_selectable(tmp_path):
    path = _write(tmp_path, GOOD)
    first, second = load_case_file(path)
    assert first.dtype == "bfloat16" and first.mesh == (2, 4) and first.tags == ("mine", "extra")
    assert first.block_tokens == 32 and first.seed == 3 and first.init == "bf16_inexact_gates"
    assert second.expects_unsupported and second.weight_dtype == "bfloat16" and second.tags == ("mine",)
    registry = fresh_registry()
    before = len(registry)
    register_case_file(path, registry)
    assert len(registry) == before + 2
    assert [c.name for c in registry.select(suite="user")] == ["my-lite-n4-c256", "my-odd-embedding"]
    assert "my-lite-n4-c256" in [c.name for c in registry.select(suite="adversarial")]
    assert [c.name for c in registry.select(suite="user", tags="extra")] == ["my-lite-n4-c256"]
    assert [c.name for c in registry.select(tags=["mine", "unsupported"])] == ["my-odd-embedding"]
    assert "my-lite-n4-c256" not in fresh_registry()  # the shared catalogue is untouched


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            'name = "c1"\nbatch = 2\nsequence = 8\nstreams = 4\nembedding = 128\nbathc = 3',
            ["case 'c1'", "unknown field(s) 'bathc'", "did you mean 'batch'"],
        ),
        (
            'name = "c1"\nbatch = "two"\nsequence = 8\nstreams = 4\nembedding = 128',
            ["case 'c1'", "field 'batch'", "must be an integer"],
        ),
        (
            'name = "c1"\nbatch = true\nsequence = 8\nstreams = 4\nembedding = 128',
            ["case 'c1'", "field 'batch'", "must be an integer"],
        ),
        (
            'name = "c1"\nbatch = 0\nsequence = 8\nstreams = 4\nembedding = 128',
            ["case 'c1'", "field 'batch'", "positive"],
        ),
        ('name = "c1"\nbatch = 2\nsequence = 8\nstreams = 4', ["case 'c1'", "missing required field(s) 'embedding'"]),
        ("batch = 2\nsequence = 8\nstreams = 4\nembedding = 128", ["case entry 1", "missing required field(s) 'name'"]),
        (
            'name = "c1"\nbatch = 2\nsequence = 8\nstreams = 4\nembedding = 128\ndtype = "float16"',
            ["case 'c1'", "field 'dtype'"],
        ),
        (
            'name = "c1"\nbatch = 2\nsequence = 8\nstreams = 4\nembedding = 128\nmesh = [2, 4, 1]',
            ["case 'c1'", "field 'mesh'"],
        ),
        (
            'name = "c1"\nbatch = 2\nsequence = 8\nstreams = 4\nembedding = 128\ninit = "saturated"',
            ["case 'c1'", "field 'init'", "saturated_gates"],
        ),
        (
            'name = "c1"\nbatch = 2\nsequence = 8\nstreams = 4\nembedding = 128\nexpect = "unsupported"',
            ["case 'c1'", "field 'expect_reason'"],
        ),
        (
            'name = "c1"\nbatch = 2\nsequence = 8\nstreams = 4\nembedding = 128\ntags = "a"',
            ["case 'c1'", "field 'tags'", "list of strings"],
        ),
    ],
    ids=[
        "unknown-field",
        "string-int",
        "bool-int",
        "zero",
        "missing-field",
        "missing-name",
        "bad-dtype",
        "bad-mesh",
        "bad-init",
        "reason-missing",
        "tags-not-list",
    ],
)
def test_malformed_cases_name_the_file_case_and_field(tmp_path, body, expected):
    path = _write(tmp_path, "[[case]]\n" + body + "\n")
    with pytest.raises(CaseFileError) as info:
        load_case_file(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in expected:
        assert fragment in message, message


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[[case]]\nname = \n", "not valid TOML"),
        (
            "title = 'x'\n[[case]]\nname='a'\nbatch=1\nsequence=8\nstreams=2\nembedding=128\n",
            "top level: unknown field(s) 'title'",
        ),
        (
            "[defaults]\nname = 'x'\n[[case]]\nname='a'\nbatch=1\nsequence=8\nstreams=2\nembedding=128\n",
            "[defaults]: unknown field(s) 'name'",
        ),
        ("[defaults]\nseed = 1\n", "no [[case]] tables"),
        ("[case]\nname = 'a'\n", "[[case]] tables"),
        (
            "[[case]]\nname='a'\nbatch=1\nsequence=8\nstreams=2\nembedding=128\n"
            "[[case]]\nname='a'\nbatch=2\nsequence=8\nstreams=2\nembedding=128\n",
            "duplicate name",
        ),
    ],
    ids=["syntax", "top-level-key", "defaults-name", "no-cases", "case-not-array", "duplicate-in-file"],
)
def test_malformed_files_fail_clearly(tmp_path, text, expected):
    with pytest.raises(CaseFileError, match=None) as info:
        load_case_file(_write(tmp_path, text))
    assert expected in str(info.value)


def test_missing_file_and_clash_with_the_catalogue(tmp_path):
    with pytest.raises(CaseFileError, match="not found"):
        load_case_file(tmp_path / "absent.toml")
    clash = _write(
        tmp_path,
        "[[case]]\nname='lite-n4-c128-b2s64-f32-w32-identity-default'\nbatch=1\nsequence=8\nstreams=2\nembedding=128\n",
    )
    registry = fresh_registry()
    size = len(registry)
    with pytest.raises(DuplicateCaseError, match="already registered"):
        register_case_file(clash, registry)
    assert len(registry) == size


def test_cli_lists_a_case_file(tmp_path, capsys):
    from mhc_parity.cases.__main__ import main

    path = _write(tmp_path, GOOD)
    assert main(["list", "--case-file", str(path), "--suite", "user"]) == 0
    out = capsys.readouterr().out
    assert "my-lite-n4-c256" in out and "data=2,fsdp=4" in out and "2 case(s)" in out
    bad = _write(tmp_path, "[[case]]\nname='x'\n", "bad.toml")
    assert main(["list", "--case-file", str(bad)]) == 2
    assert "missing required field" in capsys.readouterr().err


def test_registry_helper_accepts_an_empty_registry(tmp_path):
    registry = Registry()
    register_case_file(_write(tmp_path, GOOD), registry)
    assert set(registry.suites()) == {"user", "adversarial"}


def test_a_binary_case_file_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "cases.toml"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(CaseFileError, match=r"cases\.toml: not a UTF-8 text file"):
        load_case_file(path)
