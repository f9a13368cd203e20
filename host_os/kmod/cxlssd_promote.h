/*
 * cxlssd_promote.h - the interface of /dev/cxlssd_promote, between the guest kernel
 * helper (cxlssd_helper.c) and the promotion daemon (host_os/promoter.c); both run in the
 * guest, so this is not part of the shared-memory protocol (abi/cxlssd_abi.h).
 *
 * read(2) blocks until the plugin rang the promotion doorbell since the file's last read
 * and returns the ring count (a u64). ioctl CXLSSD_PROMOTE_WHERE answers where a process
 * may map a physical page: the kernel's reverse-map arithmetic (the page's offset in its
 * anonymous or file mapping, each of the process's VMAs of that mapping), so the daemon
 * finds the page a decision names without reading the process's whole page map. The
 * answer is a hint: check each address against /proc/PID/pagemap before using it.
 */
#ifndef CXLSSD_PROMOTE_H
#define CXLSSD_PROMOTE_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define CXLSSD_WHERE_MAX 8 /* candidate addresses per answer */

struct cxlssd_where {
	__s32 pid;                  /* in: the process */
	__u32 found;                /* out: how many of va[] are set; 0: the process does not map it */
	__u64 pfn;                  /* in: the physical page */
	__u64 va[CXLSSD_WHERE_MAX]; /* out: virtual pages of pid that map pfn if any does */
};

/* 0 and the answer; ESRCH: no such process (or no address space); EINVAL: pfn is not
 * online memory; EOPNOTSUPP: a page whose offset says nothing of its address (KSM,
 * hugetlb): the daemon reads the page map instead. */
#define CXLSSD_PROMOTE_WHERE _IOWR('x', 1, struct cxlssd_where)

#endif
