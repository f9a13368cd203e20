/* cxlssd_abi.h includes <stddef.h> (offsetof); in the kernel it comes from here. */
#ifndef CXLSSD_KMOD_STDDEF_H
#define CXLSSD_KMOD_STDDEF_H
#include <linux/stddef.h>
#endif
