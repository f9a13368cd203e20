"""Platform configuration: sizes, keys and limits are checked with clear errors;
a dynamic capacity device reaches QEMU's command line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cxlssd.errors import ConfigError
from cxlssd.models import generated_section, reference_table
from cxlssd.platform.config import (
    CONFIG_DIR,
    SECTIONS,
    DynamicCapacityConfig,
    GiB,
    MiB,
    config_from_dict,
    load_config,
    load_multi_config,
)
from cxlssd.platform.qemu import LaunchFiles, QemuBinary, qemu_argv
from cxlssd.validation import format_size, parse_size


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
    assert all(d.dynamic_capacity is None for d in (*default.cxl_devices, *two.cxl_devices))
    dcd = load_config(CONFIG_DIR / "dcd.yaml")
    assert dcd.cxl_devices[0].size_bytes == GiB
    assert dcd.cxl_devices[0].dynamic_capacity == DynamicCapacityConfig(regions=1, size_bytes=256 * MiB)
    assert dcd.cxl_total_bytes == GiB + 256 * MiB  # the host backs the dynamic capacity too


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"gust": {}}, "unknown key 'gust'; did you mean 'guest'"),
        ({"guest": {"vcpu": 2}}, "did you mean 'vcpus'"),
        ({"guest": {"dramm": "1GiB"}}, "test.yaml: guest: unknown key 'dramm'; did you mean 'dram'?"),
        ({"guest": {"dram": "2GB"}}, "test.yaml: guest.dram: '2GB' is not a size"),
        ({"cpu": {"cpi": True}}, "test.yaml: cpu.cpi: expected a number, got True"),
        ({"guest": {"vcpus": 0}}, "guest.vcpus: must be positive"),
        ({"cpu": {"string_bytes_per_insn": 0}}, "cpu.string_bytes_per_insn: must be positive"),
        ({"cpu": {"string_bytes_per_insn": 8192}}, "at most 4096"),
        ({"guest": {"dram": "100MiB"}}, "not a multiple of 128MiB"),
        ({"guest": {"movable_dram": "100MiB"}}, "guest.movable_dram: 100MiB is not a multiple of 128MiB"),
        ({"guest": {"movable_dram": "16GiB"}}, "16GiB is more than the 8GiB QEMU's memory hotplug"),
        ({"guest": {"clock": "wall"}}, "guest.clock: expected one of instructions, host, got 'wall'"),
        ({"guest": {"kernel_helper": "yes"}}, "guest.kernel_helper: expected true or false, got 'yes'"),
        ({"guest": {"vcpus": 2}}, "vcpus: 2 with clock: instructions is not supported"),
        ({"guest": []}, "expected a mapping"),
        ({"cxl_devices": [{"size": "300MiB"}]}, "not a multiple of 256MiB"),
        ({"cxl_devices": [{}]}, "missing 'size'"),
        ({"cxl_devices": []}, "non-empty list"),
        ({"cxl_devices": [{"size": "1GiB", "kind": "pmem"}]}, "unknown key 'kind'"),
        ({"name": "bad name!"}, "name: 'bad name!' must be 1-32 letters"),
        ({"cxl_devices": [{"size": "1GiB", "dynamic_capacity": {"region": 1}}]},
         "dynamic_capacity: unknown key 'region'; did you mean 'regions'"),
        ({"cxl_devices": [{"size": "1GiB", "dynamic_capacity": {"regions": 2}}]}, "missing 'size'"),
        ({"cxl_devices": [{"size": "1GiB", "dynamic_capacity": {"regions": 0, "size": "256MiB"}}]},
         "dynamic_capacity.regions: must be positive"),
        ({"cxl_devices": [{"size": "1GiB", "dynamic_capacity": {"regions": 9, "size": "9GiB"}}]},
         "9 DC regions; a device has at most 8"),
        ({"cxl_devices": [{"size": "1GiB", "dynamic_capacity": {"regions": 2, "size": "256MiB"}}]},
         "dynamic_capacity.size: 256MiB does not split into 2 region"),
        ({"cxl_devices": [{"size": "1GiB", "dynamic_capacity": {"regions": 2, "size": "768MiB"}}]},
         "use e.g. 512MiB or 1GiB"),
        ({"cxl_devices": [{"size": "1GiB", "dynamic_capacity": {"size": "100MiB"}}]}, "does not split"),
        ({"cxl_devices": [{"size": "1GiB", "dynamic_capacity": "256MiB"}]}, "expected a mapping"),
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


def test_a_variant_extends_another_and_states_only_what_differs(tmp_path: Path) -> None:
    # skybyte-64 is the default platform but for its LLC: whatever default.yaml says
    # about the guest and devices, it says too.
    default, variant = load_config(), load_config(CONFIG_DIR / "skybyte-64.yaml")
    assert variant.name == "skybyte-64" and variant.cpu.llc_bytes == 256 * 1024
    same = {"name", "cpu", "source"}
    assert variant.model_dump(exclude=same) == default.model_dump(exclude=same)
    assert variant.cpu.model_dump(exclude={"llc_bytes"}) == default.cpu.model_dump(exclude={"llc_bytes"})
    # Mappings merge key by key, a list replaces the base's, a chain resolves
    # relative to each file, and multi-guest files extend the same way.
    (tmp_path / "base.yaml").write_text(
        "name: base\nguest: {dram: 1GiB, vcpus: 2, clock: host}\ncxl_devices: [{size: 1GiB}]\n")
    (tmp_path / "mid.yaml").write_text("name: mid\nextends: base.yaml\nguest: {vcpus: 3}\n")
    (tmp_path / "top.yaml").write_text(
        "name: top\nextends: mid.yaml\ncxl_devices: [{size: 256MiB}, {size: 512MiB}]\n")
    top = load_config(tmp_path / "top.yaml")
    assert (top.name, top.guest.dram_bytes, top.guest.vcpus) == ("top", GiB, 3)
    assert [d.size_bytes for d in top.cxl_devices] == [256 * MiB, 512 * MiB]
    assert load_multi_config(tmp_path / "top.yaml").platforms == (top,)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"a.yaml": "name: a\nextends: a.yaml\n"}, "already in the chain"),
        ({"a.yaml": "name: a\nextends: b.yaml\n", "b.yaml": "name: b\nextends: a.yaml\n"},
         "remove the cycle"),
        ({"a.yaml": "name: a\nextends: nope\n"}, "extends: no platform config 'nope'"),
        ({"a.yaml": "extends: default\ncpu: {llc: 1MiB}\n"}, "needs a name of its own"),
        ({"a.yaml": "name: a\nextends: [default]\n"}, "expected the name of a platform file"),
        ({"a.yaml": "name: a\nextends: b.yaml\n", "b.yaml": "- 1\n"}, "expected a mapping"),
        ({"a.yaml": "name: a\nextends: default\ncpu: {lcc: 1MiB}\n"}, "did you mean 'llc'"),
        # a key from the base is named with the chain it came through
        ({"a.yaml": "name: a\nextends: b.yaml\n", "b.yaml": "name: b\nextends: c.yaml\n",
          "c.yaml": "name: c\nguest: {dramm: 1GiB}\n"},
         r"a\.yaml \(extends b\.yaml -> c\.yaml\): guest: unknown key 'dramm'"),
        ({f"f{i}.yaml": f"name: f{i}\nextends: f{i + 1}.yaml\n" for i in range(9)}
         | {"f9.yaml": "name: f9\n"}, "more than 8 files deep"),
    ],
)
def test_a_bad_extends_is_refused_in_one_line(tmp_path: Path, files: dict[str, str], message: str) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    first = tmp_path / next(iter(files))
    with pytest.raises(ConfigError, match=message):
        load_config(first)


def _argv(config_name: str) -> list[str]:
    config = load_config(CONFIG_DIR / config_name)
    run = Path("/run/x")
    files = LaunchFiles(
        kernel=Path("/k"), rootfs=Path("/r"), qmp_socket=run / "qmp.sock", serial_log=Path("/log/serial"),
        host_key=run / "hk", authorized_keys=run / "ak",
        cxl_backing=tuple(run / f"cxl{i}.raw" for i in range(len(config.cxl_devices))),
    )
    return qemu_argv(QemuBinary("/usr/bin/qemu", (10, 0, 2)), config, files)


def test_dynamic_capacity_reaches_the_qemu_device() -> None:
    """dcd.yaml: a DC backend next to the static one in the runtime dir, the device's
    DC options; the window stays the static capacity (the guest cannot map DC)."""
    argv = _argv("dcd.yaml")
    assert "memory-backend-file,id=cxl-dc0,share=on,mem-path=/run/x/cxl0-dc.raw,size=256M" in argv
    assert (
        "cxl-type3,bus=cxl-rp0,volatile-memdev=cxl-mem0,volatile-dc-memdev=cxl-dc0,num-dc-regions=1,"
        "id=cxl-vmem0,x-pcie-err-unc-mask=off"
    ) in argv
    assert "cxl-fmw.0.targets.0=cxl.0,cxl-fmw.0.size=1024M" in argv
    plain = _argv("default.yaml")
    assert not any("dc-memdev" in a or "cxl-dc" in a for a in plain)


def test_the_docs_key_reference_is_generated_from_the_models() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "platform.md"
    assert generated_section(doc, "platform config", reference_table(SECTIONS, options=False),
                             update=bool(os.environ.get("CXLSSD_UPDATE_DOCS"))), (
        "docs/platform.md's key reference is stale: rerun with CXLSSD_UPDATE_DOCS=1")
