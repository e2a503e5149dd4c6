/* finite.c — the load-time check that every floating-point weight of a
 * checkpoint is finite (see clef_checkpoint_check_finite in checkpoint.h).
 *
 * A NaN or Inf weight loads fine and then fails (or silently poisons) every
 * decision far from its cause; checked once here, it is refused at load with
 * the tensor's name.  Every tensor of the catalog of a floating dtype is
 * read once, split into chunks of CHUNK_BYTES scanned in parallel (OpenMP):
 * the scan is a bit test per element, so it runs at memory (or disk)
 * bandwidth.  The first bad element in file order is reported, whatever the
 * thread count.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "io/checkpoint.h"
#include "util/buf.h"

#define CHUNK_BYTES ((size_t)4 << 20)
#define BLOCK 4096 /* elements tested branch-free before looking for the index */

/* Exponent-all-ones test of each dtype: mask, and the mantissa bits that
 * tell NaN (any set) from Inf (none).  E4M3 has no Inf: S.1111.111 is its
 * only NaN. */
typedef struct fcheck {
    size_t esize;
    uint32_t mask, mant;
} fcheck;

static int dtype_check(clef_dtype dt, fcheck *c) {
    switch (dt) {
    case CLEF_DT_BF16: *c = (fcheck){2, 0x7f80u, 0x007fu}; return 1;
    case CLEF_DT_F16: *c = (fcheck){2, 0x7c00u, 0x03ffu}; return 1;
    case CLEF_DT_F32: *c = (fcheck){4, 0x7f800000u, 0x007fffffu}; return 1;
    case CLEF_DT_F8_E4M3: *c = (fcheck){1, 0x7fu, 0x7fu}; return 1;
    default: return 0; /* integers and packed nibbles are always finite */
    }
}

static inline uint32_t load_le(const unsigned char *p, size_t esize) {
    if (esize == 1) return p[0];
    if (esize == 2) {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Replicate the `esize`-byte lane value v over a 64-bit word. */
static uint64_t lanes(uint32_t v, size_t esize) {
    uint64_t w = 0;
    for (size_t i = 0; i < 8 / esize; i++) w |= (uint64_t)v << (8 * esize * i);
    return w;
}

/* Index of the first element of p[0..n) whose exponent bits are all ones, or
 * SIZE_MAX.  Eight bytes at a time: in each lane, (x & mask) + lowest mask bit
 * carries into the lane's top bit exactly when every mask bit is set (the
 * top bit is the sign, outside the mask, so no carry leaves the lane); a
 * block of BLOCK elements is tested that way and searched element by
 * element only when it holds a bad one. */
static size_t first_bad(const unsigned char *p, size_t n, const fcheck *c) {
    const size_t es = c->esize, per = 8 / es;
    const uint64_t M = lanes(c->mask, es), A = lanes(c->mask & (~c->mask + 1), es),
                   H = lanes(1u << (8 * es - 1), es);
    for (size_t b = 0; b < n; b += BLOCK) {
        size_t e = n - b < BLOCK ? n : b + BLOCK, words = (e - b) / per;
        const unsigned char *q = p + b * es;
        uint64_t acc = 0;
        for (size_t i = 0; i < words; i++) {
            uint64_t w;
            memcpy(&w, q + 8 * i, 8);
            acc |= ((w & M) + A) & H;
        }
        for (size_t i = b + words * per; i < e; i++) acc |= (load_le(p + i * es, es) & c->mask) == c->mask;
        if (!acc) continue;
        for (size_t i = b; i < e; i++)
            if ((load_le(p + i * es, es) & c->mask) == c->mask) return i;
    }
    return SIZE_MAX;
}

typedef struct chunk {
    const st_tensor *t;
    size_t first, count; /* elements */
} chunk;

/* Catalog entries in file order: shard, then offset in the shard's map. */
typedef struct tref {
    const st_tensor *t;
    size_t shard;
} tref;

static int tref_cmp(const void *a, const void *b) {
    const tref *x = a, *y = b;
    if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
    uintptr_t px = (uintptr_t)x->t->data, py = (uintptr_t)y->t->data;
    return px < py ? -1 : px > py;
}

static size_t shard_index(const clef_checkpoint *ck, const st_tensor *t) {
    for (size_t s = 0; s < ck->n_shards; s++)
        if (t >= ck->shards[s].tensors && t < ck->shards[s].tensors + ck->shards[s].n) return s;
    return ck->n_shards;
}

static int is_tower(const char *name) {
    return strncmp(name, "thinker.visual.", 15) == 0 || strncmp(name, "thinker.audio_tower.", 20) == 0;
}

int clef_checkpoint_check_finite(const clef_checkpoint *ck, int skip_towers, int n_threads, size_t *checked_bytes,
                                 clef_err *err) {
    tref *refs = clef_xcalloc(ck->n_tensors ? ck->n_tensors : 1, sizeof *refs);
    size_t n_refs = 0, n_chunks = 0, bytes = 0;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const st_tensor *t = ck->catalog[i];
        fcheck c = {0};
        if (!dtype_check(t->dtype, &c) || t->numel == 0 || (skip_towers && is_tower(t->name))) continue;
        refs[n_refs++] = (tref){t, shard_index(ck, t)};
        n_chunks += (t->nbytes + CHUNK_BYTES - 1) / CHUNK_BYTES;
        bytes += t->nbytes;
    }
    qsort(refs, n_refs, sizeof *refs, tref_cmp);
    chunk *chunks = clef_xcalloc(n_chunks ? n_chunks : 1, sizeof *chunks);
    size_t k = 0;
    for (size_t i = 0; i < n_refs; i++) {
        const st_tensor *t = refs[i].t;
        size_t per = CHUNK_BYTES / clef_dtype_size(t->dtype);
        for (size_t f = 0; f < t->numel; f += per)
            chunks[k++] = (chunk){t, f, t->numel - f < per ? t->numel - f : per};
    }
    size_t *bad = clef_xmalloc((n_chunks ? n_chunks : 1) * sizeof *bad);
    atomic_size_t first = SIZE_MAX; /* lowest chunk with a bad element found so far */
#ifdef _OPENMP
    int threads = n_threads > 0 ? n_threads : omp_get_max_threads();
    /* the scan is bound by memory: more threads than processors buy nothing, and a thread count the
     * backend will refuse (OMP_NUM_THREADS=100000) must not start 100,000 threads here first */
    if (threads > omp_get_num_procs()) threads = omp_get_num_procs();
    if (threads < 1) threads = 1;
#else
    int threads = 1; /* a build without OpenMP (the fuzz targets) scans on one thread */
    (void)n_threads;
#endif
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (size_t c = 0; c < n_chunks; c++) {
        bad[c] = SIZE_MAX;
        if (c > atomic_load_explicit(&first, memory_order_relaxed)) continue; /* an earlier one is already bad */
        fcheck fc = {0};
        dtype_check(chunks[c].t->dtype, &fc);
        const unsigned char *p = (const unsigned char *)chunks[c].t->data + chunks[c].first * fc.esize;
        size_t i = first_bad(p, chunks[c].count, &fc);
        if (i == SIZE_MAX) continue;
        bad[c] = chunks[c].first + i;
        size_t cur = atomic_load(&first);
        while (c < cur && !atomic_compare_exchange_weak(&first, &cur, c)) {
        }
    }
    size_t c = atomic_load(&first);
    int rc = 0;
    if (c != SIZE_MAX) {
        const st_tensor *t = chunks[c].t;
        fcheck fc = {0};
        dtype_check(t->dtype, &fc);
        uint32_t v = load_le((const unsigned char *)t->data + bad[c] * fc.esize, fc.esize);
        const char *what = (v & fc.mant) ? "NaN" : (v >> (8 * fc.esize - 1)) ? "-Inf" : "+Inf";
        size_t s = shard_index(ck, t);
        const char *path = s < ck->n_shards ? ck->shards[s].path : "checkpoint";
        const char *slash = strrchr(path, '/');
        rc = clef_fail_file(err, slash ? slash + 1 : path, "tensor '%s' holds a non-finite value (%s) at element %zu",
                            t->name, what, bad[c]);
    }
    if (checked_bytes) *checked_bytes = bytes;
    free(bad);
    free(chunks);
    free(refs);
    return rc;
}
