/*
 * cxlssd.h - region-of-interest (ROI) markers for programs run in a cxlssd guest.
 *
 * A marker is one 8-byte x86-64 NOP, `nopl disp32(%rax,%rax,1)`
 * (0f 1f 84 00 <disp32>), whose little-endian disp32 is
 * 0xC5000000 | cmd << 16 | id (cmd 1 = ROI begin, 2 = ROI end; id 16 bits).
 * The platform's TCG plugin recognises exactly these bytes when it translates
 * the code; on a real CPU, or in QEMU without the plugin, it is a plain NOP,
 * so a marked program runs anywhere. See docs/guest-runtime.md.
 *
 * The id is an immediate in the instruction, so it must be known at compile
 * time: CXLSSD_ROI_BEGIN/END(id) take a constant 0..65535 (checked by the
 * compiler). For ids known only at run time, libcxlssd (libcxlssd.so, or
 * libcxlssd.c compiled into the program) provides cxlssd_roi_begin/end for
 * ids 0..255: one precompiled marker per id.
 */
#ifndef CXLSSD_H
#define CXLSSD_H

#if !defined(__x86_64__)
#error "cxlssd ROI markers are x86-64 instructions"
#endif

/* The marker commands (CXLSSD_CMD_*), hint kinds, features and the pv page's layout:
 * the protocol's header, shipped beside this one. */
#include "cxlssd_abi.h"

#define CXLSSD_MAX_CONST_ID 65535u
/* cxlssd_roi_begin/end accept ids below this. */
#define CXLSSD_RUNTIME_IDS 256u

/*
 * Emit one marker. The "memory" clobber stops the compiler from moving loads
 * and stores across it, so the region holds exactly the accesses written
 * between begin and end.
 */
#define CXLSSD_MARKER(cmd, id)                                                             \
    do {                                                                                   \
        CXLSSD_ABI_ASSERT_((unsigned long long)(id) <= CXLSSD_MAX_CONST_ID,                  \
                           "cxlssd ROI id must be a constant 0..65535");                   \
        __asm__ volatile(".byte 0x0f,0x1f,0x84,0x00\n\t.long %c0" ::"i"(                   \
                             CXLSSD_MARKER_DISP((cmd), (unsigned)(id)))                    \
                         : "memory");                                                      \
    } while (0)

#define CXLSSD_ROI_BEGIN(id) CXLSSD_MARKER(CXLSSD_CMD_ROI_BEGIN, id)
#define CXLSSD_ROI_END(id) CXLSSD_MARKER(CXLSSD_CMD_ROI_END, id)

#ifdef __cplusplus
extern "C" {
#endif

/* Mark the begin/end of ROI `id` (0..255): 0, or -1 with errno EINVAL if id > 255. An ROI
 * begins right after the kernel's next timer tick (at most one tick period, 4 ms of guest
 * time, away), so that under -icount its ticks fall at the same instructions in every run;
 * CXLSSD_ROI_BEGIN(id) marks at once. */
int cxlssd_roi_begin(unsigned id);
int cxlssd_roi_end(unsigned id);

/*
 * The calling vCPU's modelled clock in ns (instructions x CPI / frequency plus
 * memory stalls, the firmware's included, up to this call), read from the
 * platform's paravirtual page (an ivshmem PCI device, mapped on first use;
 * needs root). 0 when no firmware is attached (the plugin is dormant); on
 * failure (no such device: not a cxlssd guest) 0 with errno set. With several
 * vCPUs, pin the thread: the answer is in the slot of the vCPU that ran the
 * marker, read from the slot of sched_getcpu().
 */
unsigned long long cxlssd_clock_ns(void);

/*
 * Opportunistic context switching (docs/guest-runtime.md). cxlssd_tasks_run runs
 * `ntasks` tasks, fn(task, arg) for task = 0 .. ntasks-1, as coroutines on the
 * calling thread and returns when all have returned (0, or -1 with errno). A task
 * calls cxlssd_await(p) before it uses the data at p: when the attached design
 * switches on long delays, the firmware is asked whether the load of p's line
 * takes long; if it does, the runtime runs another task (the switch costs the
 * design's switch_cost_ns of modelled time) and comes back to this one in the
 * order of the design's scheduler (round-robin or earliest-ready), paying
 * whatever of the latency the other tasks' work has not covered. Without such a
 * design (or outside cxlssd_tasks_run, or with one task) it does nothing: the
 * program's own load pays the full latency. Tasks must not block in the kernel
 * (no mutex, no sleeping system call): they share one thread.
 */
typedef void (*cxlssd_task_fn)(unsigned task, void *arg);
int cxlssd_tasks_run(unsigned ntasks, cxlssd_task_fn fn, void *arg);
void cxlssd_await(const volatile void *p);
/* Long delays this thread's tasks switched away from so far. */
unsigned long long cxlssd_switches(void);

/* CXLSSD_FEATURE_* of the attached firmware's design; 0 without one. */
unsigned cxlssd_features(void);

/*
 * The host_os interface for programs that place their own data (docs/host-os.md):
 * move the pages of [addr, addr + bytes) of the calling process that are on the CXL
 * device to host DRAM (cxlssd_dram_node()), or those in DRAM back to the CXL node, with
 * move_pages(2), and report each moved page to the firmware, so that its promotion
 * tables stay true. Returns the pages moved, or -1 with errno. Needs root (the
 * physical addresses come from /proc/self/pagemap).
 */
long cxlssd_promote(const void *addr, unsigned long bytes);
long cxlssd_demote(const void *addr, unsigned long bytes);

/*
 * Asynchronous moves (docs/offload.md): the same moves, bracketed so that the firmware's
 * transfer engine accounts for them as a device-side transfer under `ticket` (any number
 * below 2^62, unique among the transfers not yet waited for), overlapping what the vCPU
 * does next; cxlssd_transfer_wait(ticket) before the data is used charges what is left
 * of it. Lifetime hints: the device pages of [addr, addr + bytes) that are on the CXL
 * device are named to the firmware (CXLSSD_HINT_NEED / _DEAD, at op `op` 0..255). All
 * return -1 with errno without a pv page; a hint returns the pages it named.
 */
long cxlssd_promote_async(const void *addr, unsigned long bytes, unsigned long long ticket);
long cxlssd_demote_async(const void *addr, unsigned long bytes, unsigned long long ticket);
int cxlssd_transfer_wait(unsigned long long ticket);
long cxlssd_hint(unsigned kind, unsigned op, const void *addr, unsigned long bytes);

/*
 * Wait (sleeping, at most timeout_ms of wall-clock time) until the promotion daemon has
 * carried out every decision the firmware made (those that waited in the firmware for room
 * in the mailbox too: the daemon looks again after each batch, which lets them in; the
 * mailbox is empty only when none is left): a benchmark calls it between setting
 * up its data and its ROI, so that moves decided during the set-up are not paid for
 * inside the ROI. Returns at once without a design that promotes. 0 when settled, -1
 * (errno ETIMEDOUT) when the time ran out.
 */
int cxlssd_settle(unsigned timeout_ms);

/* For host_os/promoter: the pv page (NULL, errno set, if there is none), a report
 * (CXLSSD_CMD_PROMOTED, _DEMOTED, _PROMOTE_FAILED) to the firmware (0, or -1 with
 * errno), the CXL region's physical range (0, or -1), the CXL memory's NUMA node (the
 * node of the region's first memory block; -1 if none) and the host DRAM promoted pages
 * go to: the platform's movable DRAM node (a node without CPUs whose memory is no CXL
 * region's; docs/live.md, "Placement"), else node 0. */
volatile unsigned long long *cxlssd_pv_page(void);
int cxlssd_report(unsigned cmd, unsigned long long arg0, unsigned long long arg1);
int cxlssd_cxl_range(unsigned long long *base, unsigned long long *bytes);
int cxlssd_cxl_node(void);
int cxlssd_dram_node(void);

#ifdef __cplusplus
}
#endif

#endif /* CXLSSD_H */
