/* qsynth.c — in-memory safetensors shards and quantized synthetic
 * checkpoints (see qsynth.h; the converter itself is quant/convert.c). */
#include "quant/qsynth.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "quant/convert.h"
#include "util/buf.h"

#define MEM_ALIGN 64

struct clef_mem_shard {
    st_file f;       /* tensors in declaration order, data into f.map */
    size_t *sorted;  /* [f.n] tensor indices sorted by name */
    size_t declared; /* data bytes declared */
    size_t put;      /* data bytes put so far */
};

static const clef_mem_shard *sort_ctx;

static int by_name(const void *a, const void *b) {
    return strcmp(sort_ctx->f.tensors[*(const size_t *)a].name, sort_ctx->f.tensors[*(const size_t *)b].name);
}

clef_mem_shard *clef_mem_shard_create(const char *path, const st_wtensor *tensors, size_t n, clef_err *err) {
    size_t size = 0;
    for (size_t i = 0; i < n; i++) {
        size_t numel = 1;
        for (int d = 0; d < tensors[i].ndim; d++) numel *= (size_t)tensors[i].shape[d];
        size = (size + MEM_ALIGN - 1) / MEM_ALIGN * MEM_ALIGN + numel * clef_dtype_size(tensors[i].dtype);
    }
    void *map = mmap(NULL, size ? size : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) {
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s: cannot allocate %zu bytes for quantized weights: %s", path,
                  size, strerror(errno));
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    madvise(map, size ? size : 1, MADV_HUGEPAGE); /* fewer page faults while filling; advisory only */
#endif
    clef_mem_shard *m = clef_xcalloc(1, sizeof *m);
    m->f.path = clef_xstrndup(path, strlen(path));
    m->f.map = map;
    m->f.size = size ? size : 1;
    m->f.tensors = clef_xcalloc(n + 1, sizeof *m->f.tensors);
    m->sorted = clef_xcalloc(n + 1, sizeof *m->sorted);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        st_tensor *t = &m->f.tensors[m->f.n++];
        off = (off + MEM_ALIGN - 1) / MEM_ALIGN * MEM_ALIGN;
        t->name = clef_xstrndup(tensors[i].name, strlen(tensors[i].name));
        t->dtype = tensors[i].dtype;
        t->ndim = tensors[i].ndim;
        t->numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            t->shape[d] = tensors[i].shape[d];
            t->numel *= (size_t)t->shape[d];
        }
        t->nbytes = t->numel * clef_dtype_size(t->dtype);
        t->data = (char *)map + off;
        off += t->nbytes;
        m->declared += t->nbytes;
        m->sorted[i] = i;
    }
    sort_ctx = m; /* qsort has no context argument; creation is not concurrent in clef */
    qsort(m->sorted, n, sizeof *m->sorted, by_name);
    sort_ctx = NULL;
    for (size_t i = 1; i < n; i++)
        if (!strcmp(m->f.tensors[m->sorted[i - 1]].name, m->f.tensors[m->sorted[i]].name)) {
            clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s: tensor '%s' declared twice", path,
                      m->f.tensors[m->sorted[i]].name);
            clef_mem_shard_abort(m);
            return NULL;
        }
    return m;
}

int clef_mem_shard_put(clef_mem_shard *m, const char *name, size_t off, const void *data, size_t len,
                       clef_err *err) {
    size_t lo = 0, hi = m->f.n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(m->f.tensors[m->sorted[mid]].name, name);
        if (c == 0) {
            st_tensor *t = &m->f.tensors[m->sorted[mid]];
            if (off > t->nbytes || len > t->nbytes - off)
                return clef_fail(err, 500, CLEF_E_INTERNAL, NULL,
                                 "%s: tensor '%s': bytes [%zu,%zu) are past its %zu bytes", m->f.path, name, off,
                                 off + len, t->nbytes);
            memcpy((char *)(uintptr_t)t->data + off, data, len);
            m->put += len;
            return 0;
        }
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s: tensor '%s' was not declared", m->f.path, name);
}

int clef_mem_shard_finish(clef_mem_shard *m, st_file *out, clef_err *err) {
    memset(out, 0, sizeof *out);
    if (m->put != m->declared) {
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s: %zu of %zu data bytes were written", m->f.path, m->put,
                  m->declared);
        clef_mem_shard_abort(m);
        return -1;
    }
    *out = m->f;
    free(m->sorted);
    free(m);
    return 0;
}

void clef_mem_shard_abort(clef_mem_shard *m) {
    if (!m) return;
    st_close(&m->f);
    free(m->sorted);
    free(m);
}

size_t clef_peak_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) {
            kb = (size_t)strtoull(line + 6, NULL, 10);
            break;
        }
    if (f) fclose(f);
    if (kb == 0) {
        struct rusage ru;
        if (getrusage(RUSAGE_SELF, &ru) == 0) kb = (size_t)ru.ru_maxrss;
    }
    return kb * 1024u;
}

int clef_qsynth_checkpoint(const char *preset, uint64_t seed, const char *format, FILE *progress,
                           clef_checkpoint *ck, clef_err *err) {
    memset(ck, 0, sizeof *ck);
    clef_quant_format f;
    if (clef_quant_format_parse(format, &f) != 0)
        return clef_fail(err, 500, CLEF_E_INTERNAL, "quant",
                         "unknown quantized format '%s' (int4, fp8-block, nvfp4 or nvfp4-modelopt)",
                         format ? format : "(none)");
    clef_quantize_options o = {.synthetic = preset, .seed = seed, .memory = ck, .format = f,
                               .progress = progress != NULL};
    clef_quantize_report rep;
    if (clef_quantize_checkpoint(&o, &rep, err) != 0) return -1;
    if (progress) {
        fprintf(progress,
                "clef: synthetic %s seed %llu quantized to %s in memory: %zu expert matrices, %.2f GiB -> %.2f GiB, "
                "relative L2 error %.2f%%, %.1f s, peak RSS %.2f GiB\n",
                preset, (unsigned long long)seed, clef_quant_format_name(f), rep.quantized,
                (double)rep.bytes_in / (1 << 30), (double)rep.bytes_out / (1 << 30), 100.0 * rep.mean_rel_l2,
                rep.seconds, (double)rep.peak_rss_bytes / (1 << 30));
        fflush(progress);
    }
    return 0;
}
