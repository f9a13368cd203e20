/* cxlssd_abi.h includes <stdint.h>; in the kernel the fixed-width types come from here. */
#ifndef CXLSSD_KMOD_STDINT_H
#define CXLSSD_KMOD_STDINT_H
#include <linux/types.h>
#endif
