/*
 * cxlssd_abi.h - the shared-memory protocol between the TCG plugin, the firmware and
 * the guest: the one C description of every record, layout and number they exchange.
 *
 * Included by the plugin (platform/plugin/cxlssd_plugin.c), the guest runtime
 * (guest/runtime/cxlssd.h includes it, so guest programs get the marker numbers) and
 * the promotion daemon (host_os/promoter.c, through cxlssd.h). The Python side is
 * abi/protocol.py; tests/test_abi.py compiles this header and checks every offset,
 * size and constant against it. All layouts are little-endian with explicit reserved
 * fields (no implicit padding); changing one means a new version number.
 *
 *   - counters file (plugin shm=PATH): a header, CXLSSD_WINDOW_SLOTS window slots,
 *     one vCPU slot per vCPU, the ROI event table (docs/plugin.md);
 *   - request ring (ring=PATH): a header, then capacity request records;
 *   - paravirtual page (pv=PATH, the guest's ivshmem BAR): a header, one slot per
 *     vCPU, the promotion mailbox at CXLSSD_PV_MAILBOX_OFFSET;
 *   - markers: the 8-byte NOP 0f 1f 84 00 <disp32>, disp32 = CXLSSD_MARKER_DISP(cmd, id).
 */
#ifndef CXLSSD_ABI_H
#define CXLSSD_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define CXLSSD_ABI_ASSERT_ static_assert
#else
#define CXLSSD_ABI_ASSERT_ _Static_assert
#endif

/* ---- markers (guest -> plugin) ------------------------------------------------------ */
#define CXLSSD_MARKER_BYTES 8u
#define CXLSSD_MARKER_MAGIC 0xC5000000u /* disp32's top byte is 0xC5 */
#define CXLSSD_MARKER_DISP(cmd, id) (CXLSSD_MARKER_MAGIC | ((cmd) << 16) | (id))
#define CXLSSD_CMD_ROI_BEGIN 1u
#define CXLSSD_CMD_ROI_END 2u
#define CXLSSD_CMD_CLOCK 3u          /* a modelled-clock read: the answer in the pv slot */
#define CXLSSD_CMD_QUERY 4u          /* the next access is a long-delay query */
#define CXLSSD_CMD_SWITCH 5u         /* a switch away from a task or thread: id CXLSSD_SWITCH_* */
#define CXLSSD_CMD_RESUME 6u         /* a task resumes: its ticket in the pv slot's arg0 */
#define CXLSSD_CMD_PROMOTED 7u       /* promotion reports of host_os/promoter: arg0 device */
#define CXLSSD_CMD_DEMOTED 8u        /*   page, arg1 the page's physical address in RAM */
#define CXLSSD_CMD_PROMOTE_FAILED 9u
#define CXLSSD_CMD_XFER_BEGIN 10u    /* transfer engine (docs/offload.md): arg0 ticket << 1 | to device */
#define CXLSSD_CMD_XFER_END 11u      /*   arg0 the ticket */
#define CXLSSD_CMD_XFER_WAIT 12u     /*   arg0 the ticket */
#define CXLSSD_CMD_HINT 13u          /* lifetime hint: arg0 kind << 56 | op << 48 | pages << 32 | page */
#define CXLSSD_CMD_DAEMON 14u        /* the kernel helper: the promotion daemon left (id CXLSSD_DAEMON_OFF) */
#define CXLSSD_CMD_LAST CXLSSD_CMD_DAEMON /* or got back (CXLSSD_DAEMON_ON) its CPU */
#define CXLSSD_XFER_BY_OS (1ull << 63) /* XFER_BEGIN's arg0: the promotion daemon's moves (firmware/hints.py) */
#define CXLSSD_SWITCH_RUNTIME 0u     /* the guest runtime's tasks: charged switch_cost_ns */
#define CXLSSD_SWITCH_KERNEL 1u      /* the kernel helper parked a thread: its instructions are the cost */
#define CXLSSD_DAEMON_OFF 0u         /* DAEMON's id: the promotion daemon's thread is switched out */
#define CXLSSD_DAEMON_ON 1u          /*   ... and in again */
#define CXLSSD_HINT_NEED 1u          /* the tensor is used at op `op`: bring it into SSD DRAM */
#define CXLSSD_HINT_DEAD 2u          /* its value is dead after op `op`: drop it, no write-back */
#define CXLSSD_MAX_HINT_PAGES 0xffffu /* pages one HINT marker names at most */

/* ---- device requests: the ring's records (plugin -> firmware) ----------------------- */
#define CXLSSD_OP_READ 0u
#define CXLSSD_OP_WRITE 1u
#define CXLSSD_OP_PROMOTED 2u /* the host finished promoting page addr >> 12 (replay traces) */
#define CXLSSD_OP_DEMOTED 3u  /* ... demoting it; flags & CXLSSD_FLAG_DIRTY: it was written */
#define CXLSSD_OP_MARKER 4u   /* a marker: flags = cmd, addr = ROI event index << 16 | id or arg0 */
#define CXLSSD_FLAG_DIRTY 1u  /* OP_DEMOTED: the page was written while in host DRAM */
#define CXLSSD_FLAG_POSTED 2u /* OP_WRITE: an LLC write-back, never charged to the vCPU */
#define CXLSSD_FLAG_QUERY 4u  /* OP_READ: a long-delay query, the plugin waits for the answer */
#define CXLSSD_FLAG_HOST 8u   /* an LLC miss on a promoted page, served by host DRAM (counted, not charged) */

struct cxlssd_request {
    uint64_t time_ns; /* issue time on the vCPU's modelled clock */
    uint64_t addr;    /* device physical address, bytes */
    uint16_t vcpu;
    uint16_t size;    /* bytes, 1..64, within one 64-byte line; 0 for a marker */
    uint8_t op;       /* CXLSSD_OP_* */
    uint8_t flags;    /* CXLSSD_FLAG_*, or the marker's command */
    uint16_t thread;  /* the guest thread on its vCPU: its pid (0: not known), from the pv slot */
};

/* ---- the request ring (ring=PATH) --------------------------------------------------- */
#define CXLSSD_RING_MAGIC 0x51524453534c5843ULL /* "CXLSSDRQ" read as little-endian bytes */
#define CXLSSD_RING_VERSION 1u
#define CXLSSD_RING_HEADER_BYTES 256u /* the records follow */
/* producer_state */
#define CXLSSD_RING_RUNNING 1u
#define CXLSSD_RING_EXITED 2u
#define CXLSSD_RING_CONSUMER_GONE 3u
#define CXLSSD_RING_CONSUMER_STALLED 4u
/* consumer_state */
#define CXLSSD_RING_DETACHED_NEVER 0u
#define CXLSSD_RING_ATTACHED 1u
#define CXLSSD_RING_DETACHED 2u

struct cxlssd_ring_header {
    uint64_t magic; /* written last */
    uint32_t version, header_bytes;
    uint32_t record_bytes, capacity; /* capacity: records, a power of 2 */
    uint64_t file_bytes, qemu_pid, insn_ps, timeout_ns;
    uint32_t producer_state, reserved0;
    /* the producer's cache line */
    uint64_t head, dropped, full_waits, wait_ns, reserved1[4];
    /* the consumer's cache line */
    uint64_t tail;
    uint32_t consumer_state, reserved2;
    uint64_t consumer_pid, reserved3[5];
    uint64_t reserved4[8];
};

/* ---- the counters file (shm=PATH) --------------------------------------------------- */
#define CXLSSD_COUNTERS_MAGIC 0x43504453534c5843ULL /* "CXLSSDPC" */
#define CXLSSD_COUNTERS_VERSION 3u
#define CXLSSD_COUNTERS_HEADER_BYTES 128u
#define CXLSSD_WINDOW_SLOTS 8u
#define CXLSSD_WINDOW_SLOT_BYTES 64u
#define CXLSSD_VCPU_SLOT_BYTES 128u
#define CXLSSD_WINDOW_OFFSET CXLSSD_COUNTERS_HEADER_BYTES
#define CXLSSD_VCPU_OFFSET (CXLSSD_WINDOW_OFFSET + CXLSSD_WINDOW_SLOTS * CXLSSD_WINDOW_SLOT_BYTES)
#define CXLSSD_ROI_SLOTS 4096u
#define CXLSSD_ROI_EVENT_BYTES 128u
#define CXLSSD_VCPU_COUNTERS 14 /* insns .. device_dropped: what ROI events copy */
/* state */
#define CXLSSD_STATE_RUNNING 1u
#define CXLSSD_STATE_EXITED 2u
/* window slot flags */
#define CXLSSD_WINDOW_REJECTED 1u
#define CXLSSD_WINDOW_ACCEPTED 2u
/* requested_mode, mode */
#define CXLSSD_MODE_DORMANT 0u
#define CXLSSD_MODE_ACTIVE 1u

struct cxlssd_counters_header {
    uint64_t magic; /* written last: a reader that sees it sees an initialised file */
    uint32_t version, header_bytes;
    uint32_t vcpu_slots, window_slots;
    uint32_t window_offset, vcpu_offset;
    uint32_t n_windows, state; /* n_windows: published windows (the publisher increments it) */
    uint64_t file_bytes, qemu_pid;
    uint32_t vcpu_slot_bytes, llc_ways;
    uint64_t llc_bytes, insn_ps;
    uint32_t requested_mode, mode; /* requested by the platform; the plugin's */
    uint64_t dram_ps;
    uint32_t roi_offset, roi_slots;
    uint64_t roi_events; /* recorded (beyond the slots they are counted, not kept) */
    uint32_t activations, markers_ignored;
    /* 1: a store miss writes the device's log, no fetch; 1: an ROI begins on an empty LLC */
    uint32_t store_miss_write, llc_cold_at_roi;
};

struct cxlssd_window_slot {
    uint64_t base, size, loads, stores, lines_touched, flags, dpa_base, reserved;
};

/* One pair of cache lines per vCPU, written only by its own vCPU thread. */
struct cxlssd_vcpu_slot {
    uint64_t insns, mem_accesses, io_accesses, cxl_loads, cxl_stores;
    uint64_t llc_hits[2], llc_misses[2], writebacks[2]; /* [0] DRAM, [1] CXL */
    uint64_t device_reads, device_writes, device_dropped;
    uint64_t local_ps; /* the local modelled clock */
    uint64_t reserved;
};

struct cxlssd_roi_event {
    uint32_t code; /* cmd << 16 | id */
    uint16_t vcpu, reserved;
    uint64_t local_ps;
    uint64_t counters[CXLSSD_VCPU_COUNTERS]; /* the vCPU slot's, insns .. device_dropped */
};

/* ---- the paravirtual page (pv=PATH; the guest's ivshmem BAR) ------------------------ */
#define CXLSSD_PV_MAGIC 0x56504453534c5843ULL /* "CXLSSDPV" */
#define CXLSSD_PV_VERSION 4u
#define CXLSSD_PV_BYTES 4096u /* the page (the smallest the plugin takes) */
#define CXLSSD_PV_HEADER_BYTES 64u
#define CXLSSD_PV_SLOT_BYTES 64u
#define CXLSSD_PV_MAILBOX_OFFSET 2048u /* firmware -> guest promotion decisions */
#define CXLSSD_PV_MAILBOX_HEADER 64u   /* u64 head (firmware), tail and taken (guest), then entries */
#define CXLSSD_PV_DEMOTE (1ull << 63)  /* a mailbox entry: device page | DEMOTE for a demotion */
/* features: what the attached firmware's design asks of the guest */
#define CXLSSD_FEATURE_CONTEXT_SWITCH 1u
#define CXLSSD_FEATURE_PROMOTION 2u
/* with CONTEXT_SWITCH: the plugin also asks about reads while no ROI is open */
#define CXLSSD_FEATURE_SWITCH_OUTSIDE_ROI 4u
/* scheduler: the guest runtime's task scheduler */
#define CXLSSD_SCHEDULER_ROUND_ROBIN 0u
#define CXLSSD_SCHEDULER_EARLIEST_READY 1u

struct cxlssd_pv_header {
    uint64_t magic;
    uint32_t version, slots, slot_offset, slot_bytes;
    uint32_t features, scheduler; /* written by the attached firmware */
    uint32_t mailbox_offset, mailbox_entries;
    uint64_t reserved[3];
};

/* Per vCPU. The guest writes arg0/arg1 before a marker that takes arguments. */
struct cxlssd_pv_slot {
    uint64_t clock_ns, seq; /* the last clock read: the clock first, seq last */
    uint64_t query_ready_ns, query_long, query_ticket; /* the last long-delay query, ticket last */
    uint64_t arg0, arg1;
    uint64_t thread; /* the guest thread on the vCPU (its pid; 0: not known), the kernel helper's */
};

/* head: decisions posted (firmware); tail: decisions carried out (guest); taken: decisions
 * the guest has copied out, tail <= taken <= head: their entries may be reused. The firmware
 * reads taken only at the daemon's reports, points of the request stream after it was
 * written, so whether a decision finds room does not depend on the host's speed. */
struct cxlssd_pv_mailbox {
    uint64_t head, tail, taken, reserved[5];
    uint64_t entries[]; /* mailbox_entries of them */
};

CXLSSD_ABI_ASSERT_(sizeof(struct cxlssd_request) == 24, "request record");
CXLSSD_ABI_ASSERT_(sizeof(struct cxlssd_ring_header) == CXLSSD_RING_HEADER_BYTES, "ring header");
CXLSSD_ABI_ASSERT_(offsetof(struct cxlssd_ring_header, head) == 64, "ring: the producer's line");
CXLSSD_ABI_ASSERT_(offsetof(struct cxlssd_ring_header, tail) == 128, "ring: the consumer's line");
CXLSSD_ABI_ASSERT_(sizeof(struct cxlssd_counters_header) == CXLSSD_COUNTERS_HEADER_BYTES, "counters header");
CXLSSD_ABI_ASSERT_(sizeof(struct cxlssd_window_slot) == CXLSSD_WINDOW_SLOT_BYTES, "window slot");
CXLSSD_ABI_ASSERT_(sizeof(struct cxlssd_vcpu_slot) == CXLSSD_VCPU_SLOT_BYTES, "vCPU slot");
CXLSSD_ABI_ASSERT_(offsetof(struct cxlssd_vcpu_slot, local_ps) == 8 * CXLSSD_VCPU_COUNTERS,
                   "vCPU slot: the clock after the counters");
CXLSSD_ABI_ASSERT_(sizeof(struct cxlssd_roi_event) == CXLSSD_ROI_EVENT_BYTES, "ROI event");
CXLSSD_ABI_ASSERT_(sizeof(struct cxlssd_pv_header) == CXLSSD_PV_HEADER_BYTES, "pv header");
CXLSSD_ABI_ASSERT_(sizeof(struct cxlssd_pv_slot) == CXLSSD_PV_SLOT_BYTES, "pv slot");
CXLSSD_ABI_ASSERT_(sizeof(struct cxlssd_pv_mailbox) == CXLSSD_PV_MAILBOX_HEADER, "pv mailbox header");

#endif /* CXLSSD_ABI_H */
