"""The workload suite (guest/workloads/, docs/workloads.md): built with the runtime, run on
the host (where the ROI markers are plain NOPs) at their small defaults and a second
parameter set, their reports, self-checks, determinism, usage errors, and the marker bytes
in each binary; and tpcc (SQLite, a library of the guest's own) in the session's guest, on
the CXL node and under live designs."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cxlssd.firmware.request import MarkerCmd
from cxlssd.guest.runtime import build
from cxlssd.guest.runtime.build import ensure_runtime
from cxlssd.guest.runtime.install import with_guest_env
from cxlssd.platform.machine import Platform

WORKLOADS = build.WORKLOADS
RUN_TIMEOUT_S = 60
COMMON_FIELDS = {"workload", "params", "footprint_bytes", "check_bytes", "check_ok", "checksum"}
# What each workload reports besides the common fields.
RESULT_FIELDS = {
    "graph": {"edges", "reached"},
    "radix": {"passes", "sorted", "min_key", "max_key"},
    "srad": {"mean", "q0sqr_last", "pixels_compared", "finite"},
    "kvstore": {"reads", "updates", "failures"},
    "dlrm": {"lookups", "bytes_gathered"},
    "randread": {"writes", "mismatches", "switches"},
    "tpcc": {"new_order", "payment", "order_status", "delivery", "stock_level", "rollbacks", "violations"},
}
# Small runs of every workload (and kernel), for the tests of checksums and checks.
SMALL = [
    ("graph", ["--vertices", "4096"]),
    ("graph", ["--vertices", "4096", "--kernel", "bc", "--sources", "2"]),
    ("radix", ["--keys", "10000"]),
    ("srad", ["--width", "64", "--height", "48", "--iterations", "3"]),
    ("kvstore", ["--records", "2000", "--ops", "5000"]),
    ("dlrm", ["--rows", "500", "--batches", "3"]),
    ("tpcc", ["--customers", "30", "--items", "1000", "--transactions", "200"]),
    ("tpcc", ["--warehouses", "3", "--customers", "30", "--items", "1000", "--transactions", "200",
              "--threads", "3"]),
]


def marker(cmd: int, roi_id: int) -> bytes:
    """The 8 bytes of a marker: nopl disp32(%rax,%rax,1) with the command and id in disp32."""
    return b"\x0f\x1f\x84\x00" + struct.pack("<I", 0xC5000000 | cmd << 16 | roi_id)


@pytest.fixture(scope="module")
def runtime() -> Path:
    return ensure_runtime()


def run(
    runtime: Path, name: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(runtime / "bin" / name), *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
    )


def report(runtime: Path, name: str, *args: str) -> dict[str, Any]:
    """The JSON report of a successful run, with the fields every workload has checked."""
    result = run(runtime, name, *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1 and result.stdout.endswith("\n")
    data: dict[str, Any] = json.loads(result.stdout)
    assert COMMON_FIELDS | RESULT_FIELDS[name] <= data.keys(), data
    assert data["workload"] == name and data["check_ok"] is True
    assert isinstance(data["checksum"], int) and 0 <= data["checksum"] < 2**64
    assert isinstance(data["footprint_bytes"], int) and data["footprint_bytes"] > 0
    assert isinstance(data["check_bytes"], int) and data["check_bytes"] >= 0
    assert isinstance(data["params"], dict)
    return data


# -- the build -----------------------------------------------------------------------------


def test_every_workload_is_built_and_installed_with_the_runtime(runtime: Path) -> None:
    steps = {step.output: step for step in build.STEPS}
    for name in WORKLOADS:
        step = steps[f"bin/{name}"]
        assert step.sources == (f"../workloads/{name}.c", build.LIBRARY_SOURCE)
        assert step.libraries == ("m", *build.WORKLOAD_LIBRARIES.get(name, ()))
        assert os.access(runtime / "bin" / name, os.X_OK)


def test_tpcc_links_sqlite_by_its_soname(runtime: Path) -> None:
    """The guest's libsqlite3-0 (Debian trixie's) is newer than the host's: the binary names
    the soname, which both provide."""
    dynamic = subprocess.run(["readelf", "--dynamic", str(runtime / "bin" / "tpcc")],
                             capture_output=True, text=True, check=True).stdout
    assert "Shared library: [libsqlite3.so.0]" in dynamic


@pytest.mark.parametrize("name", WORKLOADS)
def test_binary_contains_the_roi_markers(runtime: Path, name: str) -> None:
    code = (runtime / "bin" / name).read_bytes()
    # --roi ID goes through the compiled-in runtime functions: one marker per id, 1 the default.
    for roi_id in (1, 0, 255):
        assert code.count(marker(MarkerCmd.ROI_BEGIN, roi_id)) == 1
        assert code.count(marker(MarkerCmd.ROI_END, roi_id)) == 1


# -- runs ----------------------------------------------------------------------------------


def test_graph_bfs_default(runtime: Path) -> None:
    data = report(runtime, "graph")
    assert data["params"] == {"kernel": "bfs", "vertices": 65536, "degree": 16, "warm_passes": 0,
                              "threads": 1, "seed": 1, "roi": 1}
    # Chung-Lu with mean degree 16: nearly every vertex is in the hub's component, a few levels deep.
    assert 0.95 * 65536 < data["reached"] <= 65536 and 3 <= data["levels"] <= 10
    assert 0.99 * 65536 * 8 < data["edges"] <= 65536 * 8
    assert data["edges_scanned"] <= 2 * data["edges"]
    # offsets, adjacency, level, queue
    assert data["footprint_bytes"] == 8 * 65537 + 4 * 2 * data["edges"] + 8 * 65536


@pytest.mark.parametrize("threads", ["1", "3"])
def test_graph_bfs_after_warm_passes_gives_the_same_levels(runtime: Path, threads: str) -> None:
    """Unmeasured passes before the ROI (as SkyByte's artifact warms up before it measures)
    leave the measured pass the same work: the levels are reset after each."""
    args = ("--footprint", "1M", "--threads", threads)
    cold = report(runtime, "graph", *args)
    warm = report(runtime, "graph", *args, "--warm-passes", "2")
    assert warm["params"]["warm_passes"] == 2
    for key in ("reached", "levels", "edges_scanned", "checksum"):
        assert warm[key] == cold[key], key


@pytest.mark.parametrize("threads", ["1", "3"])
def test_radix_after_warm_passes_sorts_the_same_keys(runtime: Path, threads: str) -> None:
    """A warm pass sorts the keys, which are written again before the next sort: the ROI
    sorts the same input to the same result."""
    args = ("--keys", "10000", "--threads", threads)
    cold = report(runtime, "radix", *args)
    warm = report(runtime, "radix", *args, "--warm-passes", "2")
    assert warm["params"]["warm_passes"] == 2
    for key in ("min_key", "max_key", "checksum"):
        assert warm[key] == cold[key], key


@pytest.mark.parametrize("threads", ["1", "3"])
def test_srad_after_warm_passes_diffuses_the_same_image(runtime: Path, threads: str) -> None:
    """A warm pass runs the iterations, and the image is written again from the input
    before the next: the ROI computes the cold run's pixels bit for bit."""
    args = ("--width", "64", "--height", "48", "--iterations", "3", "--threads", threads)
    cold = report(runtime, "srad", *args)
    warm = report(runtime, "srad", *args, "--warm-passes", "2")
    assert warm["params"]["warm_passes"] == 2 and cold["params"]["warm_passes"] == 0
    for key in ("mean", "q0sqr_last", "pixels_compared", "checksum"):
        assert warm[key] == cold[key], key


@pytest.mark.parametrize("threads", ["1", "3"])
def test_dlrm_after_warm_passes_pools_the_same_rows(runtime: Path, threads: str) -> None:
    """The lookups only read the tables: a warm pass before the ROI leaves its output as a
    cold run's."""
    args = ("--rows", "500", "--batches", "3", "--threads", threads)
    cold = report(runtime, "dlrm", *args)
    warm = report(runtime, "dlrm", *args, "--warm-passes", "2")
    assert warm["params"]["warm_passes"] == 2 and cold["params"]["warm_passes"] == 0
    for key in ("lookups", "bytes_gathered", "checksum"):
        assert warm[key] == cold[key], key

def test_kvstore_after_warm_passes_replays_the_same_operations(runtime: Path) -> None:
    """A warm pass runs the ROI's operations once more before it: reads alone leave the
    versions as they were (the ROI's reads return what a cold run's do); with updates the
    ROI reads the versions the warm pass left, which the self-check's replay of both passes
    confirms (report() asserts it), also with threads."""
    args = ("--records", "2000", "--ops", "20000")
    reads_only = [report(runtime, "kvstore", *args, "--mix", "c", *warm)
                  for warm in ((), ("--warm-passes", "1"))]
    assert reads_only[1]["params"]["warm_passes"] == 1 and reads_only[1]["reads"] == 20000
    assert reads_only[0]["checksum"] == reads_only[1]["checksum"]
    for threads in ("1", "3"):
        cold = report(runtime, "kvstore", *args, "--threads", threads)
        warm = report(runtime, "kvstore", *args, "--threads", threads, "--warm-passes", "2")
        assert warm["reads"] + warm["updates"] == 20000 and warm["failures"] == 0
        assert warm["checksum"] != cold["checksum"]  # later versions


def test_graph_bc_from_a_footprint(runtime: Path) -> None:
    data = report(runtime, "graph", "--kernel", "bc", "--footprint", "1M", "--degree", "8", "--sources", "3")
    params = data["params"]
    assert params["kernel"] == "bc" and params["sources"] == 3 and params["footprint"] == 2**20
    # 8 + 4 * 8 (CSR) + 32 (dist, sigma, delta, score, queue) bytes a vertex
    assert params["vertices"] == (2**20 - 8 - 12) // 72
    assert 0.98 * 2**20 < data["footprint_bytes"] <= 2**20
    assert data["reached"] <= 3 * params["vertices"] and data["score_sum"] > 0


def test_radix(runtime: Path) -> None:
    data = report(runtime, "radix")
    assert data["params"]["keys"] == 2**20 and data["footprint_bytes"] == 16 * 2**20
    assert data["sorted"] is True and data["passes"] == 8 and data["min_key"] <= data["max_key"]
    data = report(runtime, "radix", "--footprint", "1M", "--seed", "9", "--roi", "7")
    assert data["params"] == {"keys": 65536, "threads": 1, "digit_bits": 8, "warm_passes": 0,
                              "footprint": 2**20, "seed": 9, "roi": 7}
    single = report(runtime, "radix", "--keys", "1")
    assert single["min_key"] == single["max_key"] and single["sorted"] is True


@pytest.mark.parametrize("threads", ["1", "3"])
def test_radix_digit_bits_set_the_passes_not_the_result(runtime: Path, threads: str) -> None:
    """--digit-bits B: 64 / B passes of 2^B write streams each, the same sorted keys."""
    args = ("--keys", "10007", "--threads", threads)
    eight = report(runtime, "radix", *args)
    for bits in (1, 2, 4):
        data = report(runtime, "radix", *args, "--digit-bits", str(bits))
        assert data["params"]["digit_bits"] == bits and data["passes"] == 64 // bits
        assert data["checksum"] == eight["checksum"] and data["min_key"] == eight["min_key"]


def test_srad(runtime: Path) -> None:
    data = report(runtime, "srad")
    assert data["params"] == {
        "width": 512,
        "height": 512,
        "iterations": 10,
        "lambda": 0.5,
        "threads": 1,
        "warm_passes": 0,
        "seed": 1,
        "roi": 1,
    }
    assert data["footprint_bytes"] == 24 * 512 * 512 + 4 * 10
    # Diffusion keeps the mean of exp(u), u uniform in [0, 1): e - 1, and smooths the image.
    assert abs(data["mean"] - 1.718) < 0.01 and data["finite"] is True
    # The windows: the 128x128 statistic region and the 16x16 corner.
    assert data["pixels_compared"] == 128 * 128 + 16 * 16

    data = report(
        runtime, "srad", "--width", "300", "--height", "77", "--iterations", "20", "--lambda", "0.25"
    )
    assert data["params"]["width"] == 300 and data["params"]["height"] == 77
    # The top-left window holds the whole height: rows 0..76, columns 0..127 compared.
    assert data["pixels_compared"] == 77 * 128 + 16 * 16
    assert report(runtime, "srad", "--footprint", "1M")["params"]["width"] == 209  # sqrt(1 MiB / 24)


def test_kvstore(runtime: Path) -> None:
    data = report(runtime, "kvstore")
    assert (
        data["params"]["mix"] == "a"
        and data["params"]["records"] == 100000
        and data["params"]["ops"] == 200000
    )
    assert data["reads"] + data["updates"] == 200000 and abs(data["reads"] - 100000) < 2000
    assert data["failures"] == 0 and data["footprint_bytes"] == 160 * 100000
    assert data["check_bytes"] == 4 * 100000  # the replay's shadow versions

    data = report(runtime, "kvstore", "--mix", "b", "--footprint", "4M", "--ops", "50K", "--theta", "0.5")
    assert data["params"]["records"] == 4 * 2**20 // 160 and data["params"]["theta"] == 0.5
    assert data["reads"] + data["updates"] == 50 * 1024 and abs(data["updates"] - 0.05 * 50 * 1024) < 300
    assert report(runtime, "kvstore", "--mix", "c", "--records", "2000")["updates"] == 0


def test_dlrm(runtime: Path) -> None:
    data = report(runtime, "dlrm")
    params = data["params"]
    assert (params["tables"], params["rows"], params["dim"], params["dist"]) == (8, 16384, 64, "zipf")
    assert data["lookups"] == 16 * 8 * 128 * 32 and data["bytes_gathered"] == data["lookups"] * 64 * 4

    # 21 floats a row: a cache line of columns pooled as vectors, 5 one at a time
    args = ["--dist", "uniform", "--tables", "3", "--dim", "21", "--batches", "5", "--batch-size", "7"]
    data = report(runtime, "dlrm", *args, "--pooling", "3", "--footprint", "64K")
    assert data["params"]["dist"] == "uniform" and "theta" not in data["params"]
    assert 0.99 * 65536 < data["footprint_bytes"] <= 65536 and data["lookups"] == 5 * 3 * 7 * 3


@pytest.mark.parametrize(("name", "args"), [
    ("dlrm", ["--tables", "3", "--rows", "2000", "--batches", "5", "--batch-size", "7"]),
    ("srad", ["--width", "64", "--height", "6", "--iterations", "3"]),
    ("radix", ["--keys", "10000"]),
    ("radix", ["--keys", "5"]),
    ("graph", ["--vertices", "4096"]),
    ("randread", ["--footprint", "1M", "--reads", "20000", "--write-share", "0.3"]),
])
def test_threads_compute_what_one_thread_does(runtime: Path, name: str, args: list[str]) -> None:
    """--threads N (POSIX threads): the same result as one thread (dlrm, srad, radix, graph's
    bfs; also with more threads than a batch has samples, the image rows or the keys) or as N
    tasks of the guest runtime (randread: each thread's reads are a task's stream), self-check
    passed (report() asserts it)."""
    for threads in ("3", "8"):
        data = report(runtime, name, *args, "--threads", threads)
        same = report(runtime, name, *args, *(("--tasks", threads) if name == "randread" else ()))
        assert data["params"]["threads"] == int(threads) and data["checksum"] == same["checksum"]


def test_graph_bc_threads_share_each_level(runtime: Path) -> None:
    """bc with --threads: the threads share each source's levels (one state, as one
    thread's) and push exact path counts: the same bits as one thread, with 3 or 8 threads
    and in every run, the same footprint (self-check passed: report() asserts it)."""
    args = ["--kernel", "bc", "--vertices", "4096", "--sources", "3"]
    one = report(runtime, "graph", *args)
    runs = [report(runtime, "graph", *args, "--threads", threads) for threads in ("3", "3", "8")]
    assert runs[0]["params"]["threads"] == 3 and {run["checksum"] for run in runs} == {one["checksum"]}
    assert runs[0]["reached"] == one["reached"] and runs[0]["footprint_bytes"] == one["footprint_bytes"]
    assert runs[0]["score_sum"] == one["score_sum"] and runs[0]["score_max"] == one["score_max"]


def test_kvstore_threads_share_the_operations_and_end_at_the_same_versions(runtime: Path) -> None:
    """Each thread its own operation sequence, records under striped mutexes: on the host's
    cores the threads really race, yet every read finds an intact value and every record
    ends at the version all the updates give it (the checksum), run after run."""
    args = ["--records", "2000", "--ops", "30000", "--mix", "a"]
    runs = [report(runtime, "kvstore", *args, "--threads", "3") for _ in range(2)]
    assert runs[0]["params"]["threads"] == 3 and runs[0]["reads"] + runs[0]["updates"] == 30000
    assert runs[0]["checksum"] == runs[1]["checksum"]
    assert runs[0]["checksum"] != report(runtime, "kvstore", *args)["checksum"]  # other sequences


TPCC_DEFAULT_PARAMS = {
    "warehouses": 1, "customers": 300, "items": 10000, "transactions": 100, "threads": 1, "warm_passes": 0,
    "seed": 1, "roi": 1,
}
TPCC_KINDS = ("new_order", "payment", "order_status", "delivery", "stock_level")


def test_tpcc_default(runtime: Path) -> None:
    data = report(runtime, "tpcc")
    assert data["params"] == TPCC_DEFAULT_PARAMS
    assert sum(data[kind] for kind in TPCC_KINDS) == 100 and data["violations"] == 0
    # The whole database in the page cache the program allocated, none in SQLite's overflow.
    assert data["page_cache_overflow_bytes"] == 0
    assert 7 * 2**20 < data["db_bytes"] <= data["page_cache_bytes"] < data["footprint_bytes"]


def test_tpcc_mix_and_work(runtime: Path) -> None:
    data = report(runtime, "tpcc", "--customers", "30", "--items", "1000", "--transactions", "2000")
    # TPC-C's mix: 45 / 43 / 4 / 4 / 4 %, drawn per transaction.
    for kind, share in (("new_order", 0.45), ("payment", 0.43), ("order_status", 0.04), ("delivery", 0.04),
                        ("stock_level", 0.04)):
        assert abs(data[kind] / 2000 - share) < 0.035, (kind, data[kind])
    # 1 % of New-Orders roll back; each committed one has 5..15 lines; a Delivery 10 districts at most.
    committed = data["new_order"] - data["rollbacks"]
    assert 0 < data["rollbacks"] < 0.04 * data["new_order"]
    assert 5 * committed <= data["order_lines"] <= 15 * committed
    assert 0 < data["delivered_orders"] <= 10 * data["delivery"]


@pytest.mark.parametrize("threads", ["1", "2"])
def test_tpcc_warm_passes_run_before_the_roi_from_the_same_generator(runtime: Path, threads: str) -> None:
    """--warm-passes 1 with N transactions runs what 2N transactions run (the same generator
    continues into the ROI): the same counts and checksum; the database holds both passes'
    work (self-check passed: report() asserts it)."""
    args = ("--warehouses", "2", "--customers", "30", "--items", "1000", "--threads", threads)
    warm = report(runtime, "tpcc", *args, "--transactions", "40", "--warm-passes", "1")
    whole = report(runtime, "tpcc", *args, "--transactions", "80")
    assert warm["params"]["warm_passes"] == 1 and warm["params"]["transactions"] == 40
    for key in (*TPCC_KINDS, "order_lines", "delivered_orders", "checksum"):
        assert warm[key] == whole[key], key


def test_tpcc_warehouses_from_a_footprint_and_remote_work(runtime: Path) -> None:
    data = report(runtime, "tpcc", "--footprint", "32M", "--transactions", "20")
    assert data["params"]["warehouses"] == 3 and data["params"]["footprint"] == 32 * 2**20
    # A warehouse takes ~8 MiB at the default scale: as many whole ones as fit.
    assert (32 - 9) * 2**20 < data["footprint_bytes"] <= 32 * 2**20
    assert data["db_bytes"] <= data["page_cache_bytes"] and data["page_cache_overflow_bytes"] == 0
    # Several warehouses: remote supply warehouses and customers, checked like the rest.
    data = report(runtime, "tpcc", "--warehouses", "3", "--customers", "30", "--items", "1000",
                  "--transactions", "500")
    assert data["violations"] == 0 and data["params"]["warehouses"] == 3


def test_tpcc_threads_own_a_partition_of_the_warehouses_each(runtime: Path) -> None:
    """--threads T: each thread runs its share of the transactions on a database of its own
    partition of the warehouses, from a generator of its own. Every partition passes TPC-C's
    conditions and holds its thread's committed work (report() asserts the self-check), the
    mix sums to the transactions, and a run gives the same results every time: on the host's
    cores the threads really run at once, but nothing they compute depends on the interleaving
    (except SQLite's heap peak, which is the process's). One thread is the program as it was."""
    args = ["--warehouses", "3", "--customers", "30", "--items", "1000", "--transactions", "600"]
    one = report(runtime, "tpcc", *args)
    assert report(runtime, "tpcc", *args, "--threads", "1") == one
    runs = [report(runtime, "tpcc", *args, "--threads", "3") for _ in range(2)]
    data = runs[0]
    assert data["params"] == {**one["params"], "threads": 3} and data["violations"] == 0
    assert sum(data[kind] for kind in TPCC_KINDS) == 600
    committed = data["new_order"] - data["rollbacks"]
    assert 5 * committed <= data["order_lines"] <= 15 * committed
    assert 0 < data["delivered_orders"] <= 10 * data["delivery"]
    assert {key: value for key, value in runs[1].items() if key != "heap_peak_bytes"} == {
        key: value for key, value in data.items() if key != "heap_peak_bytes"}
    assert data["checksum"] != one["checksum"]  # threads 1 and 2 draw transactions of their own
    # A database a thread (the schema and a copy of the item table each), in the one page cache.
    assert data["db_bytes"] > one["db_bytes"] and data["page_cache_overflow_bytes"] == 0
    # Partitions of 2, 2 and 1 warehouses: remote supply and customers within the first two.
    data = report(runtime, "tpcc", *args[2:], "--warehouses", "5", "--threads", "3")
    assert data["violations"] == 0 and sum(data[kind] for kind in TPCC_KINDS) == 600


def test_tpcc_threads_with_warehouses_from_a_footprint(runtime: Path) -> None:
    """--footprint with --threads: the warehouses that fit with a database a thread (each its
    schema, item table and connection), at least one a thread."""
    data = report(runtime, "tpcc", "--footprint", "48M", "--transactions", "30", "--threads", "3")
    assert data["params"]["threads"] == 3 and data["params"]["warehouses"] >= 3
    assert (48 - 9) * 2**20 < data["footprint_bytes"] <= 48 * 2**20
    assert data["db_bytes"] <= data["page_cache_bytes"] and data["page_cache_overflow_bytes"] == 0
    assert sum(data[kind] for kind in TPCC_KINDS) == 30


@pytest.mark.parametrize(("name", "args"), SMALL)
def test_same_seed_same_checksum_other_seed_other_checksum(runtime: Path, name: str, args: list[str]) -> None:
    checksums = [report(runtime, name, *args, "--seed", seed)["checksum"] for seed in ("3", "3", "4")]
    assert checksums[0] == checksums[1] != checksums[2]


@pytest.mark.parametrize(("name", "args"), SMALL)
def test_a_fault_after_the_roi_fails_the_check(runtime: Path, name: str, args: list[str]) -> None:
    """CXLSSD_WORKLOAD_FAULT flips a bit of the result the check covers: check_ok false, exit 1."""
    result = run(runtime, name, *args, env={**os.environ, "CXLSSD_WORKLOAD_FAULT": "1"})
    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout)["check_ok"] is False


# -- usage ---------------------------------------------------------------------------------


# Every workload takes the common options.
COMMON_BAD_ARGUMENTS = [
    (["--footprint", "12X"], "--footprint: '12X' is not a valid size"),
    (["--footprint", "0"], "--footprint 0: must be 1.."),
    (["--footprint"], "--footprint needs a value"),
    (["--seed", "-1"], "--seed: '-1' is not a valid count"),
    (["--roi", "256"], "--roi 256: must be 0..255"),
    (["--colour"], "unknown option --colour"),
    (["extra"], "unexpected argument 'extra'"),
]
BAD_ARGUMENTS = [(name, args, message) for name in WORKLOADS for args, message in COMMON_BAD_ARGUMENTS] + [
    ("graph", ["--kernel", "dfs"], "--kernel: 'dfs' is not one of bfs, bc"),
    ("graph", ["--vertices", "1"], "--vertices 1: must be 2..2147483648"),
    ("graph", ["--vertices", "1K", "--footprint", "1M"], "--footprint and --vertices are exclusive"),
    ("graph", ["--kernel", "bc", "--vertices", "10", "--sources", "11"], "more than the 10 vertices"),
    ("graph", ["--footprint", "100"], "--footprint 100 is too small"),
    ("graph", ["--degree", "0"], "--degree 0: must be 1..65536"),
    ("graph", ["--kernel", "bc", "--warm-passes", "1"], "--warm-passes is for --kernel bfs"),
    ("graph", ["--warm-passes", "17"], "--warm-passes 17: must be 0..16"),
    ("kvstore", ["--warm-passes", "17"], "--warm-passes 17: must be 0..16"),
    ("radix", ["--warm-passes", "-1"], "--warm-passes: '-1' is not a valid count"),
    ("tpcc", ["--warm-passes", "17"], "--warm-passes 17: must be 0..16"),
    ("radix", ["--footprint", "8"], "--footprint 8 is too small"),
    ("radix", ["--keys", "0"], "--keys 0: must be 1.."),
    ("radix", ["--digit-bits", "3"], "--digit-bits: '3' is not one of 1, 2, 4, 8"),
    ("srad", ["--lambda", "1.5"], "--lambda 1.5: must be strictly between 0 and 1"),
    ("srad", ["--lambda", "half"], "--lambda: 'half' is not a number"),
    ("srad", ["--width", "2"], "--width 2: must be 4.."),
    ("srad", ["--iterations", "0"], "--iterations 0: must be 1.."),
    ("srad", ["--footprint", "300"], "--footprint 300 is too small"),
    ("kvstore", ["--mix", "d"], "--mix: 'd' is not one of a, b, c"),
    ("kvstore", ["--theta", "1"], "--theta 1: must be strictly between 0 and 1"),
    ("kvstore", ["--records", "5", "--footprint", "1M"], "--footprint and --records are exclusive"),
    ("dlrm", ["--dist", "normal"], "--dist: 'normal' is not one of zipf, uniform"),
    ("dlrm", ["--footprint", "1M"], "--footprint 1048576 is too small"),
    ("dlrm", ["--pooling", "0"], "--pooling 0: must be 1.."),
    ("tpcc", ["--warehouses", "0"], "--warehouses 0: must be 1..10000"),
    ("tpcc", ["--warehouses", "2", "--footprint", "64M"], "--footprint and --warehouses are exclusive"),
    ("tpcc", ["--footprint", "1M"], "--footprint 1048576 is too small"),
    ("tpcc", ["--customers", "5"], "--customers 5: must be 10..3000"),
    ("tpcc", ["--items", "200K"], "--items 200K: must be 100..100000"),
    ("tpcc", ["--threads", "0"], "--threads 0: must be 1..256"),
    ("tpcc", ["--warehouses", "2", "--threads", "3"], "--threads 3: more than the 2 warehouses"),
    ("tpcc", ["--footprint", "32M", "--threads", "4"],
     "--threads 4: --footprint 33554432 holds 3 warehouses"),
]


@pytest.mark.parametrize(("name", "args", "message"), BAD_ARGUMENTS)
def test_bad_arguments_exit_2_with_usage(runtime: Path, name: str, args: list[str], message: str) -> None:
    result = run(runtime, name, *args)
    assert result.returncode == 2
    assert message in result.stderr and f"usage: {name} " in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("name", WORKLOADS)
def test_help_prints_the_usage(runtime: Path, name: str) -> None:
    result = run(runtime, name, "--help")
    assert (
        result.returncode == 0
        and result.stdout.startswith(f"usage: {name} ")
        and "--footprint" in result.stdout
    )


def test_netkv_serves_and_drives_over_loopback(runtime: Path) -> None:
    """The network workload on the host (its markers are NOPs here): the driver's
    reads all return the versions it wrote; --stop gets the server's report."""
    env = {**os.environ, "PYTHONPATH": str(runtime / "python"),
           "CXLSSD_LIB": str(runtime / "lib/libcxlssd.so")}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    server = subprocess.Popen(
        [sys.executable, "-m", "netkv", "serve", "--port", port, "--records", "300"],
        env=env, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert server.stdout is not None and json.loads(server.stdout.readline()) == {"listening": int(port)}
        driver = subprocess.run(
            [sys.executable, "-m", "netkv", "drive", "--server", "127.0.0.1", "--port", port,
             "--records", "300", "--ops", "600", "--mix", "a", "--stop"],
            env=env, capture_output=True, text=True, timeout=60,
        )
        assert driver.returncode == 0, driver.stderr
        report = json.loads(driver.stdout)
        assert report["check_ok"] and report["reads"] + report["updates"] == 600 and report["failures"] == 0
        expected = {"workload": "netkv-serve", "requests": 601, "records": 300, "check_ok": True}
        assert report["server"] == expected
        assert server.wait(timeout=30) == 0
    finally:
        server.kill()
        server.wait()
    bad = subprocess.run([sys.executable, "-m", "netkv", "drive", "--server", "x", "--ops", "0"],
                         env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "must be positive" in bad.stderr


# -- tpcc in the guest -----------------------------------------------------------------------


@pytest.mark.guest
def test_tpcc_in_the_guest_on_the_cxl_node(default_platform: Platform, runtime: Path) -> None:
    """The small default bound to the CXL node, with the guest's own SQLite: the same results
    as on the host (every result is an integer, the checksum hashes them all)."""
    node = default_platform.devices[0].node
    status, out, err = default_platform.guest().run(with_guest_env(["numactl", f"--membind={node}", "tpcc"]))
    assert status == 0, err.decode()
    data = json.loads(out)
    assert data["check_ok"] is True and data["violations"] == 0 and data["params"] == TPCC_DEFAULT_PARAMS
    assert data["checksum"] == report(runtime, "tpcc")["checksum"]


@pytest.mark.guest
def test_tpcc_threads_in_the_guest_on_the_cxl_node(default_platform: Platform, runtime: Path) -> None:
    """--threads 3 with the guest's SQLite (Debian trixie's, built thread-safe: multi-thread
    mode, a connection a thread), bound to the CXL node: the host's results."""
    args = ["--warehouses", "3", "--customers", "30", "--items", "1000", "--transactions", "300",
            "--threads", "3"]
    node = default_platform.devices[0].node
    command = ["numactl", f"--membind={node}", "tpcc", *args]
    status, out, err = default_platform.guest().run(with_guest_env(command))
    assert status == 0, err.decode()
    data = json.loads(out)
    assert data["check_ok"] is True and data["violations"] == 0 and data["params"]["threads"] == 3
    assert data["checksum"] == report(runtime, "tpcc", *args)["checksum"]


@pytest.mark.slow
@pytest.mark.guest
def test_tpcc_under_live_designs(default_platform: Platform) -> None:
    """The small default with the firmware attached: one ROI in modelled time, the CXL-SSD
    design's slower than DRAM-only's, the same transactions and results under both."""
    runs = {}
    for design in ("base-cssd", "dram-only"):
        with default_platform.attach(design) as session:
            _, out, _ = session.run(["tpcc"], check=True)
        data = json.loads(out)
        assert data["check_ok"] is True, data
        assert [roi["roi"] for roi in session.results["rois"]] == [1]
        runs[design] = data, session.results["rois"][0]
        print(f"tpcc under {design}: {runs[design][1]['modelled_ns'] / 1e6:.2f} modelled ms")
    (base, base_roi), (dram, dram_roi) = runs["base-cssd"], runs["dram-only"]
    assert base["checksum"] == dram["checksum"]
    assert base_roi["cpu"]["device_reads"] > 0 and dram_roi["cpu"]["device_reads"] == 0
    assert base_roi["modelled_ns"] > dram_roi["modelled_ns"] > 0


@pytest.mark.guest
def test_making_the_threads_is_not_in_the_roi(default_platform: Platform) -> None:
    """The ROI begins once every thread has started (wl_run_threads). Measured 2026-12-07 on
    these reads: six threads' ROI held 329 500 instructions more than one thread's while the
    threads were made inside it, 136 200 more since (their barriers, exits and joins)."""
    insns = {}
    for threads in ("1", "6"):
        with default_platform.attach("dram-only") as session:
            session.run(["randread", "--footprint", "4M", "--reads", "6000", "--threads", threads],
                        check=True)
        [roi] = session.results["rois"]
        insns[threads] = roi["cpu"]["insns"]
    print(f"ROI instructions: {insns}")
    assert insns["6"] - insns["1"] < 5 * 45_000, insns
