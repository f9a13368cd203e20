"""Platform configuration: sizes, keys and limits are checked with clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from cxlssd.errors import ConfigError
from cxlssd.platform.config import (
    CONFIG_DIR,
    GiB,
    MiB,
    config_from_dict,
    format_size,
    load_config,
    parse_size,
)


@pytest.mark.parametrize(
    ("text", "size_bytes"),
    [("1GiB", GiB), ("512MiB", 512 * MiB), ("4096", 4096), (" 2 GiB ", 2 * GiB), (1024, 1024)],
)
def test_parse_size(text: object, size_bytes: int) -> None:
    assert parse_size(text, "k") == size_bytes


@pytest.mark.parametrize("text", ["1GB", "-1GiB", "0", "lots", True, 1.5, "1 PiB"])
def test_parse_size_rejects(text: object) -> None:
    with pytest.raises(ConfigError, match="k"):
        parse_size(text, "k")


def test_format_size_round_trips() -> None:
    for size in (GiB, 768 * MiB, 3 * 1024, 5):
        assert parse_size(format_size(size), "k") == size


def test_shipped_configs_load() -> None:
    default = load_config()
    assert default.cxl_total_bytes == GiB and default.guest.vcpus == 1
    two = load_config(CONFIG_DIR / "two-devices.yaml")
    assert [d.size_bytes for d in two.cxl_devices] == [512 * MiB, 256 * MiB]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"gust": {}}, "unknown key 'gust'; did you mean 'guest'"),
        ({"guest": {"vcpu": 2}}, "did you mean 'vcpus'"),
        ({"guest": {"vcpus": 0}}, "guest.vcpus: must be positive"),
        ({"guest": {"dram": "100MiB"}}, "not a multiple of 128MiB"),
        ({"guest": []}, "expected a mapping"),
        ({"cxl_devices": [{"size": "300MiB"}]}, "not a multiple of 256MiB"),
        ({"cxl_devices": [{}]}, "missing 'size'"),
        ({"cxl_devices": []}, "non-empty list"),
        ({"cxl_devices": [{"size": "1GiB", "kind": "pmem"}]}, "unknown key 'kind'"),
        ({"name": "bad name!"}, "name 'bad name!'"),
        ("just text", "expected a mapping"),
    ],
)
def test_bad_config_is_named(raw: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        config_from_dict(raw, "test.yaml")


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("guest:\n  dram: [2GiB\n")
    with pytest.raises(ConfigError, match=r"malformed YAML at line \d"):
        load_config(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read platform config"):
        load_config(tmp_path / "nope.yaml")
