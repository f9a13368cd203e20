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

#define CXLSSD_MARKER_MAGIC 0xC5000000u
#define CXLSSD_CMD_ROI_BEGIN 1u
#define CXLSSD_CMD_ROI_END 2u
#define CXLSSD_CMD_CLOCK 3u
#define CXLSSD_MAX_CONST_ID 65535u
/* cxlssd_roi_begin/end accept ids below this. */
#define CXLSSD_RUNTIME_IDS 256u

#define CXLSSD_MARKER_DISP(cmd, id) (CXLSSD_MARKER_MAGIC | ((cmd) << 16) | (id))

#ifdef __cplusplus
#define CXLSSD_STATIC_ASSERT_ static_assert
#else
#define CXLSSD_STATIC_ASSERT_ _Static_assert
#endif

/*
 * Emit one marker. The "memory" clobber stops the compiler from moving loads
 * and stores across it, so the region holds exactly the accesses written
 * between begin and end.
 */
#define CXLSSD_MARKER(cmd, id)                                                             \
    do {                                                                                   \
        CXLSSD_STATIC_ASSERT_((unsigned long long)(id) <= CXLSSD_MAX_CONST_ID,               \
                              "cxlssd ROI id must be a constant 0..65535");                \
        __asm__ volatile(".byte 0x0f,0x1f,0x84,0x00\n\t.long %c0" ::"i"(                   \
                             CXLSSD_MARKER_DISP((cmd), (unsigned)(id)))                    \
                         : "memory");                                                      \
    } while (0)

#define CXLSSD_ROI_BEGIN(id) CXLSSD_MARKER(CXLSSD_CMD_ROI_BEGIN, id)
#define CXLSSD_ROI_END(id) CXLSSD_MARKER(CXLSSD_CMD_ROI_END, id)

#ifdef __cplusplus
extern "C" {
#endif

/* Mark the begin/end of ROI `id` (0..255): 0, or -1 with errno EINVAL if id > 255. */
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

#ifdef __cplusplus
}
#endif

#endif /* CXLSSD_H */
