"""The one size parser, "did you mean" and unknown-key check every configuration reader
uses (issue 17: one rule for a size everywhere)."""

from __future__ import annotations

import pytest

from cxlssd.errors import ConfigError
from cxlssd.validation import check_keys, did_you_mean, parse_size


@pytest.mark.parametrize(
    ("value", "size_bytes"),
    [("448MiB", 448 << 20), ("448mib", 448 << 20), ("1.5GiB", 3 << 29), ("1.5KiB", 1536), ("4096", 4096),
     ("4096B", 4096), (" 2 TiB ", 2 << 40), (4096, 4096)],
)
def test_a_size_is_read_the_same_everywhere(value: object, size_bytes: int) -> None:
    assert parse_size(value, "k") == size_bytes


@pytest.mark.parametrize(
    ("value", "message"),
    [("1GB", "is not a size"), ("0.5B", "is not a size"), ("1.0000000001KiB", "is not a size"),
     ("9" * 40, "is not a size"), (True, "is not a size"), (2.0, "is not a size"), (None, "is not a size"),
     ("0", "at least 1 bytes"), (-5, "at least 1 bytes")],
)
def test_a_bad_size_names_its_key_and_the_fix(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^ssd.size: .*{message}"):
        parse_size(value, "ssd.size")


def test_zero_is_a_size_where_the_reader_allows_it() -> None:
    assert parse_size("0MiB", "k", minimum_bytes=0) == 0
    with pytest.raises(ConfigError, match="at least 0 bytes"):
        parse_size(-1, "k", minimum_bytes=0)


def test_did_you_mean_names_the_closest_choice_or_nothing() -> None:
    assert did_you_mean("skybyte-ful", ["base-cssd", "skybyte-full"]) == " (did you mean 'skybyte-full'?)"
    assert did_you_mean("zzz", ["base-cssd"]) == ""
    assert did_you_mean("x" * 1000, ["x" * 999]) == ""  # no quadratic matching of huge words


def test_an_unknown_key_gets_the_closest_allowed_one_or_the_list() -> None:
    check_keys({"ways": 1}, {"ways", "size"}, "cache")
    with pytest.raises(ConfigError, match=r"^cache: unknown key 'wayz'; did you mean 'ways'\?$"):
        check_keys({"wayz": 1}, {"ways", "size"}, "cache")
    with pytest.raises(ConfigError, match=r"^cache: unknown key 'qqq'; allowed keys: size, ways$"):
        check_keys({"qqq": 1}, {"ways", "size"}, "cache")
