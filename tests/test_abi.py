"""The protocol's two descriptions agree: abi/cxlssd_abi.h, compiled with gcc, and
abi/protocol.py. Every field of every record (offset and size, by name), every
record's size and every constant the header defines is checked; a constant in the
header that the Python side does not have fails too. No VM."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cxlssd.abi import protocol, pv
from cxlssd.abi.counters import PluginCounters
from cxlssd.abi.ring import RequestRing
from cxlssd.cbuild import compiler_name
from cxlssd.errors import InputError

#: C struct -> the Python dtype of the same record
STRUCTS = {
    "cxlssd_request": protocol.REQUEST_DTYPE,
    "cxlssd_ring_header": protocol.RING_HEADER_DTYPE,
    "cxlssd_counters_header": protocol.COUNTERS_HEADER_DTYPE,
    "cxlssd_window_slot": protocol.WINDOW_SLOT_DTYPE,
    "cxlssd_vcpu_slot": protocol.VCPU_SLOT_DTYPE,
    "cxlssd_roi_event": protocol.ROI_EVENT_DTYPE,
    "cxlssd_pv_header": protocol.PV_HEADER_DTYPE,
    "cxlssd_pv_slot": protocol.PV_SLOT_DTYPE,
    "cxlssd_pv_mailbox": protocol.PV_MAILBOX_DTYPE,
}
# An object-like macro with a value (not the include guard, not a function-like macro).
_DEFINE = re.compile(r"^#define (CXLSSD_\w+)[ \t]+\S", re.MULTILINE)
_INTERNAL = ("CXLSSD_ABI_ASSERT_",)
DISP_CMD, DISP_ID = 13, 0x1234


def python_value(name: str) -> int:
    """The Python side's value of C constant ``CXLSSD_<name>``."""
    short = name.removeprefix("CXLSSD_")
    if short == "CMD_LAST":
        return int(max(protocol.MarkerCmd))
    if short.startswith("CMD_"):
        return int(protocol.MarkerCmd[short.removeprefix("CMD_")])
    if short.startswith("OP_"):
        return int(protocol.Op[short.removeprefix("OP_")])
    if short.startswith("SCHEDULER_"):
        return protocol.TASK_SCHEDULERS.index(short.removeprefix("SCHEDULER_").lower().replace("_", "-"))
    if not hasattr(protocol, short):
        raise KeyError(f"{name} has no Python counterpart protocol.{short}")
    return int(getattr(protocol, short))


def c_program(header: Path) -> str:
    """A program that prints every constant, record size and field offset/size of ``header``."""
    lines = [f'#include "{header.name}"', "#include <stdio.h>", "int main(void)", "{"]
    for name in sorted(set(_DEFINE.findall(header.read_text())) - set(_INTERNAL)):
        lines.append(f'    printf("const {name} %llu\\n", (unsigned long long)({name}));')
    lines.append(
        f'    printf("const DISP %llu\\n", (unsigned long long)CXLSSD_MARKER_DISP({DISP_CMD}u, {DISP_ID}u));'
    )
    for struct, dtype in STRUCTS.items():
        lines.append(f'    printf("sizeof {struct} %zu\\n", sizeof(struct {struct}));')
        for field in dtype.names:
            member = f"((struct {struct} *)0)->{field}"
            lines.append(
                f'    printf("field {struct}.{field} %zu %zu\\n", offsetof(struct {struct}, {field}), '
                f"sizeof({member}));"
            )
    lines += ["    return 0;", "}", ""]
    return "\n".join(lines)


def compile_and_run(header: Path, tmp_path: Path) -> str:
    """Compile the printing program against ``header`` (warnings are errors) and run it."""
    source, binary = tmp_path / "abi_check.c", tmp_path / "abi_check"
    source.write_text(c_program(header))
    flags = ["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-I", str(header.parent)]
    subprocess.run([compiler_name(), *flags, "-o", str(binary), str(source)], check=True, timeout=120)
    return subprocess.run([str(binary)], check=True, capture_output=True, text=True, timeout=30).stdout


def mismatches(output: str) -> list[str]:
    """Every way the C program's ``output`` disagrees with the Python side."""
    problems = []
    seen_fields: dict[str, set[str]] = {struct: set() for struct in STRUCTS}
    for line in output.splitlines():
        kind, name, *values = line.split()
        numbers = [int(v) for v in values]
        if kind == "const" and name == "DISP":
            expected = [protocol.MARKER_MAGIC | DISP_CMD << 16 | DISP_ID]
        elif kind == "const":
            try:
                expected = [python_value(name)]
            except KeyError as missing:
                problems.append(str(missing))
                continue
        elif kind == "sizeof":
            expected = [STRUCTS[name].itemsize]
        else:
            struct, field = name.split(".")
            seen_fields[struct].add(field)
            kind_, offset = STRUCTS[struct].fields[field][:2]
            expected = [offset, kind_.itemsize]
        if numbers != expected:
            problems.append(f"{kind} {name}: C {numbers}, Python {expected}")
    for struct, dtype in STRUCTS.items():
        if seen_fields[struct] != set(dtype.names):
            problems.append(f"{struct}: fields {sorted(set(dtype.names) - seen_fields[struct])} not checked")
    return problems


def test_the_header_and_the_python_side_agree(tmp_path: Path) -> None:
    output = compile_and_run(protocol.C_HEADER, tmp_path)
    assert mismatches(output) == []
    # Everything was looked at: every record, every field, and the header's constants.
    assert output.count("sizeof ") == len(STRUCTS)
    assert output.count("field ") == sum(len(dtype.names) for dtype in STRUCTS.values())
    assert output.count("const CXLSSD_CMD_") == len(protocol.MarkerCmd) + 1  # and CMD_LAST


@pytest.mark.parametrize(
    ("change", "found"),
    [
        # two fields of the same size swapped: sizes and static asserts still hold
        (("uint64_t clock_ns, seq;", "uint64_t seq, clock_ns;"), "cxlssd_pv_slot.clock_ns"),
        (("#define CXLSSD_CMD_HINT 13u", "#define CXLSSD_CMD_HINT 14u"), "CXLSSD_CMD_HINT"),
        (("#define CXLSSD_PV_VERSION 4u", "#define CXLSSD_PV_VERSION 5u"), "CXLSSD_PV_VERSION"),
        (
            ("#define CXLSSD_FLAG_HOST 8u", "#define CXLSSD_FLAG_HOST 8u\n#define CXLSSD_FLAG_NEW 16u"),
            "FLAG_NEW",
        ),
        (
            ("uint32_t store_miss_write, llc_cold_at_roi;", "uint32_t llc_cold_at_roi, store_miss_write;"),
            "store_miss_write",
        ),
    ],
)
def test_a_disagreement_is_found(tmp_path: Path, change: tuple[str, str], found: str) -> None:
    text = protocol.C_HEADER.read_text()
    assert change[0] in text
    header = tmp_path / protocol.C_HEADER.name
    header.write_text(text.replace(change[0], change[1]))
    problems = mismatches(compile_and_run(header, tmp_path))
    assert any(found in problem for problem in problems), problems


def test_the_readers_word_indices_follow_the_dtypes() -> None:
    assert protocol.word(protocol.RING_HEADER_DTYPE, "head") == 8
    assert protocol.word(protocol.RING_HEADER_DTYPE, "consumer_state") == 34
    assert protocol.word(protocol.PV_SLOT_DTYPE, "query_ticket") == 4
    assert protocol.VCPU_FIELDS[5:7] == ("llc_hits_dram", "llc_hits_cxl")
    assert len(protocol.VCPU_FIELDS) == protocol.VCPU_COUNTERS + 1
    with pytest.raises(ValueError, match="not aligned"):
        protocol.word(np.dtype([("a", "<u4"), ("b", "<u8")]), "b")


# -- the readers' shared lifecycle (abi/shared_file.MappedFile) ------------------------------


def _ready_pv_page(path: Path) -> np.memmap:
    pv.create_page(path)
    words = np.memmap(path, dtype=np.uint64, mode="r+")
    words[0] = protocol.PV_MAGIC  # as the plugin writes its header
    return words


def test_a_closed_file_says_so_and_closing_tolerates_a_view_still_held(tmp_path: Path) -> None:
    path = tmp_path / "pv"
    words = _ready_pv_page(path)
    page = pv.PvPage(path)
    with pytest.raises(InputError, match=f"cxlssd pv page {path} is not open"):
        page.consumed()
    features = words[:8].view(np.uint32)[6:7]  # the header's u32 features
    page.open()
    page.set_features(protocol.FEATURE_PROMOTION)
    assert features[0] == protocol.FEATURE_PROMOTION
    held = page._words()  # a view a caller (or a traceback's frame) still holds
    page.close()  # no BufferError: the mapping goes with the last view
    page.close()
    assert features[0] == 0 and held[0] == protocol.PV_MAGIC  # closing told the guest
    with pytest.raises(InputError, match="is not open"):
        page.consumed()


def test_a_file_that_never_becomes_ready_names_the_plugin_argument(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    path.write_bytes(bytes(protocol.RING_HEADER_BYTES))  # no magic: not initialised
    with pytest.raises(InputError, match=r"is not a ready cxlssd request ring .*libcxlssd.so,ring=PATH"):
        RequestRing(path).open(timeout_s=0.1)


def test_a_file_of_another_layout_is_refused_and_left_unmapped(tmp_path: Path) -> None:
    path = tmp_path / "counters"
    header = np.zeros(protocol.COUNTERS_HEADER_BYTES // 8, np.uint64)
    header[0] = protocol.COUNTERS_MAGIC  # the magic, but layout version 0
    path.write_bytes(header.tobytes())
    counters = PluginCounters(path)
    with pytest.raises(InputError, match="not a usable plugin counters file: layout version 0"):
        counters.open(timeout_s=1)
    assert counters._map is None
    with pytest.raises(InputError, match="is not open"):
        counters.snapshot()
