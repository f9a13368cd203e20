"""Run-time injection through QEMU's CXL QMP commands (issue 7, QMP part).

Unit tests check every validation without a VM, and the CLI's errors through
``cxlssd.cli.main``; a QEMU started paused (no guest, <1 s) checks that every kind's
arguments are accepted by the real QEMU 10 and that the by-name path works (a DCD
one: dynamic capacity, checked against the regions QEMU reports); the guest tests
inject each kind into the session's shared guest and find its effect there. Dynamic
capacity needs a DCD (platform/configs/dcd.yaml) and the uncorrectable error breaks
the device's region (link reset): each gets a guest of its own, last in the module.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cxlssd.cli import build_parser, main
from cxlssd.errors import ConfigError
from cxlssd.experiments.observe import enable_cxl_tracing, trace_fields, trace_lines, wait_for_trace
from cxlssd.firmware.knobs import DieFault, FlushThrottle, GcStorm
from cxlssd.lifecycle import ProcessId
from cxlssd.models import generated_section, options_of, reference_table
from cxlssd.paths import runtime_root
from cxlssd.platform.config import CONFIG_DIR, load_config
from cxlssd.platform.inject import (
    Correctable,
    DcAdd,
    DcExtent,
    DcLayout,
    DcRelease,
    DeviceView,
    DramEvent,
    FirmwareKill,
    GeneralMediaEvent,
    Injection,
    MemoryModuleEvent,
    Poison,
    RunningInstance,
    Uncorrectable,
    UncorrectableError,
    inject,
    prepare,
    read_dc_layout,
    running_instances,
    unmask_corrected_internal_errors,
)
from cxlssd.platform.inject_commands import COMMANDS, build_injection, register
from cxlssd.platform.machine import Platform
from cxlssd.platform.qemu import check_qemu

GiB = 1 << 30
MiB = 1 << 20
DEVICE = DeviceView(index=0, size_bytes=GiB, memdev="mem0", region="region0", hpa_base=0x410000000)
# A DCD: two 256 MiB DC regions after its 1 GiB of static capacity.
DCD = DeviceView(index=0, size_bytes=GiB, dynamic_capacity=DcLayout(regions=2, region_bytes=256 * MiB,
                                                                    base_dpa=GiB))


def _extents(*pairs_mib: tuple[int, int]) -> tuple[DcExtent, ...]:
    return tuple(DcExtent(offset=o * MiB, length=n * MiB) for o, n in pairs_mib)


def run_cli(*argv: str) -> int:
    """``./cxlssd ARGV`` in-process: its exit status (argparse errors exit, others return)."""
    try:
        return main(list(argv))
    except SystemExit as exit_:
        return int(exit_.code or 0)


# -- validation, no VM -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Poison(dpa=0x1001), r"0x1001 is not 64-byte aligned.*use 0x1000 or 0x1040"),
        (lambda: Poison(dpa=0x1000, length=0), "positive multiple of 64"),
        (lambda: Poison(dpa=0x1000, length=100), "positive multiple of 64"),
        (lambda: Poison(dpa=-64), "non-negative"),
        (lambda: Poison(dpa=0, device=-1), "device index"),
        (lambda: Uncorrectable(errors=()), "at least one error type"),
        (lambda: UncorrectableError(error_type="mem-data-ec"), "did you mean 'mem-data-ecc'"),
        (lambda: UncorrectableError(error_type="internal", header=(0,) * 33), "at most 32"),
        (lambda: UncorrectableError(error_type="internal", header=(1 << 32,)), "32-bit"),
        (lambda: Correctable(error_type="bogus"), "unknown.*known: cache-data-ecc"),
        (lambda: GeneralMediaEvent(dpa=0x2000, log="debug"), "event log 'debug' is unknown"),
        (lambda: GeneralMediaEvent(dpa=0x2010), "not 64-byte aligned"),
        (lambda: GeneralMediaEvent(dpa=0, flags=0x40), "undefined bits"),
        (lambda: GeneralMediaEvent(dpa=0, descriptor=8), "undefined bits.*poison-list-overflow"),
        (lambda: GeneralMediaEvent(dpa=0, event_type=3), "event type 3 is not a known value"),
        (lambda: GeneralMediaEvent(dpa=0, event_type="ecc-eror"), "did you mean 'ecc-error'"),
        (lambda: GeneralMediaEvent(dpa=0, transaction_type=7), "transaction type 7"),
        (lambda: GeneralMediaEvent(dpa=0, channel=256), "8-bit"),
        (lambda: GeneralMediaEvent(dpa=0, device_mask=1 << 24), "24-bit"),
        (lambda: GeneralMediaEvent(dpa=0, component_id="x" * 16), "1-15 ASCII"),
        (lambda: DramEvent(dpa=0, event_type=4), "event type 4"),
        (lambda: DramEvent(dpa=0, row=1 << 24), "24-bit"),
        (lambda: DramEvent(dpa=0, column=1 << 16), "16-bit"),
        (lambda: DramEvent(dpa=0, correction_mask=(1, 2, 3, 4, 5)), "at most 4"),
        (lambda: MemoryModuleEvent(event_type=6), "event type 6"),
        (lambda: MemoryModuleEvent(health_status=8), "undefined bits"),
        (lambda: MemoryModuleEvent(media_status=10), "media status 10"),
        (lambda: MemoryModuleEvent(additional_status=0x3), "reserved value 3"),
        (lambda: MemoryModuleEvent(additional_status=0x40), "6-bit"),
        (lambda: MemoryModuleEvent(life_used=101), "percentage"),
        (lambda: MemoryModuleEvent(temperature=1 << 15), "16 bits signed"),
        (lambda: MemoryModuleEvent(dirty_shutdown_count=1 << 32), "32-bit"),
        (lambda: DcAdd(extents=()), "needs 1..512 extents"),
        (lambda: DcAdd(extents=_extents(*[(2 * i, 2) for i in range(513)])), "needs 1..512 extents"),
        (lambda: DcAdd(extents=(DcExtent(offset=0x1000, length=2 * MiB),)),
         r"DC extent offset: 0x1000 is not a multiple of the DC block size 2MiB.*use 0x0 or 0x200000"),
        (lambda: DcAdd(extents=_extents((0, 3))), r"length: 0x300000 is not a multiple"),
        (lambda: DcRelease(extents=_extents((2, 0))), "has length 0"),
        (lambda: DcAdd(extents=(DcExtent(offset=-2 * MiB, length=2 * MiB),)), "non-negative"),
        (lambda: DcAdd(extents=_extents((0, 4), (2, 2))), r"0x0\+0x400000 and 0x200000\+0x200000 overlap"),
        (lambda: DcAdd(region=8, extents=_extents((0, 2))), "dc-add region: 8 must be a DC region index"),
        (lambda: DcAdd(extents=(0x200000,)), "extent 2097152 is not an offset and a length"),
        (lambda: DcRelease(extents=({"offset": 0, "len": 2 * MiB},)),
         r"dc-release extents\[0\]: unknown key 'len'; did you mean 'length'"),
    ],
)
def test_malformed_injections_are_rejected_when_built(build: Callable[[], object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build()


@pytest.mark.parametrize(
    ("injection", "message"),
    [
        (Poison(dpa=GiB), r"outside device 0 \(1024 MiB.*below 0x3fffffc0"),
        (Poison(dpa=GiB - 64, length=128), "outside device 0"),
        (GeneralMediaEvent(dpa=2 * GiB), "outside device 0"),
        (DramEvent(dpa=GiB), "outside device 0"),
        (Poison(dpa=0, device=1), r"device 1 does not exist.*1 CXL device\(s\) \(index 0\)"),
        (Correctable(error_type="physical", device=3), "device 3 does not exist"),
        (DcAdd(extents=_extents((0, 2))),
         r"device 0 is not a dynamic capacity device.*--config platform/configs/dcd.yaml"),
        (DcRelease(extents=_extents((0, 2))), "not a dynamic capacity device"),
    ],
)
def test_injections_outside_the_device_are_rejected(injection: Injection, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        prepare(injection, [DEVICE], "test-instance")


@pytest.mark.parametrize(
    ("injection", "message"),
    [
        (DcAdd(region=2, extents=_extents((0, 2))),
         r"DC region 2 does not exist: device 0 has 2 DC region\(s\) \(index 0..1\)"),
        (DcAdd(region=1, extents=_extents((254, 4))),
         r"0xfe00000\+0x400000 is beyond the end of DC region 1 \(256MiB: offsets 0x0..0xfffffff, "
         r"DPA 0x50000000..0x5fffffff\); use an offset up to 0xfc00000"),
        (DcRelease(extents=_extents((0, 2), (256, 2))), "beyond the end of DC region 0"),
        (DcAdd(extents=_extents((0, 512))), "use a shorter extent"),
    ],
)
def test_dynamic_capacity_outside_the_dc_regions_is_rejected(injection: Injection, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        prepare(injection, [DCD], "test-instance")


def test_qmp_arguments_use_qemu_10_names() -> None:
    """The argument names and encodings of QEMU 10.0's qapi/cxl.json."""
    _, args = prepare(Poison(dpa=GiB - 64), [DEVICE], "t")
    assert args == {"path": "/machine/peripheral/cxl-vmem0", "start": GiB - 64, "length": 64}
    _, args = prepare(
        GeneralMediaEvent(dpa=0x2000, event_type="data-path-error", channel=1, device_mask=5,
                          component_id="dimm0", not_repairable=True),
        [DEVICE], "t",
    )
    assert args == {
        "path": "/machine/peripheral/cxl-vmem0", "log": "failure", "flags": 2, "dpa": 0x2003,
        "descriptor": 1, "type": 2, "transaction-type": 1, "channel": 1, "device": 5,
        "component-id": "dimm0",
    }
    dram = DramEvent(dpa=0x40, log="warning", flags=0x9, event_type=1, transaction_type="host-write",
                     bank_group=2, row=7, correction_mask=(1, 2)).arguments()
    assert dram == {
        "log": "warning", "flags": 9, "dpa": 0x41, "descriptor": 1, "type": 1, "transaction-type": 2,
        "bank-group": 2, "row": 7, "correction-mask": [1, 2],
    }
    module = MemoryModuleEvent(event_type="temperature-change", temperature=-5).arguments()
    assert module["type"] == 3 and module["temperature"] == -5 and module["flags"] == 0
    assert Uncorrectable(
        errors=(UncorrectableError(error_type="internal", header=(1, 2)),)
    ).arguments() == {"errors": [{"type": "internal", "header": [1, 2]}]}
    assert Correctable(error_type="mem-data-ecc").arguments() == {"type": "mem-data-ecc"}
    _, args = prepare(DcAdd(region=1, extents=_extents((0, 2), (8, 4))), [DCD], "t")
    assert args == {
        "path": "/machine/peripheral/cxl-vmem0", "host-id": 0, "selection-policy": "prescriptive",
        "region": 1, "extents": [{"offset": 0, "len": 2 * MiB}, {"offset": 8 * MiB, "len": 4 * MiB}],
    }
    assert DcRelease(extents=_extents((254, 2))).arguments() == {
        "host-id": 0, "removal-policy": "prescriptive", "region": 0,
        "extents": [{"offset": 254 * MiB, "len": 2 * MiB}],
    }
    # Pairs and mappings (a scenario's YAML) are extents too.
    given = ((0, 2 * MiB), {"offset": 4 * MiB, "length": 2 * MiB})
    assert DcAdd(extents=given).extents == _extents((0, 2), (4, 2))  # type: ignore[arg-type]


# -- the CLI, no VM: a fake running instance (this process stands in for it) ------------


@pytest.fixture
def fake_instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A runtime dir that looks like a running instance; its QMP endpoint does not
    exist, so anything that got past validation would fail differently. It lives in
    a runtime root of its own, so guests the session runs meanwhile are not listed."""
    monkeypatch.setenv("CXLSSD_RUNTIME", str(tmp_path / "runtime"))
    name = f"fake-{os.getpid()}"
    rundir = runtime_root() / name
    rundir.mkdir(mode=0o700)
    for pid_file in ("owner.pid", "qemu.pid"):
        (rundir / pid_file).write_text(ProcessId.of_self().text())
    (rundir / "instance.json").write_text(json.dumps({
        "name": name, "inject_socket": str(rundir / "inject.sock"),
        "devices": [{"index": 0, "size_bytes": GiB}],
    }))
    yield name
    shutil.rmtree(rundir)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["poison", "--dpa", "0x1001"], r"poison --dpa: 0x1001 is not 64-byte aligned .*0x1000 or 0x1040"),
        (["poison", "--dpa", "0x40000000"], "outside device 0"),
        (["poison", "--dpa", "0x1000", "--length", "96"], "multiple of 64"),
        (["poison", "--dpa", "0x1000", "--device", "1"], "device 1 does not exist"),
        (["correctable", "--type", "mem-data"], "did you mean 'mem-data-ecc'"),
        (["uncorrectable", "--type", "nonsense"], "uncorrectable error type 'nonsense' is unknown"),
        (["general-media", "--dpa", "0x2000", "--log", "loud"], "event log 'loud' is unknown"),
        (["dram", "--dpa", "0x2000", "--type", "9"], "event type 9 is not a known value"),
        (["memory-module", "--life-used", "150"], "percentage"),
        (["dc-add", "--extent", "0:3MiB"], r"--extent\[0\]\.length: 0x300000 is not a multiple of the DC"),
        (["dc-release", "--region", "9", "--extent", "0:2MiB"], "dc-release --region: 9 must be a DC region"),
        (["dc-add", "--extent", "0:2MiB", "--extent", "0x100000:0x200000"],
         r"dc-add --extent\[1\]\.offset: 0x100000 is not"),
        (["general-media", "--dpa", "0", "--flags", "permanant"],
         r"general-media --flags: 'permanant' is not one"),
        (["memory-module", "--temperature", "40000"], "memory-module --temperature: 40000 must fit 16 bits"),
    ],
)
def test_cli_rejects_malformed_injections(
    fake_instance: str, options: list[str], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert run_cli("inject", "--instance", fake_instance, *options) == 2
    assert re.search(message, caplog.text), caplog.text
    assert "cannot talk" not in caplog.text  # nothing was sent


def test_cli_names_the_running_instances_when_the_instance_is_not_running(
    fake_instance: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert running_instances() == [fake_instance]
    assert run_cli("inject", "--instance", "default-000000", "poison", "--dpa", "0") == 2
    assert f"instance 'default-000000' is not running (running instances: {fake_instance})" in caplog.text


def test_a_dead_instance_is_not_running(fake_instance: str, caplog: pytest.LogCaptureFixture) -> None:
    (runtime_root() / fake_instance / "qemu.pid").write_text("999999999")
    assert run_cli("inject", "--instance", fake_instance, "poison", "--dpa", "0") == 2
    assert "is not running (running instances: none)" in caplog.text


def test_cli_rejects_an_unknown_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("inject", "--instance", "x", "meteor-strike") == 2
    assert "invalid choice: 'meteor-strike'" in capsys.readouterr().err


def test_cli_rejects_a_malformed_number(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("inject", "--instance", "x", "poison", "--dpa", "0x1g") == 2
    assert "'0x1g' is not a number" in capsys.readouterr().err
    assert run_cli("inject", "--instance", "x", "dc-add", "--extent", "2MiB") == 2
    assert "'2MiB' is not OFFSET:LENGTH" in capsys.readouterr().err
    assert run_cli("inject", "--instance", "x", "dc-add", "--extent", "0:2MB") == 2
    assert "'2MB' is not a byte count" in capsys.readouterr().err


def _kind_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    (inject_action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    (kinds,) = [a for a in inject_action.choices["inject"]._actions
                if isinstance(a, argparse._SubParsersAction)]
    return dict(kinds.choices)


def test_every_field_of_every_kind_is_an_option() -> None:
    """The options are generated from the models: none is left out (a tuple of models
    given by its key contributes the key's option and its other fields')."""
    parsers = _kind_parsers()
    assert set(parsers) == set(COMMANDS)
    for kind, model in COMMANDS.items():
        options = {o for action in parsers[kind]._actions for o in action.option_strings}
        for name, info in model.model_fields.items():
            assert options_of(name, info) and set(options_of(name, info)) <= options, (kind, name)
    assert options_of("errors", Uncorrectable.model_fields["errors"]) == ["--type", "--header"]
    assert options_of("mode", DieFault.model_fields["mode"]) == ["--fail", "--restore"]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["poison", "--dpa", "0x1000", "--length", "128", "--device", "0"], Poison(dpa=0x1000, length=128)),
        (["uncorrectable", "--type", "internal", "--header", "1,2"],
         Uncorrectable(errors=(UncorrectableError(error_type="internal", header=(1, 2)),))),
        (["general-media", "--dpa", "0x2000", "--type", "data-path-error", "--log", "warning", "--flags",
          "permanent", "--descriptor", "threshold", "--transaction-type", "2", "--no-volatile",
          "--not-repairable", "--channel", "1", "--rank", "2", "--device-mask", "5", "--component-id", "d0"],
         GeneralMediaEvent(dpa=0x2000, event_type="data-path-error", log="warning", flags=4, descriptor=2,
                           transaction_type="2", volatile=False, not_repairable=True, channel=1, rank=2,
                           device_mask=5, component_id="d0")),
        (["dram", "--dpa", "0x40", "--nibble-mask", "1", "--bank-group", "2", "--bank", "3", "--row", "4",
          "--column", "5", "--correction-mask", "6,7"],
         DramEvent(dpa=0x40, nibble_mask=1, bank_group=2, bank=3, row=4, column=5, correction_mask=(6, 7))),
        (["memory-module", "--type", "temperature-change", "--health-status", "maintenance-needed",
          "--media-status", "not-ready", "--additional-status", "4", "--life-used", "5",
          "--temperature", "-3", "--dirty-shutdown-count", "1", "--corrected-volatile-errors", "2",
          "--corrected-persistent-errors", "3"],
         MemoryModuleEvent(event_type="temperature-change", health_status=1, media_status="not-ready",
                           additional_status=4, life_used=5, temperature=-3, dirty_shutdown_count=1,
                           corrected_volatile_error_count=2, corrected_persistent_error_count=3)),
        (["dc-release", "--region", "1", "--extent", "2MiB:0x200000"],
         DcRelease(region=1, extents=_extents((2, 2)))),
        (["die-fault", "--channel", "2", "--slow", "3.5"], DieFault(channel=2, factor=3.5)),
        (["die-fault", "--die", "1", "--restore"], DieFault(die=1, mode="restore")),
        (["flush-throttle", "--off"], FlushThrottle(program_interval_ns=0)),
        (["gc-storm", "--blocks", "2", "--dies", "3,1"], GcStorm(blocks=2, dies=(1, 3))),
        (["firmware-kill"], FirmwareKill()),
    ],
)
def test_the_generated_options_build_the_same_model_as_python(options: list[str], expected: object) -> None:
    args = build_parser().parse_args(["inject", "--instance", "x", *options])
    assert build_injection(args) == expected


def test_the_docs_field_reference_is_generated_from_the_models() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "inject.md"
    assert generated_section(doc, "inject fields", reference_table(COMMANDS),
                             update=bool(os.environ.get("CXLSSD_UPDATE_DOCS"))), (
        "docs/inject.md's field reference is stale: rerun with CXLSSD_UPDATE_DOCS=1")


# -- a real QEMU, paused (no guest): every kind is accepted, QEMU's refusals surface ----


def _paused(name: str, dynamic_capacity: str = "") -> Iterator[str]:
    """QEMU 10 with one 256 MiB CXL Type-3 device, never started (-S), registered as
    a running instance; the platform's own device options and two QMP sockets.
    ``dynamic_capacity``: the DC part of the device (its options after a backend)."""
    qemu = check_qemu()
    rundir = runtime_root() / name
    rundir.mkdir(mode=0o700)
    argv = [
        qemu.binary, "-M", "q35,cxl=on", "-accel", "tcg", "-S", "-m", "512M,maxmem=2G,slots=4",
        "-display", "none", "-monitor", "none", "-nodefaults",
        "-object", f"memory-backend-file,id=cxl-mem0,share=on,mem-path={rundir}/cxl0.raw,size=256M",
        "-object", f"memory-backend-file,id=cxl-dc0,share=on,mem-path={rundir}/cxl0-dc.raw,size=512M",
        "-device", "pxb-cxl,bus_nr=12,bus=pcie.0,id=cxl.0",
        "-device", "cxl-rp,port=0,bus=cxl.0,id=cxl-rp0,chassis=0,slot=2",
        "-device", "cxl-type3,bus=cxl-rp0,volatile-memdev=cxl-mem0,id=cxl-vmem0,x-pcie-err-unc-mask=off"
        + dynamic_capacity,
        "-M", "cxl-fmw.0.targets.0=cxl.0,cxl-fmw.0.size=4G",
        "-qmp", f"unix:{rundir}/qmp.sock,server=on,wait=off",
        "-qmp", f"unix:{rundir}/inject.sock,server=on,wait=off",
    ]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        ProcessId.of_self().write(rundir / "owner.pid")
        ProcessId.of_child(process).write(rundir / "qemu.pid")
        (rundir / "instance.json").write_text(json.dumps({
            "name": name, "inject_socket": str(rundir / "inject.sock"),
            "devices": [{"index": 0, "size_bytes": 256 << 20}],
        }))
        deadline = time.monotonic() + 30
        while not (rundir / "inject.sock").exists():
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "QEMU did not create its QMP sockets"
            time.sleep(0.05)
        yield name
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
        shutil.rmtree(rundir)


@pytest.fixture
def paused_qemu() -> Iterator[str]:
    yield from _paused(f"paused-{os.getpid()}")


@pytest.fixture
def paused_dcd() -> Iterator[str]:
    """The same device as a DCD: two 256 MiB DC regions (DPA 256 MiB..768 MiB)."""
    yield from _paused(f"paused-dcd-{os.getpid()}", ",volatile-dc-memdev=cxl-dc0,num-dc-regions=2")


@pytest.mark.guest
def test_every_kind_is_accepted_by_qemu_10(paused_qemu: str) -> None:
    instance = RunningInstance.find(paused_qemu)
    for injection in (
        Poison(dpa=(256 << 20) - 128, length=128),
        Uncorrectable(errors=(UncorrectableError(error_type="mem-data-ecc", header=(1, 2, 3)),
                              UncorrectableError(error_type="internal"))),
        Correctable(error_type="mem-data-ecc"),
        GeneralMediaEvent(dpa=0x2000, channel=1, rank=2, device_mask=3, component_id="c"),
        DramEvent(dpa=0x3000, nibble_mask=1, bank_group=2, bank=3, row=4, column=5,
                  correction_mask=(6, 7)),
        MemoryModuleEvent(event_type="temperature-change", temperature=90, additional_status=0x4),
    ):
        record = inject(instance, injection)
        assert record.instance == paused_qemu and record.command == injection.command


@pytest.mark.guest
def test_qemus_own_refusal_is_a_clear_error(paused_qemu: str) -> None:
    inject(paused_qemu, Poison(dpa=0x1000, length=128))
    with pytest.raises(ConfigError, match=r"QEMU refused cxl-inject-poison.*Overlap.*must not overlap"):
        inject(paused_qemu, Poison(dpa=0x1040))


@pytest.mark.guest
def test_cli_injects_into_an_instance_by_name(
    paused_qemu: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli("inject", "--instance", paused_qemu, "poison", "--dpa", "0x1000", "--length", "64") == 0
    record = json.loads(capsys.readouterr().out)
    assert record["arguments"] == {"path": "/machine/peripheral/cxl-vmem0", "start": 0x1000, "length": 64}


@pytest.mark.guest
def test_dynamic_capacity_on_a_device_without_it_is_refused_before_sending(paused_qemu: str) -> None:
    """QEMU is asked what the device is (QOM), and the request is not sent."""
    with pytest.raises(ConfigError, match=r"not a dynamic capacity device.*platform/configs/dcd.yaml"):
        inject(paused_qemu, DcAdd(extents=_extents((0, 2))))


@pytest.mark.guest
def test_dynamic_capacity_is_checked_against_the_regions_qemu_reports(paused_dcd: str) -> None:
    instance = RunningInstance.find(paused_dcd)
    assert read_dc_layout(instance, instance.devices[0]) == DcLayout(
        regions=2, region_bytes=256 * MiB, base_dpa=256 * MiB
    )
    with pytest.raises(ConfigError, match=r"DC region 2 does not exist.*2 DC region\(s\)"):
        inject(instance, DcAdd(region=2, extents=_extents((0, 2))))
    with pytest.raises(ConfigError, match=r"beyond the end of DC region 1 .*DPA 0x20000000..0x2fffffff"):
        inject(instance, DcAdd(region=1, extents=_extents((256, 2))))
    # Nothing of the refused requests reached QEMU: the same ranges are still free to add.
    record = inject(instance, DcAdd(region=1, extents=_extents((0, 2), (254, 2))))
    assert record.kind == "dc-add" and record.command == "cxl-add-dynamic-capacity"
    assert record.arguments["extents"] == [
        {"offset": 0, "len": 2 * MiB}, {"offset": 254 * MiB, "len": 2 * MiB}
    ]


@pytest.mark.guest
def test_qemu_keeps_added_extents_pending_until_the_host_accepts_them(paused_dcd: str) -> None:
    """QEMU's own view (it has no query for extents): an added extent is pending, so
    adding or releasing it again is refused with the reason; a release of a range
    never added is refused too. No host runs here, like the 6.12 guest that never
    answers an add (test_dynamic_capacity_add_and_release_in_a_dcd_guest)."""
    inject(paused_dcd, DcAdd(extents=_extents((0, 4))))
    with pytest.raises(ConfigError, match=r"still pending; the host has not accepted .*6\.12"):
        inject(paused_dcd, DcAdd(extents=_extents((2, 2))))
    with pytest.raises(ConfigError, match=r"release extent with pending DPA range; the host has not"):
        inject(paused_dcd, DcRelease(extents=_extents((0, 4))))
    with pytest.raises(ConfigError, match=r"non-existing DPA range; no accepted extent covers that range"):
        inject(paused_dcd, DcRelease(extents=_extents((8, 2))))
    inject(paused_dcd, DcAdd(extents=_extents((4, 2))))  # the next block is still free


@pytest.mark.guest
def test_cli_adds_dynamic_capacity_by_name(paused_dcd: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ("inject", "--instance", paused_dcd, "dc-add", "--region", "1", "--extent", "0:2MiB",
            "--extent", "0x400000:0x400000")
    assert run_cli(*argv) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["arguments"]["region"] == 1
    assert record["arguments"]["extents"] == [
        {"offset": 0, "len": 2 * MiB}, {"offset": 4 * MiB, "len": 4 * MiB}
    ]
    assert run_cli(*argv) == 2  # the same again: pending in QEMU


# -- real guests: each kind's effect seen from inside ------------------------------------

def _enable_cxl_tracing(platform: Platform) -> None:
    enable_cxl_tracing(platform.guest())


def _wait_for_trace(platform: Platform, pattern: str, timeout_s: float = 90) -> str:
    """The first line of the guest's trace buffer matching ``pattern``."""
    (line,) = wait_for_trace(platform.guest(), [pattern], timeout_s)
    if line is None:
        trace = "\n".join(trace_lines(platform.guest()))
        raise AssertionError(f"no trace line matches {pattern!r}; trace:\n{trace[-3000:]}")
    return line


@pytest.mark.guest
def test_poison_shows_in_the_poison_list_with_dpa_and_hpa(default_platform: Platform) -> None:
    device = default_platform.devices[0]
    _enable_cxl_tracing(default_platform)
    dpa, length = 0x10000, 128
    record = inject(default_platform, Poison(dpa=dpa, length=length))
    assert record.hpa == device.hpa_base + dpa
    default_platform.guest().run(
        ["sh", "-c", f"echo 1 > /sys/bus/cxl/devices/{device.memdev}/trigger_poison_list"], check=True
    )
    line = _wait_for_trace(default_platform, rf"cxl_poison: .*dpa={dpa:#x} dpa_length={length:#x}")
    fields = trace_fields(line)
    assert fields["memdev"] == device.memdev and fields["region"] == device.region
    assert int(fields["hpa"], 16) == device.hpa_base + dpa
    assert fields["trace_type"] == "List"


@pytest.mark.guest
def test_general_media_event_arrives_as_a_trace_event(default_platform: Platform) -> None:
    device = default_platform.devices[0]
    _enable_cxl_tracing(default_platform)
    dpa = 0x21000
    inject(default_platform, GeneralMediaEvent(dpa=dpa, event_type="invalid-address",
                                               transaction_type="host-write", channel=3, rank=1))
    line = _wait_for_trace(default_platform, rf"cxl_general_media: .* dpa={dpa:x} ")
    fields = trace_fields(line)
    assert fields["log"] == "Failure" and fields["type"] == "'Invalid Address'"
    assert fields["transaction_type"] == "'Host Write'" and fields["descriptor"] == "'UNCORRECTABLE_EVENT'"
    assert fields["dpa_flags"] == "'VOLATILE'" and fields["channel"] == "3" and fields["rank"] == "1"
    assert int(fields["hpa"], 16) == device.hpa_base + dpa and fields["region"] == device.region


@pytest.mark.guest
def test_dram_event_arrives_as_a_trace_event(default_platform: Platform) -> None:
    device = default_platform.devices[0]
    _enable_cxl_tracing(default_platform)
    dpa = 0x22000
    inject(default_platform, DramEvent(dpa=dpa, log="warning", event_type="scrub-media-ecc-error",
                                       descriptor=2, bank=2, row=77, column=9))
    line = _wait_for_trace(default_platform, rf"cxl_dram: .* dpa={dpa:x} ")
    fields = trace_fields(line)
    assert fields["log"] == "Warning" and fields["type"] == "'Scrub Media ECC Error'"
    assert fields["descriptor"] == "'THRESHOLD_EVENT'"
    assert (fields["bank"], fields["row"], fields["column"]) == ("2", "77", "9")
    assert int(fields["hpa"], 16) == device.hpa_base + dpa


@pytest.mark.guest
def test_memory_module_event_arrives_as_a_trace_event(default_platform: Platform) -> None:
    _enable_cxl_tracing(default_platform)
    inject(default_platform, MemoryModuleEvent(
        event_type="temperature-change", health_status=1, additional_status=0x4,
        life_used=33, temperature=87, dirty_shutdown_count=2, corrected_volatile_error_count=5,
    ))
    line = _wait_for_trace(default_platform, r"cxl_memory_module: .* device_temp=87 ")
    fields = trace_fields(line)
    assert fields["event_type"] == "'Temperature Change'"
    assert fields["health_status"] == "'MAINTENANCE_NEEDED'" and fields["as_dev_temp"] == "Warning"
    assert (fields["life_used"], fields["dirty_shutdown_cnt"], fields["cor_vol_err_cnt"]) == ("33", "2", "5")


@pytest.mark.guest
def test_correctable_error_is_seen_once_unmasked(default_platform: Platform) -> None:
    """PCIe masks Corrected Internal Errors by default and Linux keeps them masked
    for endpoints: QEMU then records the error but the guest hears nothing.
    Unmasked, it arrives through AER as a cxl_aer_correctable_error trace event."""
    guest = default_platform.guest()
    memdev = default_platform.devices[0].memdev
    _enable_cxl_tracing(default_platform)
    pci = unmask_corrected_internal_errors(guest, memdev)
    assert re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d", pci)
    inject(default_platform, Correctable(error_type="cache-data-ecc"))
    line = _wait_for_trace(default_platform, r"cxl_aer_correctable_error: .*'Cache Data ECC Error'")
    assert f"memdev={memdev}" in line
    _, dmesg, _ = guest.run(["dmesg"], check=True)
    assert "CorrIntErr" in dmesg.decode()


@pytest.mark.guest
def test_cli_injects_into_the_running_shared_guest_by_name(
    default_platform: Platform, cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    _enable_cxl_tracing(default_platform)
    dpa = 0x23000
    done = cli("inject", "--instance", default_platform.name, "general-media", "--dpa", hex(dpa),
               "--type", "data-path-error", "--log", "warning", timeout=120)
    assert done.returncode == 0, done.stderr
    record: dict[str, Any] = json.loads(done.stdout)
    assert record["hpa"] == default_platform.devices[0].hpa_base + dpa
    line = _wait_for_trace(default_platform, rf"cxl_general_media: .* dpa={dpa:x} ")
    assert "log=Warning" in line and "type='Data Path Error'" in line
    # A malformed injection is refused and leaves the guest unharmed.
    bad = cli("inject", "--instance", default_platform.name, "poison", "--dpa", "0x40000000", timeout=120)
    assert bad.returncode == 2 and "outside device 0" in bad.stderr
    assert default_platform.guest().run(["true"])[0] == 0


# The DSMAS entries (CDAT 1.03 Table 3) of a memdev's endpoint, as the guest kernel
# exposes its CDAT: one "flags DPA-base DPA-length" line each.
_DSMAS_SCRIPT = r"""
import glob, os, struct, sys
[endpoint] = [e for e in glob.glob("/sys/bus/cxl/devices/endpoint*")
              if os.path.basename(os.path.realpath(e + "/uport")) == sys.argv[1]]
data = open(endpoint + "/CDAT", "rb").read()
offset, end = 16, struct.unpack_from("<I", data)[0]  # after the CDAT header
while offset < end:
    kind, _, length = struct.unpack_from("<BBH", data, offset)
    if kind == 0:  # DSMAS: handle, flags, reserved, DPA base, DPA length
        _, flags, _, base, size = struct.unpack_from("<BBHQQ", data, offset + 4)
        print(flags, base, size)
    offset += length
"""
DSMAS_DYNAMIC_CAPACITY = 1 << 5  # the DSMAS flag of a DC region (CDAT 1.04)
# QEMU signals event log L on MSI-X vector 2 + L; the Dynamic Capacity log is L = 4.
DC_LOG_VECTOR = 6


def _device_interrupts(guest: Any, memdev: str) -> dict[int, int]:
    """Interrupts taken so far per MSI-X vector of ``memdev``'s PCI function."""
    _, out, _ = guest.run(
        ["sh", "-c", f"grep PCI-MSIX-$(basename $(dirname $(readlink -f /sys/bus/cxl/devices/{memdev})))"
         " /proc/interrupts"], check=True,
    )
    lines = [line.split() for line in out.decode().splitlines()]
    return {int(fields[3].split("-")[0]): int(fields[1]) for fields in lines}


def _cxl_log_lines(guest: Any) -> list[str]:
    _, out, _ = guest.run(["dmesg"], check=True)
    return [line for line in out.decode(errors="replace").splitlines() if re.search(r"cxl|mem0|0d:00", line)]


@pytest.mark.slow
@pytest.mark.guest
def test_dynamic_capacity_add_and_release_in_a_dcd_guest() -> None:
    """A DCD guest of its own (platform/configs/dcd.yaml). The guest sees the DC region
    only in the device's CDAT; its kernel (6.12) has no DCD support. dc-add reaches the
    device (QEMU accepts it and holds the extents pending) but the guest shows nothing:
    its driver requested no interrupt for the DC event log, so none arrives, no trace
    event, no log line, the memdev's capacity is unchanged. dc-release of the extents is
    then refused by QEMU (still pending). A general-media event injected afterwards is
    traced, and alone: the guest was listening the whole time."""
    config = load_config(CONFIG_DIR / "dcd.yaml")
    dynamic = config.cxl_devices[0].dynamic_capacity
    assert dynamic is not None
    with Platform(config) as platform:
        guest = platform.guest()
        device = platform.devices[0]
        # QEMU made the device the config asked for (its QOM view).
        layout = read_dc_layout(platform, DeviceView(index=0, size_bytes=device.size_bytes))
        assert layout == DcLayout.of_config(config.cxl_devices[0]) == DcLayout(1, 256 * MiB, GiB)
        _, out, _ = guest.run(["python3", "-c", _DSMAS_SCRIPT, device.memdev], check=True)
        dsmas = [tuple(int(x) for x in line.split()) for line in out.decode().splitlines()]
        assert dsmas == [(0, 0, device.size_bytes),
                         (DSMAS_DYNAMIC_CAPACITY, device.size_bytes, dynamic.region_bytes)]
        ram = f"/sys/bus/cxl/devices/{device.memdev}/ram/size"
        assert int(guest.run(["cat", ram], check=True)[1], 0) == device.size_bytes
        _enable_cxl_tracing(platform)
        interrupts, log_lines = _device_interrupts(guest, device.memdev), _cxl_log_lines(guest)
        assert DC_LOG_VECTOR not in interrupts and len(interrupts) == 5  # four event logs, mailbox

        assert inject(platform, DcAdd(extents=_extents((0, 2), (4, 4)))).kind == "dc-add"
        pending = "release extent with pending DPA range; the host has not accepted"
        with pytest.raises(ConfigError, match=pending):
            inject(platform, DcRelease(extents=_extents((4, 4))))

        dpa = 0x24000
        inject(platform, GeneralMediaEvent(dpa=dpa))
        _wait_for_trace(platform, rf"cxl_general_media: .* dpa={dpa:x} ")
        events = trace_lines(guest)
        assert len(events) == 1 and "cxl_general_media" in events[0], events
        after = _device_interrupts(guest, device.memdev)
        assert {v: after[v] - interrupts[v] for v in after} == {2: 0, 3: 0, 4: 1, 5: 0, 7: 0}
        assert _cxl_log_lines(guest) == log_lines
        assert int(guest.run(["cat", ram], check=True)[1], 0) == device.size_bytes


@pytest.mark.slow
@pytest.mark.guest
def test_uncorrectable_error_is_logged_by_aer_and_takes_the_region_down() -> None:
    """Last in the module, on a guest of its own: the fatal AER error resets the link,
    and the guest then loses the device's decoders and region (its memory stays
    onlined but is no longer backed), so no other test may use this guest."""
    with Platform(load_config()) as platform:
        guest = platform.guest()
        _enable_cxl_tracing(platform)
        memdev = platform.devices[0].memdev
        inject(platform, Uncorrectable(errors=(
            UncorrectableError(error_type="mem-data-ecc", header=(1, 2, 3, 4)),
        )))
        line = _wait_for_trace(platform, r"cxl_aer_uncorrectable_error: ")
        assert f"memdev={memdev}" in line and "first_error: 'Memory Data ECC Error'" in line
        # The kernel logs the AER recovery after the trace event: wait for all of it.
        expected = ("Uncorrectable (Fatal) error message received",
                    "frozen state error detected, disable CXL.mem", "link has been reset")
        deadline = time.monotonic() + 60
        while True:
            text = guest.run(["dmesg"], check=True)[1].decode()
            if all(message in text for message in expected) or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert [m for m in expected if m not in text] == [], text[-3000:]
        status, out, _ = guest.run(["cat", f"/sys/bus/cxl/devices/{platform.devices[0].region}/commit"])
        assert status != 0 or out.strip() == b"0"  # the region is no longer committed
        assert guest.run(["true"])[0] == 0  # SSH still works; the platform shuts down cleanly
