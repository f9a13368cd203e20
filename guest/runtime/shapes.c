/*
 * shapes - instruction-count calibration program for the cxlssd platform.
 *
 * Runs five access shapes over one buffer, each inside its own ROI, in hand-written
 * assembly so every shape executes a known number of instructions per step:
 *
 *   ROI 1 mid     an 8-byte load in the middle of its block      8 instructions per step
 *   ROI 2 byte    a 1-byte load in the middle of its block       8
 *   ROI 3 sse     a 16-byte SSE load (movdqu)                    8
 *   ROI 4 store   an 8-byte store in the middle of its block     8
 *   ROI 5 chase   a dependent load (the block's first insn)      3
 *   ROI 6 movsb   rep movsb, 4 KiB from one half of the buffer   5 + the string op
 *                 to the other
 *   ROI 7 movsq   rep movsq, the same copy in 8-byte steps       5 + the string op
 *   ROI 8 stosb   rep stosb, 4 KiB                               5 + the string op
 *
 * The buffer (default 64 KiB) is touched before the ROIs, so with the platform's
 * LLC it stays cached and no shape reaches the device: on the CXL node each access
 * still takes QEMU's MMIO path (docs/live.md, "Modelled time and the host"), which
 * is what the shapes are there to show does not change the count. The string shapes
 * run the fast-string instructions the guest kernel copies and clears pages with;
 * what the platform charges for the string op itself is the plugin's rule
 * (docs/plugin.md, "Modelled clock"), so they report their bytes, not a count. The platform
 * compares the ROIs' instruction counts on node 0 and on the CXL node
 * (tests/platform/test_live.py). One JSON line: per shape its ROI id, the
 * instructions per step it should take, and what the guest saw around its ROI (read
 * outside the markers): its own wall-clock time and the local timer interrupts
 * (/proc/interrupts, LOC), the two that show whether the guest's clock follows the host;
 * and the guest events that legitimately add kernel instructions to an ROI: interrupts
 * of every kind (the timer's included), this process's context switches (a kernel
 * thread preempting it) and page faults.
 *
 * Memory placement is the caller's: run it under `numactl --membind=N`.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

#include "cxlssd.h"

#define LINE_BYTES 64u
#define DEFAULT_BYTES (64u << 10)
/* Long enough that the guest's timer ticks inside an ROI, one more or one fewer (as the
 * tick's phase falls), move its count by well under 1 % (a tick after a process starts
 * has cost up to 70 000 instructions). */
#define DEFAULT_STEPS (1u << 21)
#define BODY_INSNS 8u  /* mid, byte, sse, store: see the loops */
#define CHASE_INSNS 3u
#define STRING_LOOP_INSNS 5u /* movsb, movsq, stosb: the loop around the string op */
#define STRING_MAX_BYTES 4096u
#define N_SHAPES 8u
#define SETTLE_NS 200000000L /* 200 ms */

static const char USAGE[] = "usage: shapes [--bytes N] [--steps N]\n"
                            "  --bytes  buffer size, a power of 2, at least 64 (default 65536)\n"
                            "  --steps  steps per shape (default 2097152)\n";

/* A strided shape: BODY (two instructions, its access among them, leaving a value in
 * r8) in the middle of the block, between an ALU instruction and the index update;
 * rcx walks the buffer one line per step (masked by mask = bytes - 1). 8 instructions
 * a step. CLOBBERS: the vector registers BODY uses, if any. */
#define STRIDED_SHAPE(name, buffer_type, BODY, ...)                                                    \
    __attribute__((noinline)) static uint64_t name(buffer_type *buf, uint64_t mask, uint64_t steps)     \
    {                                                                                                 \
        uint64_t sum = 0;                                                                             \
        __asm__ volatile("xor %%ecx, %%ecx\n\t"                                                       \
                         "1:\n\t"                                                                     \
                         "add $1, %%rax\n\t" BODY "\n\t"                                              \
                         "add %%r8, %%rdx\n\t"                                                        \
                         "add $64, %%rcx\n\t"                                                         \
                         "and %[mask], %%rcx\n\t"                                                     \
                         "dec %[n]\n\t"                                                               \
                         "jnz 1b\n\t"                                                                 \
                         : [n] "+r"(steps), "+d"(sum)                                                 \
                         : [buf] "r"(buf), [mask] "r"(mask)                                           \
                         : "rax", "rcx", "r8", "cc", "memory", ##__VA_ARGS__);                        \
        return sum;                                                                                   \
    }

STRIDED_SHAPE(load_mid, const char, "xor %%rax, %%rdx\n\tmov (%[buf],%%rcx), %%r8")
STRIDED_SHAPE(load_byte, const char, "xor %%rax, %%rdx\n\tmovzbq (%[buf],%%rcx), %%r8")
/* movq moves the low half of the loaded 16 bytes to r8, so the sum still depends on it. */
STRIDED_SHAPE(load_sse, const char, "movdqu (%[buf],%%rcx), %%xmm0\n\tmovq %%xmm0, %%r8", "xmm0")
STRIDED_SHAPE(store_mid, char, "xor %%rax, %%rdx\n\tmov %%rdx, (%[buf],%%rcx)")

/* Follows the cycle the lines' first words make: the load is its block's first instruction. */
__attribute__((noinline)) static uint64_t chase(char *buf, uint64_t steps)
{
    char *p = buf;
    __asm__ volatile("1:\n\t"
                     "mov (%[p]), %[p]\n\t"
                     "dec %[n]\n\t"
                     "jnz 1b\n\t"
                     : [n] "+r"(steps), [p] "+r"(p)
                     :
                     : "cc", "memory");
    return (uint64_t)(uintptr_t)p;
}

/* A loop of `steps` string ops of `bytes` bytes each (rcx = count, in units of the op):
 * three register set-ups, the op, and the loop's dec/jnz. */
#define STRING_SHAPE(name, SETUP, OP)                                                                 \
    __attribute__((noinline)) static uint64_t name(char *src, char *dst, uint64_t count, uint64_t steps) \
    {                                                                                                 \
        __asm__ volatile("1:\n\t" SETUP "\n\t"                                                        \
                         "mov %[count], %%rcx\n\t" OP "\n\t"                                          \
                         "dec %[n]\n\t"                                                                \
                         "jnz 1b\n\t"                                                                  \
                         : [n] "+r"(steps)                                                            \
                         : [src] "r"(src), [dst] "r"(dst), [count] "r"(count)                         \
                         : "rax", "rcx", "rsi", "rdi", "cc", "memory");                               \
        return (uint8_t)dst[0];                                                                       \
    }

STRING_SHAPE(copy_movsb, "mov %[src], %%rsi\n\tmov %[dst], %%rdi", "rep movsb")
STRING_SHAPE(copy_movsq, "mov %[src], %%rsi\n\tmov %[dst], %%rdi", "rep movsq")
/* al is the low byte of src: any value will do, the buffer's lines are laid again after. */
STRING_SHAPE(fill_stosb, "mov %[src], %%rax\n\tmov %[dst], %%rdi", "rep stosb")

/* own_ns: this thread's CPU time. The ROI's guest time less it (printed as others_ns) is
 * what other tasks that preempted it ran (or the idle loop), by the guest's scheduler. */
struct seen {
    uint64_t guest_ns, timer_interrupts, interrupts, faults, context_switches, own_ns;
};

/* Interrupts so far, all CPUs, from /proc/interrupts: the local timer's (LOC) in
 * *timer, every line's in *all (devices, IPIs, the timer). Both 0 if unreadable. */
static void count_interrupts(uint64_t *timer, uint64_t *all)
{
    FILE *f = fopen("/proc/interrupts", "r");
    char line[4096];
    *timer = *all = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        char *p = strchr(line, ':');
        if (p == NULL)
            continue; /* the CPU header */
        const int loc = strncmp(line + strspn(line, " "), "LOC:", 4) == 0;
        uint64_t total = 0;
        for (char *end = ++p;; p = end) {
            unsigned long long count = strtoull(p, &end, 10);
            if (end == p)
                break;
            total += count;
        }
        *all += total;
        if (loc)
            *timer = total;
    }
    if (f != NULL)
        fclose(f);
}

static struct seen look(void)
{
    struct timespec now, own;
    struct rusage usage;
    struct seen seen;
    clock_gettime(CLOCK_MONOTONIC, &now);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &own);
    getrusage(RUSAGE_SELF, &usage);
    count_interrupts(&seen.timer_interrupts, &seen.interrupts);
    seen.guest_ns = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
    seen.faults = (uint64_t)(usage.ru_minflt + usage.ru_majflt);
    seen.context_switches = (uint64_t)(usage.ru_nvcsw + usage.ru_nivcsw);
    seen.own_ns = (uint64_t)own.tv_sec * 1000000000u + (uint64_t)own.tv_nsec;
    return seen;
}

static struct seen since(struct seen before)
{
    struct seen now = look();
    return (struct seen){now.guest_ns - before.guest_ns, now.timer_interrupts - before.timer_interrupts,
                         now.interrupts - before.interrupts, now.faults - before.faults,
                         now.context_switches - before.context_switches, now.own_ns - before.own_ns};
}

/* Each line's first word points to the next line, the last back to the first. */
static void link_lines(char *buf, uint64_t bytes)
{
    for (uint64_t off = 0; off < bytes; off += LINE_BYTES)
        *(char **)(buf + off) = buf + (off + LINE_BYTES) % bytes;
}

static uint64_t parse_arg(const char *name, const char *text)
{
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (text[0] < '0' || text[0] > '9' || *end != '\0' || errno != 0 || value == 0) {
        fprintf(stderr, "shapes: %s '%s' is not a positive number\n%s", name, text, USAGE);
        exit(2);
    }
    return value;
}

int main(int argc, char **argv)
{
    uint64_t bytes = DEFAULT_BYTES, steps = DEFAULT_STEPS;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc || (strcmp(argv[i], "--bytes") != 0 && strcmp(argv[i], "--steps") != 0)) {
            fprintf(stderr, "shapes: unexpected argument '%s'\n%s", argv[i], USAGE);
            return 2;
        }
        *(strcmp(argv[i], "--bytes") == 0 ? &bytes : &steps) = parse_arg(argv[i], argv[i + 1]);
    }
    if (bytes < LINE_BYTES || (bytes & (bytes - 1)) != 0) {
        fprintf(stderr, "shapes: --bytes must be a power of 2, at least 64\n%s", USAGE);
        return 2;
    }
    char *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        perror("shapes: mmap");
        return 1;
    }
    /* The writes also fault every page in before the ROIs (and fill the LLC). */
    link_lines(buf, bytes);
    /* Sleep before measuring: work the guest starts with a new command (the SSH
     * session's) shared the vCPU with the first ROI in some runs, up to doubling
     * its instructions; asleep, the vCPU is left to it. */
    const struct timespec settle = {.tv_sec = 0, .tv_nsec = SETTLE_NS};
    nanosleep(&settle, NULL);
    (void)look(); /* its first call's page faults (stdio's buffers) land before any ROI */
    const uint64_t mask = bytes - 1;
    uint64_t check = 0;
    struct seen seen[N_SHAPES];
/* Shape `index` inside ROI index + 1, and what the guest saw around it. */
#define MEASURE(index, call)                                                                          \
    do {                                                                                              \
        const struct seen before = look();                                                            \
        CXLSSD_ROI_BEGIN((index) + 1);                                                                \
        check += (call);                                                                              \
        CXLSSD_ROI_END((index) + 1);                                                                  \
        seen[index] = since(before);                                                                  \
    } while (0)
    MEASURE(0, load_mid(buf, mask, steps));
    MEASURE(1, load_byte(buf, mask, steps));
    MEASURE(2, load_sse(buf, mask, steps));
    MEASURE(3, store_mid(buf, mask, steps));
    /* The stores wrote sums over the links: lay the cycle again (outside any ROI). */
    link_lines(buf, bytes);
    MEASURE(4, chase(buf, steps));
    /* A string op moves bytes / 32 times more data a step than the strided shapes: fewer
     * steps keep the ROIs' host time alike (each byte is an access under TCG). */
    const uint64_t string_bytes = bytes / 2 < STRING_MAX_BYTES ? bytes / 2 : STRING_MAX_BYTES;
    const uint64_t string_steps = steps / 4096 ? steps / 4096 : 1;
    MEASURE(5, copy_movsb(buf, buf + bytes / 2, string_bytes, string_steps));
    MEASURE(6, copy_movsq(buf, buf + bytes / 2, string_bytes / 8, string_steps));
    MEASURE(7, fill_stosb(buf, buf + bytes / 2, string_bytes, string_steps));

    static const char *const names[N_SHAPES] = {"mid", "byte", "sse", "store", "chase", "movsb", "movsq", "stosb"};
    printf("{\"bytes\": %" PRIu64 ", \"steps\": %" PRIu64 ", \"check\": %" PRIu64 ", \"shapes\": {", bytes,
           steps, check);
    for (unsigned i = 0; i < N_SHAPES; i++) {
        const int string = i >= 5;
        printf("%s\"%s\": {\"roi\": %u, \"steps\": %" PRIu64 ", \"insns_per_step\": %u, "
               "\"string_bytes_per_step\": %" PRIu64 ", \"guest_ns\": %" PRIu64 ", \"timer_interrupts\": %" PRIu64
               ", \"interrupts\": %" PRIu64 ", \"faults\": %" PRIu64 ", \"context_switches\": %" PRIu64
               ", \"others_ns\": %" PRIu64 "}",
               i ? ", " : "", names[i], i + 1, string ? string_steps : steps,
               string ? STRING_LOOP_INSNS : i < 4 ? BODY_INSNS : CHASE_INSNS, string ? string_bytes : 0,
               seen[i].guest_ns, seen[i].timer_interrupts, seen[i].interrupts, seen[i].faults,
               seen[i].context_switches,
               seen[i].guest_ns > seen[i].own_ns ? seen[i].guest_ns - seen[i].own_ns : 0);
    }
    printf("}}\n");
    munmap(buf, bytes);
    return 0;
}
