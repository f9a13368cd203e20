/*
 * cxlssd's own declarations of the part of the QEMU TCG plugin API (version 4,
 * QEMU 10.0) that the cxlssd plugin uses.
 *
 * No Debian package ships QEMU's plugin header, so the project declares the few
 * functions, types and constants it needs itself. Everything here was written
 * for cxlssd and checked against QEMU 10.0's documented plugin API
 * (docs/devel/tcg-plugins, the API reference): the functions are resolved by
 * name from the QEMU binary when the plugin is loaded, so only three things
 * must match QEMU exactly and are pinned down below:
 *   - the layout of the structures QEMU passes or reads by value
 *     (struct cxlssd_qemu_info, cxlssd_qemu_u64);
 *   - the numeric values of the enumerations;
 *   - the function signatures (argument and return types).
 * The static asserts at the end guard the layouts on the x86-64 host.
 *
 * Only what the plugin uses is declared; add to it (after checking the
 * documented API) rather than importing QEMU's header.
 */
#ifndef CXLSSD_QEMU_PLUGIN_API_H
#define CXLSSD_QEMU_PLUGIN_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The API version the plugin is written against. QEMU 10.0 accepts 2..4. */
#define CXLSSD_QEMU_PLUGIN_API_VERSION 4

#define CXLSSD_PLUGIN_EXPORT __attribute__((visibility("default")))

/* Opaque identifier QEMU gives the plugin at install time. */
typedef uint64_t qemu_plugin_id_t;

/* What QEMU tells the plugin about the guest at install time (read only
 * during qemu_plugin_install). Layout must match QEMU's: a string pointer, the
 * {min, cur} API version pair, a bool, then a union whose system-emulation
 * member is {smp_vcpus, max_vcpus}. */
typedef struct qemu_info_t {
    const char *target_name;
    struct {
        int min;
        int cur;
    } version;
    bool system_emulation;
    union {
        struct {
            int smp_vcpus;
            int max_vcpus;
        } system;
    };
} qemu_info_t;

/* Opaque handles, only ever used through pointers. */
struct qemu_plugin_tb;
struct qemu_plugin_insn;
struct qemu_plugin_hwaddr;
struct qemu_plugin_scoreboard;

/* One uint64_t field of a scoreboard entry: passed BY VALUE to QEMU, so the
 * layout (scoreboard pointer, byte offset of the field in an entry) matters. */
typedef struct {
    struct qemu_plugin_scoreboard *score;
    size_t offset;
} qemu_plugin_u64;

/* Per-access information handle (a packed 32-bit value in QEMU). */
typedef uint32_t qemu_plugin_meminfo_t;

enum qemu_plugin_cb_flags {
    QEMU_PLUGIN_CB_NO_REGS = 0,
    QEMU_PLUGIN_CB_R_REGS = 1,
    QEMU_PLUGIN_CB_RW_REGS = 2,
};

enum qemu_plugin_mem_rw {
    QEMU_PLUGIN_MEM_R = 1,
    QEMU_PLUGIN_MEM_W = 2,
    QEMU_PLUGIN_MEM_RW = 3,
};

enum qemu_plugin_op {
    QEMU_PLUGIN_INLINE_ADD_U64 = 0,
    QEMU_PLUGIN_INLINE_STORE_U64 = 1,
};

/* Callback types. */
typedef void (*qemu_plugin_simple_cb_t)(qemu_plugin_id_t id);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);
typedef void (*qemu_plugin_vcpu_udata_cb_t)(unsigned int vcpu_index, void *userdata);
typedef void (*qemu_plugin_vcpu_simple_cb_t)(qemu_plugin_id_t id, unsigned int vcpu_index);
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_vcpu_mem_cb_t)(unsigned int vcpu_index, qemu_plugin_meminfo_t info,
                                          uint64_t vaddr, void *userdata);

/* Exported BY the plugin. */
extern CXLSSD_PLUGIN_EXPORT int qemu_plugin_version;
CXLSSD_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
                                             int argc, char **argv);

/* Provided BY QEMU. */
void qemu_plugin_register_vcpu_init_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_simple_cb_t cb);
void qemu_plugin_register_vcpu_idle_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_simple_cb_t cb);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);

/* Unregisters every callback of the plugin and flushes the translated code
 * (asynchronously, from a safe point); cb runs when that is done, and may
 * register callbacks again. */
void qemu_plugin_reset(qemu_plugin_id_t id, qemu_plugin_simple_cb_t cb);

size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);

void qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(struct qemu_plugin_tb *tb,
                                                       enum qemu_plugin_op op,
                                                       qemu_plugin_u64 entry, uint64_t imm);
void qemu_plugin_register_vcpu_insn_exec_inline_per_vcpu(struct qemu_plugin_insn *insn,
                                                         enum qemu_plugin_op op,
                                                         qemu_plugin_u64 entry, uint64_t imm);
/* Copies up to len bytes of the instruction's encoding; returns how many. */
size_t qemu_plugin_insn_data(const struct qemu_plugin_insn *insn, void *dest, size_t len);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *insn);
/* Runs cb before the instruction executes. */
void qemu_plugin_register_vcpu_insn_exec_cb(struct qemu_plugin_insn *insn, qemu_plugin_vcpu_udata_cb_t cb,
                                            enum qemu_plugin_cb_flags flags, void *userdata);
void qemu_plugin_register_vcpu_mem_cb(struct qemu_plugin_insn *insn, qemu_plugin_vcpu_mem_cb_t cb,
                                      enum qemu_plugin_cb_flags flags, enum qemu_plugin_mem_rw rw,
                                      void *userdata);

bool qemu_plugin_mem_is_store(qemu_plugin_meminfo_t info);
unsigned int qemu_plugin_mem_size_shift(qemu_plugin_meminfo_t info);
struct qemu_plugin_hwaddr *qemu_plugin_get_hwaddr(qemu_plugin_meminfo_t info, uint64_t vaddr);
bool qemu_plugin_hwaddr_is_io(const struct qemu_plugin_hwaddr *haddr);
uint64_t qemu_plugin_hwaddr_phys_addr(const struct qemu_plugin_hwaddr *haddr);

struct qemu_plugin_scoreboard *qemu_plugin_scoreboard_new(size_t element_size);
void qemu_plugin_scoreboard_free(struct qemu_plugin_scoreboard *score);
uint64_t qemu_plugin_u64_get(qemu_plugin_u64 entry, unsigned int vcpu_index);
void qemu_plugin_u64_add(qemu_plugin_u64 entry, unsigned int vcpu_index, uint64_t added);
int qemu_plugin_num_vcpus(void);

void qemu_plugin_outs(const char *string);

/* Layout guards (x86-64 host, LP64). */
_Static_assert(sizeof(qemu_plugin_u64) == 16, "qemu_plugin_u64 is {pointer, size_t}");
_Static_assert(offsetof(qemu_plugin_u64, offset) == 8, "qemu_plugin_u64.offset follows the pointer");
_Static_assert(offsetof(qemu_info_t, version) == 8, "qemu_info_t.version follows target_name");
_Static_assert(offsetof(qemu_info_t, system_emulation) == 16, "qemu_info_t.system_emulation");
_Static_assert(offsetof(qemu_info_t, system.smp_vcpus) == 20, "qemu_info_t.system.smp_vcpus");
_Static_assert(offsetof(qemu_info_t, system.max_vcpus) == 24, "qemu_info_t.system.max_vcpus");
_Static_assert(sizeof(qemu_info_t) == 32, "qemu_info_t size");

#endif /* CXLSSD_QEMU_PLUGIN_API_H */
