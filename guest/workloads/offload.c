/*
 * offload - training of an MLP whose tensors live in CXL memory, with a lifetime-aware
 * prefetch/offload helper in the manner of G10 and TeraIO (cxlssd guest workload).
 *
 * The model: --layers L dense layers of --width W (W x W weights and a bias each, ReLU
 * between them, softmax cross-entropy on the last layer's W logits), trained by plain SGD
 * (--lr) on one synthetic batch of --batch B samples (inputs uniform in [-1, 1) and labels
 * in [0, W), from --seed) for --profile-iterations K and then --iterations N iterations.
 * Every tensor (input, labels, weights, biases, activations, their gradients) is its own
 * anonymous mapping, so the whole set lives where the process is bound (numactl --membind).
 *
 * An iteration is 2L + 1 ops: forward 0 .. L-1, the loss, backward L-1 .. 0 (each computes
 * the layer's weight and bias gradients and the gradient of its input, then applies the
 * SGD step to the layer). The hot loops are register-tiled SSE: the forward and the input
 * gradient read the weight matrix once per 4 samples, the weight gradient once.
 *
 * --policy none: tensors stay where they are. --policy lifetime: the K profiling iterations
 * record which ops use each tensor (the ops declare their tensors, the executor records what
 * ran); from then on, before op i the tensors used within the next --lookahead ops are
 * promoted to host DRAM (cxlssd_promote: move_pages to cxlssd_dram_node(), reported to the
 * firmware), and after op i the tensors whose last use in the iteration was op i are demoted
 * (cxlssd_demote), unless the next iteration's prefetch would bring them back at once.
 * Promoted bytes stay within --dram-budget: a prefetch that does not fit evicts (demotes)
 * the promoted tensors whose next use is further away than its own, furthest first
 * (Belady's order, as G10 evicts), or is skipped when none is. Tensors used by a single op
 * are never moved: CXL memory is load/store addressable, the op reads them in place, and a
 * move in and out would cost a read and a write of the whole tensor on the device. With
 * --scratch on (the default), the short-lived ones (the weight and bias gradients, dead after
 * the op that writes them) get host DRAM instead, as the frameworks' memory planners give
 * them: one scratch buffer in host DRAM that every backward op reuses, booked against the
 * budget (evicting as a prefetch does) while its op runs and its pages freed after it; when
 * the budget cannot make room, the op uses the tensors on the device.
 *
 * ROI --roi (1) is the N measured iterations (after profiling); each is timed with the
 * modelled clock (cxlssd_clock_ns, 0 outside a live run: the report's times are then null).
 *
 * Self-check after the ROI: the same K + N iterations run again on freshly allocated
 * tensors placed in host DRAM (cxlssd_dram_node(), with mbind: another placement, no moves,
 * and cheap to emulate); the final weights and biases and every iteration's loss must be bit-identical
 * to the measured run's, the losses finite and the last below the first. One JSON line on
 * stdout; exit 0, 1 if the check failed, 2 for a usage error.
 */
#include "common.h"

#include <sys/syscall.h>
#include <unistd.h>

#define DEFAULT_LAYERS 3u
#define DEFAULT_WIDTH 768u
#define DEFAULT_BATCH 16u
#define DEFAULT_ITERATIONS 2u
#define DEFAULT_PROFILE 1u
#define DEFAULT_LOOKAHEAD 2u
#define DEFAULT_BUDGET (16ull << 20)
#define DEFAULT_LR 0.05
#define MAX_LAYERS 16u
#define MAX_WIDTH 8192u
#define MAX_BATCH 4096u
#define PAGE_BYTES 4096ull
#define MIN_USES 2u /* tensors used by fewer ops are accessed in place */

/* Generators (wl_stream): weights, inputs, labels. */
#define STREAM_WEIGHTS 1ull
#define STREAM_INPUT 2ull
#define STREAM_LABELS 3ull

enum policy { POLICY_NONE, POLICY_STATIC, POLICY_LIFETIME };
static const char *const POLICIES[] = {"none", "static", "lifetime", NULL};
enum transfer { TRANSFER_SYNC, TRANSFER_ASYNC };
static const char *const TRANSFERS[] = {"sync", "async", NULL};
static const char *const SWITCHES[] = {"off", "on", NULL};

static const char USAGE[] =
    "usage: offload [--width W | --footprint BYTES] [--layers L] [--batch B] [--iterations N]\n"
    "               [--profile-iterations K] [--policy none|static|lifetime] [--lookahead A]\n"
    "               [--dram-budget BYTES] [--transfer sync|async] [--hints off|on]\n"
    "               [--scratch on|off] [--lr X] [--seed S] [--roi ID]\n"
    "  --width               neurons per layer, a multiple of 16 (default 768)\n"
    "  --footprint           pick the largest width whose tensors fit BYTES\n"
    "  --layers              dense layers (default 3)\n"
    "  --batch               samples per batch, a multiple of 4 (default 16)\n"
    "  --iterations          measured training iterations (default 2)\n"
    "  --profile-iterations  iterations before them that record tensor lifetimes (default 1)\n"
    "  --policy              none: tensors stay; static: the densest tensors that fit the budget\n"
    "                        are promoted once, before the ROI; lifetime: prefetch/offload\n"
    "                        (default none)\n"
    "  --lookahead           lifetime: promote tensors used within this many ops (default 2)\n"
    "  --dram-budget         static, lifetime: most bytes promoted at once (default 16M)\n"
    "  --transfer            lifetime: sync (move_pages on this vCPU) or async (the device's\n"
    "                        transfer engine, overlapping compute; default sync)\n"
    "  --hints               lifetime: tell the firmware each tensor's next use and death (off)\n"
    "  --scratch             lifetime: the weight and bias gradients in a host-DRAM scratch\n"
    "                        buffer reused by every backward op, within the budget (on)\n"
    "  --lr                  SGD learning rate, 0 < X < 10 (default 0.05)\n" WL_COMMON_USAGE;

struct options {
    uint64_t layers, width, batch, iterations, profile, lookahead, budget;
    unsigned policy;   /* enum policy */
    unsigned transfer; /* enum transfer */
    unsigned hints;    /* 0 off, 1 on */
    unsigned scratch;  /* 0 off, 1 on */
    double lr;
    struct wl_common common;
};

/* ---- the tensors and the ops ---------------------------------------------------------- */

/* Tensor ids: the labels, per layer l its weight, bias and their gradients, then the
 * activations act 0 (the input) .. L (layer l reads act l and writes act l + 1), then the
 * activations' gradients grad 1 .. L (the input needs none). */
enum { T_LABELS, T_FIRST_LAYER };
#define PER_LAYER 4u
static inline unsigned id_weight(uint64_t l) { return T_FIRST_LAYER + PER_LAYER * (unsigned)l; }
static inline unsigned id_bias(uint64_t l) { return id_weight(l) + 1; }
static inline unsigned id_dweight(uint64_t l) { return id_weight(l) + 2; }
static inline unsigned id_dbias(uint64_t l) { return id_weight(l) + 3; }
static inline unsigned id_act(uint64_t layers, uint64_t l) { return id_weight(layers) + (unsigned)l; }
static inline unsigned id_grad(uint64_t layers, uint64_t l) { return id_act(layers, layers) + (unsigned)l; }
static inline unsigned tensor_count(uint64_t layers) { return id_grad(layers, layers) + 1; }

#define MAX_TENSORS (T_FIRST_LAYER + PER_LAYER * MAX_LAYERS + 2 * MAX_LAYERS + 2)
#define MAX_OPS (2 * MAX_LAYERS + 1)
_Static_assert(MAX_OPS <= 64, "an op set is a 64-bit mask");

enum op_kind { OP_FORWARD, OP_LOSS, OP_BACKWARD };
/* An op's tensors by role; NO_TENSOR where the op has none in that role. */
enum { S_IN, S_WEIGHT, S_BIAS, S_OUT, S_LABELS, S_OUT_GRAD, S_DWEIGHT, S_DBIAS, S_IN_GRAD, SLOTS };
#define NO_TENSOR UINT32_MAX

struct op {
    enum op_kind kind;
    uint64_t layer;
    uint32_t slot[SLOTS];
};

struct tensor {
    float *data; /* the labels are uint32, in the same kind of buffer */
    uint64_t bytes;
};

struct model {
    uint64_t layers, width, batch;
    float lr;
    unsigned ntensors, nops;
    struct tensor tensor[MAX_TENSORS];
    struct op op[MAX_OPS];
};

/* An op without tensors yet. */
static struct op blank_op(enum op_kind kind, uint64_t layer)
{
    struct op op = {.kind = kind, .layer = layer};
    for (unsigned s = 0; s < SLOTS; s++)
        op.slot[s] = NO_TENSOR;
    return op;
}

/* An op of layer l, with the tensors every such op uses: its input activation, weights, bias. */
static struct op layer_op(enum op_kind kind, uint64_t layers, uint64_t l)
{
    struct op op = blank_op(kind, l);
    op.slot[S_IN] = id_act(layers, l);
    op.slot[S_WEIGHT] = id_weight(l);
    op.slot[S_BIAS] = id_bias(l);
    return op;
}

/* Op i of an iteration: forward 0 .. L-1, the loss, backward L-1 .. 0. */
static struct op make_op(const struct model *m, unsigned i)
{
    const uint64_t L = m->layers;
    if (i < L) {
        struct op op = layer_op(OP_FORWARD, L, i);
        op.slot[S_OUT] = id_act(L, i + 1);
        return op;
    }
    if (i > L) {
        const uint64_t l = 2 * L - i;
        struct op op = layer_op(OP_BACKWARD, L, l);
        op.slot[S_OUT_GRAD] = id_grad(L, l + 1);
        op.slot[S_DWEIGHT] = id_dweight(l);
        op.slot[S_DBIAS] = id_dbias(l);
        if (l + 1 < L)
            op.slot[S_OUT] = id_act(L, l + 1); /* its ReLU mask */
        if (l > 0)
            op.slot[S_IN_GRAD] = id_grad(L, l);
        return op;
    }
    struct op op = blank_op(OP_LOSS, L); /* the logits against the labels */
    op.slot[S_OUT] = id_act(L, L);
    op.slot[S_LABELS] = T_LABELS;
    op.slot[S_OUT_GRAD] = id_grad(L, L);
    return op;
}

/* ---- kernels (SSE, four floats a vector; register tiles, so that the only memory accesses
 * are the tensors' own: under the platform every access to CXL memory costs emulation time) */

typedef float f4 __attribute__((vector_size(16)));
typedef int i4 __attribute__((vector_size(16)));

WL_HOT f4 load4(const float *p)
{
    f4 v;
    memcpy(&v, p, sizeof v);
    return v;
}

WL_HOT void store4(float *p, f4 v)
{
    memcpy(p, &v, sizeof v);
}

#define LANE(v, k) __builtin_shuffle((v), (i4){(k), (k), (k), (k)})

WL_HOT float hsum(f4 v)
{
    return (v[0] + v[1]) + (v[2] + v[3]);
}

/* Four outputs of a layer, through its ReLU if `relu`. */
WL_HOT void store_output(float *out, f4 y, bool relu)
{
    const f4 zero = {0};
    store4(out, relu ? (f4)((i4)y & (y > zero)) : y); /* max(y, 0), -0 and NaN to 0 */
}

/* out[b][j] = act(bias[j] + sum_k in[b][k] w[k][j]): tiles of 4 samples x 4 outputs, the
 * sum over k in order, 4 k at a time (one vector of each sample's inputs). A tile's weights
 * are a column of the matrix: the matrix is read once per 4 samples. */
__attribute__((noinline)) static void forward(const float *in, const float *w, const float *bias, float *out,
                                              uint64_t batch, uint64_t width, bool relu)
{
#define FORWARD_STEP(kk) /* (the lane a constant: one shuffle) */                                         \
    do {                                                                                                       \
        const f4 v = load4(wk + (kk) * width);                                                                 \
        a0 += LANE(x0, kk) * v, a1 += LANE(x1, kk) * v, a2 += LANE(x2, kk) * v, a3 += LANE(x3, kk) * v;        \
    } while (0)
    for (uint64_t b = 0; b < batch; b += 4) {
        const float *r0 = in + b * width, *r1 = r0 + width, *r2 = r1 + width, *r3 = r2 + width;
        for (uint64_t j = 0; j < width; j += 4) {
            f4 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (uint64_t k = 0; k < width; k += 4) {
                const f4 x0 = load4(r0 + k), x1 = load4(r1 + k), x2 = load4(r2 + k), x3 = load4(r3 + k);
                const float *wk = w + k * width + j;
                FORWARD_STEP(0);
                FORWARD_STEP(1);
                FORWARD_STEP(2);
                FORWARD_STEP(3);
            }
            const f4 c = load4(bias + j);
            float *o = out + b * width + j;
            store_output(o, a0 + c, relu);
            store_output(o + width, a1 + c, relu);
            store_output(o + 2 * width, a2 + c, relu);
            store_output(o + 3 * width, a3 + c, relu);
        }
    }
#undef FORWARD_STEP
}

/* Softmax cross-entropy of the logits against the labels: grad = (softmax - onehot) / batch;
 * returns the mean loss. */
__attribute__((noinline)) static double loss(const float *logits, const uint32_t *labels, float *grad,
                                             uint64_t batch, uint64_t width)
{
    double total = 0;
    for (uint64_t b = 0; b < batch; b++) {
        const float *z = logits + b * width;
        float *g = grad + b * width;
        float top = z[0];
        for (uint64_t j = 1; j < width; j++)
            top = z[j] > top ? z[j] : top;
        double sum = 0;
        for (uint64_t j = 0; j < width; j++) {
            g[j] = expf(z[j] - top);
            sum += g[j];
        }
        const float scale = (float)(1 / (sum * (double)batch));
        for (uint64_t j = 0; j < width; j++)
            g[j] *= scale;
        g[labels[b]] -= 1.0f / (float)batch;
        total += log(sum) - (double)(z[labels[b]] - top);
    }
    return total / (double)batch;
}

/* grad[b][j] = 0 where the layer's ReLU output act[b][j] was 0. */
__attribute__((noinline)) static void relu_mask(float *grad, const float *act, uint64_t count)
{
    const f4 zero = {0};
    for (uint64_t e = 0; e < count; e += 4)
        store4(grad + e, (f4)((i4)load4(grad + e) & (load4(act + e) > zero)));
}

/* Keep v in a register from here: the compiler would rather load a vector again than copy
 * it (SSE multiplies overwrite an operand), and every load of CXL memory costs emulation. */
#define KEEP(v) __asm__("" : "+x"(v))

/* in_grad[b][k] = sum_j grad[b][j] w[k][j]: tiles of 4 samples x 2 inputs, 4 j a vector,
 * the lanes summed at the end. A tile's weights are two rows: the matrix is read once per
 * 4 samples. */
__attribute__((noinline)) static void input_grad(const float *grad, const float *w, float *in_grad,
                                                 uint64_t batch, uint64_t width)
{
#define INPUT_GRAD_ROW(x, g, a0, a1)                                                                          \
    do {                                                                                                       \
        f4 x = load4((g) + j);                                                                                 \
        KEEP(x);                                                                                               \
        a0 += x * w0, a1 += x * w1;                                                                            \
    } while (0)
    for (uint64_t b = 0; b < batch; b += 4) {
        const float *g0 = grad + b * width, *g1 = g0 + width, *g2 = g1 + width, *g3 = g2 + width;
        for (uint64_t k = 0; k < width; k += 2) {
            const float *w0p = w + k * width, *w1p = w0p + width;
            f4 a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0};
            for (uint64_t j = 0; j < width; j += 4) {
                f4 w0 = load4(w0p + j), w1 = load4(w1p + j);
                KEEP(w0);
                KEEP(w1);
                INPUT_GRAD_ROW(x0, g0, a00, a01);
                INPUT_GRAD_ROW(x1, g1, a10, a11);
                INPUT_GRAD_ROW(x2, g2, a20, a21);
                INPUT_GRAD_ROW(x3, g3, a30, a31);
            }
            float *o = in_grad + b * width + k;
            o[0] = hsum(a00), o[1] = hsum(a01);
            o[width] = hsum(a10), o[width + 1] = hsum(a11);
            o[2 * width] = hsum(a20), o[2 * width + 1] = hsum(a21);
            o[3 * width] = hsum(a30), o[3 * width + 1] = hsum(a31);
        }
    }
#undef INPUT_GRAD_ROW
}

/* Eight gradients of a weight row: store them, and the SGD step on the weights. */
WL_HOT void sgd_tile_row(float *w, float *dw, f4 lo, f4 hi, f4 rate)
{
    store4(dw, lo);
    store4(dw + 4, hi);
    store4(w, load4(w) - rate * lo);
    store4(w + 4, load4(w + 4) - rate * hi);
}

/* dw[k][j] = sum_b in[b][k] grad[b][j] (tiles of 4 inputs x 8 outputs, the sum over b in
 * order), then the SGD step w -= lr dw on the tile; db[j] = sum_b grad[b][j], bias -= lr db. */
__attribute__((noinline)) static void weight_grad_step(const float *in, const float *grad, float *w, float *bias,
                                                       float *dw, float *db, uint64_t batch, uint64_t width,
                                                       float lr)
{
    const f4 rate = {lr, lr, lr, lr};
    for (uint64_t k = 0; k < width; k += 4) {
        for (uint64_t j = 0; j < width; j += 8) {
            f4 a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0};
            for (uint64_t b = 0; b < batch; b++) {
                const f4 x = load4(in + b * width + k);
                f4 g0 = load4(grad + b * width + j), g1 = load4(grad + b * width + j + 4);
                KEEP(g0);
                KEEP(g1);
                const f4 s0 = LANE(x, 0), s1 = LANE(x, 1), s2 = LANE(x, 2), s3 = LANE(x, 3);
                a00 += s0 * g0, a01 += s0 * g1, a10 += s1 * g0, a11 += s1 * g1;
                a20 += s2 * g0, a21 += s2 * g1, a30 += s3 * g0, a31 += s3 * g1;
            }
            const uint64_t e = k * width + j;
            sgd_tile_row(w + e, dw + e, a00, a01, rate);
            sgd_tile_row(w + e + width, dw + e + width, a10, a11, rate);
            sgd_tile_row(w + e + 2 * width, dw + e + 2 * width, a20, a21, rate);
            sgd_tile_row(w + e + 3 * width, dw + e + 3 * width, a30, a31, rate);
        }
    }
    for (uint64_t j = 0; j < width; j += 4) {
        f4 sum = {0};
        for (uint64_t b = 0; b < batch; b++)
            sum += load4(grad + b * width + j);
        store4(db + j, sum);
        store4(bias + j, load4(bias + j) - rate * sum);
    }
}

/* Run op `op`; the loss op returns the loss, the others 0. */
static double run_op(const struct model *m, const struct op *op)
{
    const struct tensor *t = m->tensor;
#define DATA(s) (op->slot[s] == NO_TENSOR ? NULL : t[op->slot[s]].data)
    const uint64_t B = m->batch, W = m->width;
    switch (op->kind) {
    case OP_FORWARD:
        forward(DATA(S_IN), DATA(S_WEIGHT), DATA(S_BIAS), DATA(S_OUT), B, W, op->layer + 1 < m->layers);
        return 0;
    case OP_LOSS: return loss(DATA(S_OUT), (const uint32_t *)DATA(S_LABELS), DATA(S_OUT_GRAD), B, W);
    case OP_BACKWARD:
        if (op->slot[S_OUT] != NO_TENSOR)
            relu_mask(DATA(S_OUT_GRAD), DATA(S_OUT), B * W);
        if (op->slot[S_IN_GRAD] != NO_TENSOR) /* with the weights before the step */
            input_grad(DATA(S_OUT_GRAD), DATA(S_WEIGHT), DATA(S_IN_GRAD), B, W);
        weight_grad_step(DATA(S_IN), DATA(S_OUT_GRAD), DATA(S_WEIGHT), DATA(S_BIAS), DATA(S_DWEIGHT),
                         DATA(S_DBIAS), B, W, m->lr);
        return 0;
    }
#undef DATA
    return 0;
}

/* ---- the model's memory ------------------------------------------------------------- */

#define MPOL_BIND 2

/* A mapping of `bytes`, its pages not yet touched (placed when touched: by the process's
 * policy, or in host DRAM, cxlssd_dram_node(), if `dram`); no transparent huge pages:
 * tensors move a 4 KiB page at a time, as the firmware's promotion tables count them. */
static char *tensor_map(uint64_t bytes, bool dram)
{
    char *p = wl_alloc(bytes);
    madvise(p, bytes, MADV_NOHUGEPAGE); /* (advice: without THP support it fails, harmlessly) */
    if (dram) {
        static int dram_node = -1; /* looked up once (sysfs): it does not change while we run */
        if (dram_node < 0)
            dram_node = cxlssd_dram_node();
        const unsigned long nodes = 1ul << dram_node;
        /* a failure (no NUMA support) leaves the pages to the process's policy: only slower */
        syscall(SYS_mbind, p, bytes, MPOL_BIND, &nodes, 8 * sizeof nodes, 0ul);
    }
    return p;
}

/* `bytes` of zeroed memory, every page touched: placed now. */
static float *tensor_alloc(uint64_t bytes, bool dram)
{
    char *p = tensor_map(bytes, dram);
    for (uint64_t at = 0; at < bytes; at += PAGE_BYTES)
        p[at] = 0;
    return (float *)p;
}

/* The NUMA node of the page at p; -1 if the kernel cannot say. */
static int node_of(const void *p)
{
    void *page = (void *)((uintptr_t)p & ~(uintptr_t)(PAGE_BYTES - 1));
    int status = -1;
    return syscall(SYS_move_pages, 0, 1ul, &page, NULL, &status, 0) == 0 ? status : -1;
}

static uint64_t page_round(uint64_t bytes)
{
    return (bytes + PAGE_BYTES - 1) / PAGE_BYTES * PAGE_BYTES;
}

/* The bytes of the model's tensors (each its own mapping of whole pages). */
static uint64_t model_bytes(uint64_t layers, uint64_t width, uint64_t batch)
{
    const uint64_t matrix = page_round(width * width * 4), vector = page_round(width * 4);
    const uint64_t act = page_round(batch * width * 4);
    return page_round(batch * 4) + layers * 2 * (matrix + vector) + (layers + 1) * act + layers * act;
}

/* Value e of generator `key`: uniform in [-a, a), 24 bits. */
static inline float uniform(uint64_t key, uint64_t e, float a)
{
    return ((float)(wl_mix64(key ^ e) >> 40) * 0x1p-23f - 1) * a;
}

static void model_init(struct model *m, const struct options *opt, bool dram)
{
    m->layers = opt->layers;
    m->width = opt->width;
    m->batch = opt->batch;
    m->lr = (float)opt->lr;
    m->ntensors = tensor_count(m->layers);
    m->nops = (unsigned)(2 * opt->layers + 1);
    const uint64_t W = m->width, B = m->batch;
    for (unsigned t = 0; t < m->ntensors; t++)
        m->tensor[t].bytes = B * W * 4; /* activations and their gradients */
    m->tensor[T_LABELS].bytes = B * 4;
    for (uint64_t l = 0; l < m->layers; l++) {
        m->tensor[id_weight(l)].bytes = m->tensor[id_dweight(l)].bytes = W * W * 4;
        m->tensor[id_bias(l)].bytes = m->tensor[id_dbias(l)].bytes = W * 4;
    }
    for (unsigned t = 0; t < m->ntensors; t++)
        m->tensor[t].data = tensor_alloc(m->tensor[t].bytes, dram);
    for (unsigned i = 0; i < m->nops; i++)
        m->op[i] = make_op(m, i);

    /* weights uniform in [-a, a), a = sqrt(6/W) (He's initialisation for ReLU), biases 0 */
    const uint64_t wkey = wl_stream(opt->common.seed, STREAM_WEIGHTS);
    const float a = sqrtf(6.0f / (float)W);
    for (uint64_t l = 0; l < m->layers; l++) {
        float *w = m->tensor[id_weight(l)].data;
        for (uint64_t e = 0; e < W * W; e += 4) { /* one store a vector */
            const uint64_t g = l * W * W + e;
            store4(w + e, (f4){uniform(wkey, g, a), uniform(wkey, g + 1, a), uniform(wkey, g + 2, a),
                               uniform(wkey, g + 3, a)});
        }
    }
    const uint64_t ikey = wl_stream(opt->common.seed, STREAM_INPUT);
    float *x = m->tensor[id_act(m->layers, 0)].data;
    for (uint64_t e = 0; e < B * W; e++)
        x[e] = uniform(ikey, e, 1.0f);
    uint64_t state = wl_stream(opt->common.seed, STREAM_LABELS);
    uint32_t *labels = (uint32_t *)m->tensor[T_LABELS].data;
    for (uint64_t b = 0; b < B; b++)
        labels[b] = (uint32_t)wl_below(&state, W);
}

/* ---- the lifetime-aware prefetch/offload helper ---------------------------------------- */

struct lifetime {
    uint64_t lookahead, budget, nops;
    bool async, hints;
    uint64_t uses[MAX_TENSORS]; /* the ops of an iteration that use the tensor (bit i: op i), profiled */
    bool resident[MAX_TENSORS]; /* promoted: in host DRAM, counted against the budget */
    bool moved[MAX_TENSORS];    /* ... and its promotion moved pages: its demotion moves them back */
    uint64_t resident_bytes, peak_bytes;
    uint64_t bytes_promoted, bytes_demoted; /* what moved: pages already in place are not counted */
    uint64_t promotions, demotions, evictions, skipped, failures;
    uint64_t ticket_seq;                /* async: transfers issued */
    uint64_t ticket[MAX_TENSORS];       /* ... a tensor's promotion in flight (0: none) */
    uint64_t waits, hints_need, hints_dead; /* transfers waited for; hint calls */
    /* --scratch: one host-DRAM buffer for the short-lived tensors of the op running now */
    char *scratch;                 /* in host DRAM, sized for the op with the most; NULL: no scratch */
    uint64_t scratch_bytes;        /* its size */
    uint64_t scratch_booked;       /* what the running op uses of it, on the books (0: none) */
    float *home[MAX_TENSORS];      /* a short-lived tensor's own buffer, where the process put it */
    bool in_scratch[MAX_TENSORS];  /* the running op uses the scratch for this tensor */
    uint64_t scratch_ops, scratch_fallbacks; /* ops run with the scratch; without, for lack of room */
};

static void lifetime_record(struct lifetime *lt, const struct op *op, unsigned i)
{
    for (unsigned s = 0; s < SLOTS; s++)
        if (op->slot[s] != NO_TENSOR)
            lt->uses[op->slot[s]] |= 1ull << i;
}

/* A tensor whose value is dead after its last use in an iteration (the next iteration
 * writes it before reading it): the activations the layers write, all the gradients. */
static bool transient(const struct model *m, unsigned t)
{
    if (t >= id_act(m->layers, 1)) /* the activations the layers write, their gradients */
        return true;
    return t >= T_FIRST_LAYER && t < id_weight(m->layers) && (t - T_FIRST_LAYER) % PER_LAYER >= 2; /* dW, db */
}

/* Used by one op and dead after it (the weight and bias gradients): the scratch's tensors. */
static bool short_lived(const struct lifetime *lt, const struct model *m, unsigned t)
{
    return __builtin_popcountll(lt->uses[t]) == 1 && transient(m, t);
}

static bool movable(const struct lifetime *lt, const struct model *m, unsigned t)
{
    return (unsigned)__builtin_popcountll(lt->uses[t]) >= MIN_USES && page_round(m->tensor[t].bytes) <= lt->budget;
}

/* The op (at or after op i; in the next iteration: nops + its first op) that uses t next. */
static uint64_t next_use(const struct lifetime *lt, unsigned t, unsigned i)
{
    const uint64_t later = lt->uses[t] & ~((1ull << i) - 1);
    return later ? (uint64_t)__builtin_ctzll(later) : lt->nops + (uint64_t)__builtin_ctzll(lt->uses[t]);
}

/* Count `bytes` more of host DRAM against the budget. */
static void book(struct lifetime *lt, uint64_t bytes)
{
    lt->resident_bytes += bytes;
    lt->peak_bytes = lt->resident_bytes > lt->peak_bytes ? lt->resident_bytes : lt->peak_bytes;
}

static void promote(struct lifetime *lt, const struct model *m, unsigned t)
{
    const long pages = lt->async ? cxlssd_promote_async(m->tensor[t].data, m->tensor[t].bytes, ++lt->ticket_seq)
                                 : cxlssd_promote(m->tensor[t].data, m->tensor[t].bytes);
    if (pages < 0) { /* not a cxlssd guest (on the host: no CXL region) */
        lt->failures++;
        return;
    }
    lt->promotions++;
    lt->ticket[t] = lt->async ? lt->ticket_seq : 0;
    lt->bytes_promoted += (uint64_t)pages * PAGE_BYTES;
    lt->resident[t] = true;
    lt->moved[t] = pages > 0;
    book(lt, page_round(m->tensor[t].bytes));
}

/* Take t off the books; move it back to the CXL node if its promotion moved it there from
 * (a tensor that was in DRAM already, as under dram-only, stays in DRAM). */
static void demote(struct lifetime *lt, const struct model *m, unsigned t)
{
    const long pages = !lt->moved[t] ? 0
                       : lt->async ? cxlssd_demote_async(m->tensor[t].data, m->tensor[t].bytes, ++lt->ticket_seq)
                                   : cxlssd_demote(m->tensor[t].data, m->tensor[t].bytes);
    if (pages < 0)
        lt->failures++; /* (then it stays in DRAM, out of the books: nothing better to do) */
    else {
        lt->demotions++;
        lt->bytes_demoted += (uint64_t)pages * PAGE_BYTES;
    }
    lt->resident[t] = false;
    lt->ticket[t] = 0; /* (the engine moves it back after the promotion, in order) */
    lt->resident_bytes -= page_round(m->tensor[t].bytes);
}

/* Make room for `need` bytes needed at op `when` (before op i) within the budget by demoting
 * promoted tensors needed later, furthest first; false (nothing demoted) if that cannot make
 * enough room. */
static bool make_room(struct lifetime *lt, const struct model *m, uint64_t need, uint64_t when, unsigned i)
{
    uint64_t freeable = 0;
    for (unsigned r = 0; r < m->ntensors; r++)
        if (lt->resident[r] && next_use(lt, r, i) > when)
            freeable += page_round(m->tensor[r].bytes);
    if (lt->resident_bytes + need > lt->budget + freeable)
        return false;
    while (lt->resident_bytes + need > lt->budget) {
        unsigned victim = 0;
        uint64_t furthest = 0;
        for (unsigned r = 0; r < m->ntensors; r++)
            if (lt->resident[r] && next_use(lt, r, i) > furthest) {
                furthest = next_use(lt, r, i);
                victim = r;
            }
        demote(lt, m, victim);
        lt->evictions++;
    }
    return true;
}

/* The scratch bytes op i needs: its short-lived tensors'. */
static uint64_t op_scratch_bytes(const struct lifetime *lt, const struct model *m, unsigned i)
{
    uint64_t bytes = 0;
    for (unsigned s = 0; s < SLOTS; s++) {
        const uint32_t t = m->op[i].slot[s];
        if (t != NO_TENSOR && short_lived(lt, m, t))
            bytes += page_round(m->tensor[t].bytes);
    }
    return bytes;
}

/* After profiling: the scratch buffer, mapped in host DRAM and not touched (its pages exist only
 * while an op uses them). Not when the short-lived tensors are in DRAM already (dram-only:
 * nothing to gain, and the ideal stays the plain run) or when no op's fit the budget. */
static void scratch_init(struct lifetime *lt, const struct model *m)
{
    uint64_t most = 0;
    unsigned sample = NO_TENSOR;
    for (unsigned i = 0; i < m->nops; i++) {
        const uint64_t bytes = op_scratch_bytes(lt, m, i);
        most = bytes > most ? bytes : most;
    }
    for (unsigned t = 0; t < m->ntensors; t++)
        if (short_lived(lt, m, t)) {
            lt->home[t] = m->tensor[t].data;
            sample = t;
        }
    const int cxl_node = cxlssd_cxl_node();
    if (most == 0 || most > lt->budget || cxl_node < 0 || node_of(m->tensor[sample].data) != cxl_node)
        return;
    lt->scratch = tensor_map(most, true);
    lt->scratch_bytes = most;
}

/* Before op i, once op i's own tensors are promoted: book the scratch for its short-lived
 * tensors, making room as for a tensor needed now; without room they stay where they live for
 * this op (a tensor the op reads again and again is worth more of the budget than one it
 * writes once). */
static void scratch_before(struct lifetime *lt, struct model *m, unsigned i)
{
    const uint64_t need = lt->scratch == NULL ? 0 : op_scratch_bytes(lt, m, i);
    if (need == 0)
        return;
    if (!make_room(lt, m, need, i, i)) {
        lt->scratch_fallbacks++;
        return;
    }
    uint64_t at = 0;
    for (unsigned s = 0; s < SLOTS; s++) {
        const uint32_t t = m->op[i].slot[s];
        if (t != NO_TENSOR && short_lived(lt, m, t)) {
            m->tensor[t].data = (float *)(lt->scratch + at);
            lt->in_scratch[t] = true;
            at += page_round(m->tensor[t].bytes);
        }
    }
    book(lt, need);
    lt->scratch_booked = need;
    lt->scratch_ops++;
}

/* After the op: its short-lived tensors are dead, so the scratch's pages are freed (the next
 * op's first touches get zeroed pages in host DRAM) and the tensors point home again. */
static void scratch_after(struct lifetime *lt, struct model *m)
{
    if (lt->scratch_booked == 0)
        return;
    madvise(lt->scratch, lt->scratch_booked, MADV_DONTNEED);
    for (unsigned t = 0; t < m->ntensors; t++)
        if (lt->in_scratch[t]) {
            m->tensor[t].data = lt->home[t];
            lt->in_scratch[t] = false;
        }
    lt->resident_bytes -= lt->scratch_booked;
    lt->scratch_booked = 0;
}

/* Before op i: promote the movable tensors used within the next `lookahead` ops, the one
 * needed first first, and the scratch for op i after op i's own. */
static void lifetime_before(struct lifetime *lt, struct model *m, unsigned i)
{
    const uint64_t end = i + lt->lookahead < lt->nops ? i + lt->lookahead : lt->nops;
    const uint64_t window = ((1ull << end) - 1) & ~((1ull << i) - 1);
    unsigned wanted[MAX_TENSORS], n = 0;
    for (unsigned t = 0; t < m->ntensors; t++)
        if (!lt->resident[t] && (lt->uses[t] & window) && movable(lt, m, t)) {
            unsigned at = n++; /* insertion sort by next use: a handful of tensors */
            for (; at > 0 && next_use(lt, wanted[at - 1], i) > next_use(lt, t, i); at--)
                wanted[at] = wanted[at - 1];
            wanted[at] = t;
        }
    bool scratch_done = false;
    for (unsigned k = 0; k < n; k++) {
        const uint64_t when = next_use(lt, wanted[k], i);
        if (when > i && !scratch_done) {
            scratch_before(lt, m, i);
            scratch_done = true;
        }
        if (make_room(lt, m, page_round(m->tensor[wanted[k]].bytes), when, i))
            promote(lt, m, wanted[k]);
        else
            lt->skipped++;
    }
    if (!scratch_done)
        scratch_before(lt, m, i);
    if (!lt->hints)
        return;
    /* the tensors on the device that op i + A uses (moved or used in place): into SSD DRAM;
     * not the short-lived ones when there is a scratch (written first, most likely there) */
    const unsigned ahead = (unsigned)((i + lt->lookahead) % lt->nops);
    for (unsigned t = 0; t < m->ntensors; t++)
        if (!lt->resident[t] && (lt->uses[t] >> ahead & 1) && !(lt->scratch && short_lived(lt, m, t)) &&
            cxlssd_hint(CXLSSD_HINT_NEED, ahead, m->tensor[t].data, m->tensor[t].bytes) >= 0)
            lt->hints_need++;
}

/* Before op i runs: wait for the transfers of its tensors still in flight. */
static void lifetime_wait(struct lifetime *lt, const struct op *op)
{
    for (unsigned s = 0; s < SLOTS; s++) {
        const uint32_t t = op->slot[s];
        if (t != NO_TENSOR && lt->ticket[t] != 0) {
            cxlssd_transfer_wait(lt->ticket[t]);
            lt->ticket[t] = 0;
            lt->waits++;
        }
    }
}

/* After op i: demote the promoted tensors whose last use in the iteration was op i, except
 * those that the next iteration's first prefetches would bring back at once; free the
 * scratch. */
static void lifetime_after(struct lifetime *lt, struct model *m, unsigned i)
{
    for (unsigned t = 0; t < m->ntensors; t++)
        if (lt->resident[t] && (lt->uses[t] >> i) == 1 && next_use(lt, t, i + 1) >= i + 1 + lt->lookahead)
            demote(lt, m, t);
    for (unsigned t = 0; lt->hints && t < m->ntensors; t++)
        if (!lt->resident[t] && !lt->in_scratch[t] && (lt->uses[t] >> i) == 1 && transient(m, t) &&
            cxlssd_hint(CXLSSD_HINT_DEAD, i, m->tensor[t].data, m->tensor[t].bytes) >= 0)
            lt->hints_dead++;
    scratch_after(lt, m);
}

/* The static split (ZeRO-Offload's kind: a fixed placement chosen once): the movable
 * tensors with the most uses per byte are promoted, densest first, while they fit the
 * budget, and stay in DRAM; the rest stay on the device. */
static void static_split(struct lifetime *lt, const struct model *m)
{
    bool chosen[MAX_TENSORS] = {false};
    for (;;) {
        unsigned best = NO_TENSOR;
        for (unsigned t = 0; t < m->ntensors; t++) {
            const uint64_t bytes = page_round(m->tensor[t].bytes);
            if (chosen[t] || !movable(lt, m, t) || lt->resident_bytes + bytes > lt->budget)
                continue;
            /* uses(t) / bytes(t) > uses(best) / bytes(best), in integers */
            if (best == NO_TENSOR || (uint64_t)__builtin_popcountll(lt->uses[t]) * page_round(m->tensor[best].bytes) >
                                         (uint64_t)__builtin_popcountll(lt->uses[best]) * bytes)
                best = t;
        }
        if (best == NO_TENSOR)
            return;
        chosen[best] = true;
        promote(lt, m, best);
    }
}

/* One training iteration: every op in order; `record` the uses, or `place` the tensors. */
static double iteration(struct model *m, struct lifetime *lt, bool record, bool place)
{
    double loss_value = 0;
    for (unsigned i = 0; i < m->nops; i++) {
        const struct op *op = &m->op[i];
        if (record)
            lifetime_record(lt, op, i);
        if (place) {
            lifetime_before(lt, m, i);
            lifetime_wait(lt, op);
        }
        const double value = run_op(m, op);
        if (op->kind == OP_LOSS)
            loss_value = value;
        if (place)
            lifetime_after(lt, m, i);
    }
    return loss_value;
}

/* ---- the run --------------------------------------------------------------------------- */

static struct options parse_options(int argc, char **argv)
{
    struct options opt = {.layers = DEFAULT_LAYERS, .width = DEFAULT_WIDTH, .batch = DEFAULT_BATCH,
                          .iterations = DEFAULT_ITERATIONS, .profile = DEFAULT_PROFILE,
                          .lookahead = DEFAULT_LOOKAHEAD, .budget = DEFAULT_BUDGET, .policy = POLICY_NONE,
                          .transfer = TRANSFER_SYNC, .hints = 0, .scratch = 1,
                          .lr = DEFAULT_LR, .common = WL_COMMON_DEFAULTS};
    struct wl_option options[] = {
        WL_SIZED("width", &opt.width, 16, MAX_WIDTH),
        WL_COUNT("layers", &opt.layers, 1, MAX_LAYERS),
        WL_COUNT("batch", &opt.batch, 4, MAX_BATCH),
        WL_COUNT("iterations", &opt.iterations, 1, 1u << 20),
        WL_COUNT("profile-iterations", &opt.profile, 1, 1u << 20),
        WL_CHOICE("policy", &opt.policy, POLICIES),
        WL_COUNT("lookahead", &opt.lookahead, 1, MAX_OPS),
        WL_SIZE("dram-budget", &opt.budget, 0, 1ull << 40),
        WL_CHOICE("transfer", &opt.transfer, TRANSFERS),
        WL_CHOICE("hints", &opt.hints, SWITCHES),
        WL_CHOICE("scratch", &opt.scratch, SWITCHES),
        WL_REAL("lr", &opt.lr, 0, 10),
        WL_END,
    };
    wl_parse(argc, argv, options, &opt.common);
    if (opt.common.footprint != 0) { /* the largest width that fits */
        if (model_bytes(opt.layers, 16, opt.batch) > opt.common.footprint)
            wl_usage_error("--footprint %" PRIu64 " is too small: %" PRIu64 " layers of width 16 take %" PRIu64
                           " bytes", opt.common.footprint, opt.layers, model_bytes(opt.layers, 16, opt.batch));
        opt.width = 16;
        while (opt.width + 16 <= MAX_WIDTH &&
               model_bytes(opt.layers, opt.width + 16, opt.batch) <= opt.common.footprint)
            opt.width += 16;
    }
    if (opt.width % 16 != 0)
        wl_usage_error("--width %" PRIu64 ": must be a multiple of 16", opt.width);
    if (opt.batch % 4 != 0)
        wl_usage_error("--batch %" PRIu64 ": must be a multiple of 4", opt.batch);
    return opt;
}

/* A digest of a tensor's bits: position-dependent, exact. */
static uint64_t digest(const float *data, uint64_t count)
{
    uint64_t sum = 0;
    for (uint64_t e = 0; e < count; e++)
        sum += wl_float_bits(data[e]) * (2 * e + 1);
    return sum;
}

int main(int argc, char **argv)
{
    wl_start("offload", USAGE);
    const struct options opt = parse_options(argc, argv);
    static struct model run, ref;
    static struct lifetime lt;
    model_init(&run, &opt, false);
    lt.lookahead = opt.lookahead;
    lt.budget = opt.budget;
    lt.nops = run.nops;
    lt.async = opt.transfer == TRANSFER_ASYNC;
    lt.hints = opt.hints != 0;
    const uint64_t total = opt.profile + opt.iterations;
    double *losses = (double *)wl_alloc(total * sizeof *losses);
    uint64_t *iteration_ns = (uint64_t *)wl_alloc(opt.iterations * sizeof *iteration_ns);

    for (uint64_t it = 0; it < opt.profile; it++)
        losses[it] = iteration(&run, &lt, true, false);
    if (opt.policy == POLICY_STATIC)
        static_split(&lt, &run); /* synchronous, before the ROI: the split is fixed */
    if (opt.policy == POLICY_LIFETIME && opt.scratch)
        scratch_init(&lt, &run);
    wl_roi_begin(&opt.common);
    bool timed = true;
    for (uint64_t it = 0; it < opt.iterations; it++) {
        const uint64_t begin_ns = cxlssd_clock_ns();
        losses[opt.profile + it] = iteration(&run, &lt, false, opt.policy == POLICY_LIFETIME);
        const uint64_t end_ns = cxlssd_clock_ns();
        timed &= begin_ns != 0 && end_ns > begin_ns;
        iteration_ns[it] = end_ns - begin_ns;
    }
    wl_roi_end(&opt.common, run.tensor[id_weight(0)].data, sizeof(float));

    /* the reference: the same iterations on fresh tensors in DRAM, no moves */
    model_init(&ref, &opt, true);
    bool ok = true;
    uint64_t checksum = 0, mismatched_tensors = 0;
    for (uint64_t it = 0; it < total; it++) {
        const double value = iteration(&ref, NULL, false, false);
        ok &= wl_double_bits(value) == wl_double_bits(losses[it]) && isfinite(value);
        checksum = wl_hash(checksum, wl_double_bits(value));
    }
    ok &= losses[total - 1] < losses[0];
    for (uint64_t l = 0; l < opt.layers; l++)
        for (unsigned t = id_weight(l); t <= id_bias(l); t++) {
            mismatched_tensors += memcmp(run.tensor[t].data, ref.tensor[t].data, run.tensor[t].bytes) != 0;
            checksum = wl_hash(checksum, digest(ref.tensor[t].data, ref.tensor[t].bytes / sizeof(float)));
        }
    ok &= mismatched_tensors == 0;

    uint64_t movable_tensors = 0, movable_bytes = 0;
    for (unsigned t = 0; t < run.ntensors; t++)
        if (movable(&lt, &run, t)) {
            movable_tensors++;
            movable_bytes += page_round(run.tensor[t].bytes);
        }
    double sum_ns = 0, min_ns = INFINITY, max_ns = 0;
    for (uint64_t it = 0; it < opt.iterations; it++) {
        sum_ns += (double)iteration_ns[it];
        min_ns = fmin(min_ns, (double)iteration_ns[it]);
        max_ns = fmax(max_ns, (double)iteration_ns[it]);
    }

    struct wl_json j = wl_report_begin();
    wl_json_u64(&j, "layers", opt.layers);
    wl_json_u64(&j, "width", opt.width);
    wl_json_u64(&j, "batch", opt.batch);
    wl_json_u64(&j, "iterations", opt.iterations);
    wl_json_u64(&j, "profile_iterations", opt.profile);
    wl_json_str(&j, "policy", POLICIES[opt.policy]);
    wl_json_u64(&j, "lookahead", opt.lookahead);
    wl_json_u64(&j, "dram_budget", opt.budget);
    wl_json_str(&j, "transfer", TRANSFERS[opt.transfer]);
    wl_json_str(&j, "hints", SWITCHES[opt.hints]);
    wl_json_str(&j, "scratch", SWITCHES[opt.scratch]);
    wl_json_real(&j, "lr", opt.lr);
    wl_report_data(&j, &opt.common);
    wl_json_u64(&j, "tensors", run.ntensors);
    wl_json_u64(&j, "tensor_bytes", model_bytes(opt.layers, opt.width, opt.batch));
    wl_json_u64(&j, "ops", run.nops);
    wl_json_u64(&j, "movable_tensors", movable_tensors);
    wl_json_u64(&j, "movable_bytes", movable_bytes);
    wl_json_real(&j, "iteration_ns_mean", timed ? sum_ns / (double)opt.iterations : NAN);
    wl_json_real(&j, "iteration_ns_min", timed ? min_ns : NAN);
    wl_json_real(&j, "iteration_ns_max", timed ? max_ns : NAN);
    wl_json_u64(&j, "bytes_promoted", lt.bytes_promoted);
    wl_json_u64(&j, "bytes_demoted", lt.bytes_demoted);
    wl_json_u64(&j, "promotions", lt.promotions);
    wl_json_u64(&j, "demotions", lt.demotions);
    wl_json_u64(&j, "evictions", lt.evictions);
    wl_json_u64(&j, "prefetches_skipped", lt.skipped);
    wl_json_u64(&j, "placement_failures", lt.failures);
    wl_json_u64(&j, "peak_promoted_bytes", lt.peak_bytes);
    wl_json_u64(&j, "transfers", lt.ticket_seq);
    wl_json_u64(&j, "transfer_waits", lt.waits);
    wl_json_u64(&j, "hints_need", lt.hints_need);
    wl_json_u64(&j, "hints_dead", lt.hints_dead);
    wl_json_u64(&j, "scratch_bytes", lt.scratch_bytes);
    wl_json_u64(&j, "scratch_ops", lt.scratch_ops);
    wl_json_u64(&j, "scratch_fallbacks", lt.scratch_fallbacks);
    wl_json_real(&j, "loss_first", losses[0]);
    wl_json_real(&j, "loss_last", losses[total - 1]);
    wl_json_u64(&j, "mismatched_tensors", mismatched_tensors);
    return wl_report_end(&j, ok, checksum);
}
