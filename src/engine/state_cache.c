/* state_cache.c — blocks of cached prefix rows, chained by parent, LRU (see state_cache.h). */
#include "engine/state_cache.h"

#include <ctype.h>
#include <errno.h>
#include <strings.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "util/buf.h"

#define B CLEF_KV_BLOCK

typedef struct sc_block {
    struct sc_block *parent;  /* NULL: a record's first block */
    uint8_t digest[32];       /* first block: the media digest (zero without media) */
    uint64_t hash;
    int32_t ids[B];
    int32_t *pos;             /* [3][B] positions, or NULL (text: implied by the chain) */
    float *data;              /* clef_kv_block_floats f32 of backend memory */
    size_t n_children, pinned, bytes;
    struct sc_block *hnext;   /* bucket chain */
    struct sc_block *prev, *next; /* LRU list, most recent first (only blocks in the table) */
} sc_block;

struct clef_state_cache {
    clef_backend *be;
    size_t capacity, block_floats;
    sc_block **buckets;
    size_t n_buckets, n_blocks;
    sc_block *head, *tail;
    pthread_mutex_t lock; /* the counters below, for clef_state_cache_stats_get */
    clef_state_cache_stats st;
};

static uint64_t mix(uint64_t h, const void *p, size_t n) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ULL;
    return h;
}

/* The key of block `b` of record `k`, given its parent. */
static uint64_t key_hash(const sc_block *parent, const clef_sc_key *k, size_t b, const int32_t *pos3) {
    uint64_t h = 0xcbf29ce484222325ULL;
    h = mix(h, &parent, sizeof parent);
    if (!parent && k->digest) h = mix(h, k->digest, 32);
    h = mix(h, k->ids + b * B, B * sizeof(int32_t));
    if (pos3) h = mix(h, pos3, 3 * B * sizeof(int32_t));
    return h;
}

/* Block b's positions of a record with positions, gathered [3][B]. */
static void gather_pos(const clef_sc_key *k, size_t b, int32_t *pos3) {
    for (size_t ax = 0; ax < 3; ax++) memcpy(pos3 + ax * B, k->positions + ax * k->n_ids + b * B, B * sizeof(int32_t));
}

static int key_equal(const sc_block *x, const sc_block *parent, const clef_sc_key *k, size_t b, const int32_t *pos3) {
    static const uint8_t zero[32];
    if (x->parent != parent || memcmp(x->ids, k->ids + b * B, sizeof x->ids) != 0) return 0;
    if (!parent && memcmp(x->digest, k->digest ? k->digest : zero, 32) != 0) return 0;
    if (!pos3 != !x->pos) return 0;
    return !pos3 || memcmp(x->pos, pos3, 3 * B * sizeof(int32_t)) == 0;
}

static sc_block *find(clef_state_cache *c, const sc_block *parent, const clef_sc_key *k, size_t b, const int32_t *pos3) {
    const uint64_t h = key_hash(parent, k, b, pos3);
    for (sc_block *x = c->buckets[h & (c->n_buckets - 1)]; x; x = x->hnext)
        if (x->hash == h && key_equal(x, parent, k, b, pos3)) return x;
    return NULL;
}

static void lru_unlink(clef_state_cache *c, sc_block *x) {
    if (x->prev) x->prev->next = x->next; else c->head = x->next;
    if (x->next) x->next->prev = x->prev; else c->tail = x->prev;
    x->prev = x->next = NULL;
}

static void lru_front(clef_state_cache *c, sc_block *x) {
    x->next = c->head;
    x->prev = NULL;
    if (c->head) c->head->prev = x; else c->tail = x;
    c->head = x;
}

static void grow_table(clef_state_cache *c) {
    if (c->n_blocks < c->n_buckets) return;
    size_t nb = c->n_buckets * 2;
    sc_block **nbk = clef_xcalloc(nb, sizeof *nbk);
    for (size_t i = 0; i < c->n_buckets; i++)
        for (sc_block *x = c->buckets[i], *nx; x; x = nx) {
            nx = x->hnext;
            x->hnext = nbk[x->hash & (nb - 1)];
            nbk[x->hash & (nb - 1)] = x;
        }
    free(c->buckets);
    c->buckets = nbk;
    c->n_buckets = nb;
}

/* Free a block that is not in the table (a pending fill or one just unlinked). */
static void block_free(clef_state_cache *c, sc_block *x) {
    c->be->ops->free(c->be, x->data);
    free(x->pos);
    pthread_mutex_lock(&c->lock);
    c->st.bytes -= x->bytes;
    pthread_mutex_unlock(&c->lock);
    free(x);
}

/* Take a block out of the table and free it. */
static void evict(clef_state_cache *c, sc_block *x) {
    sc_block **pp = &c->buckets[x->hash & (c->n_buckets - 1)];
    while (*pp != x) pp = &(*pp)->hnext;
    *pp = x->hnext;
    lru_unlink(c, x);
    if (x->parent) x->parent->n_children--;
    c->n_blocks--;
    pthread_mutex_lock(&c->lock);
    c->st.evictions++;
    c->st.blocks--;
    pthread_mutex_unlock(&c->lock);
    block_free(c, x);
}

/* Evict least recently used free leaves until `need` more bytes fit; 0 when they do. */
static int make_room(clef_state_cache *c, size_t need) {
    if (need > c->capacity) return -1;
    while (c->st.bytes + need > c->capacity) {
        sc_block *x = c->tail;
        while (x && (x->pinned || x->n_children)) x = x->prev;
        if (!x) return -1;
        evict(c, x);
    }
    return 0;
}

clef_state_cache *clef_state_cache_new(clef_backend *be, size_t capacity, size_t block_floats) {
    if (!capacity) return NULL;
    clef_state_cache *c = clef_xcalloc(1, sizeof *c);
    c->be = be;
    c->capacity = capacity;
    c->block_floats = block_floats;
    c->n_buckets = 1024;
    c->buckets = clef_xcalloc(c->n_buckets, sizeof *c->buckets);
    pthread_mutex_init(&c->lock, NULL);
    c->st.capacity = capacity;
    return c;
}

void clef_state_cache_free(clef_state_cache *c) {
    if (!c) return;
    for (sc_block *x = c->head, *nx; x; x = nx) {
        nx = x->next;
        c->be->ops->free(c->be, x->data);
        free(x->pos);
        free(x);
    }
    free(c->buckets);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

void clef_state_cache_stats_get(clef_state_cache *c, clef_state_cache_stats *out) {
    memset(out, 0, sizeof *out);
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    *out = c->st;
    pthread_mutex_unlock(&c->lock);
}

void clef_state_cache_plan(clef_state_cache *c, const clef_sc_key *keys, size_t n, clef_sc_plan *p) {
    memset(p, 0, sizeof *p);
    if (!c) return;
    p->n = n;
    p->reuse = clef_xcalloc(n + 1, sizeof *p->reuse);
    p->fill = clef_xcalloc(n + 1, sizeof *p->fill);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += keys[i].cacheable / B;
    p->read = clef_xcalloc(total + 1, sizeof *p->read);
    p->write = clef_xcalloc(total + 1, sizeof *p->write);
    p->rb = clef_xcalloc(total + 1, sizeof *p->rb);
    p->wb = clef_xcalloc(total + 1, sizeof *p->wb);
    int32_t pos3[3 * B];
    /* every record's hits first (pinned), so filling one cannot evict another's */
    for (size_t i = 0; i < n; i++) {
        const clef_sc_key *k = &keys[i];
        const size_t nb = (k->cacheable < k->n_ids ? k->cacheable : 0) / B;
        sc_block *parent = NULL;
        for (size_t b = 0; b < nb; b++) {
            if (k->positions) gather_pos(k, b, pos3);
            sc_block *x = find(c, parent, k, b, k->positions ? pos3 : NULL);
            if (!x) break;
            x->pinned++;
            p->rb[p->n_read] = x;
            p->read[p->n_read++] = x->data;
            p->reuse[i] += B;
            parent = x;
        }
    }
    const size_t bytes = c->block_floats * sizeof(float) + sizeof(sc_block);
    for (size_t i = 0; i < n; i++) {
        const clef_sc_key *k = &keys[i];
        const size_t nb = (k->cacheable < k->n_ids ? k->cacheable : 0) / B;
        for (size_t b = p->reuse[i] / B; b < nb; b++) {
            const size_t need = bytes + (k->positions ? 3 * B * sizeof(int32_t) : 0);
            if (make_room(c, need) != 0) break;
            float *data = c->be->ops->alloc(c->be, c->block_floats * sizeof(float));
            if (!data) break;
            sc_block *x = clef_xcalloc(1, sizeof *x);
            x->data = data;
            x->bytes = need;
            memcpy(x->ids, k->ids + b * B, sizeof x->ids);
            if (k->positions) {
                x->pos = clef_xmalloc(3 * B * sizeof(int32_t));
                gather_pos(k, b, x->pos);
            }
            if (b == 0 && k->digest) memcpy(x->digest, k->digest, 32);
            pthread_mutex_lock(&c->lock);
            c->st.bytes += need;
            pthread_mutex_unlock(&c->lock);
            p->wb[p->n_write] = x;
            p->write[p->n_write++] = data;
            p->fill[i]++;
        }
    }
}

void clef_state_cache_finish(clef_state_cache *c, const clef_sc_key *keys, clef_sc_plan *p, int ok) {
    if (!c || !p->reuse) return;
    size_t ri = 0, wi = 0;
    uint64_t hits = 0, reused = 0, filled = 0;
    sc_block **chain = clef_xmalloc((p->n_read + p->n_write + 1) * sizeof *chain);
    int32_t pos3[3 * B];
    for (size_t i = 0; i < p->n; i++) {
        const clef_sc_key *k = &keys[i];
        size_t nc = 0;
        sc_block *parent = NULL;
        for (size_t b = 0; b < p->reuse[i] / B; b++) parent = chain[nc++] = p->rb[ri++];
        for (size_t b = 0; b < p->fill[i]; b++) {
            sc_block *x = p->wb[wi++];
            if (!ok || (!parent && b + p->reuse[i] / B)) { /* failed forward, or an unreachable block */
                block_free(c, x);
                parent = NULL;
                continue;
            }
            const size_t at = p->reuse[i] / B + b;
            if (k->positions) gather_pos(k, at, pos3);
            sc_block *have = find(c, parent, k, at, k->positions ? pos3 : NULL);
            if (have) { /* another record of this forward added it */
                block_free(c, x);
                parent = chain[nc++] = have;
                continue;
            }
            x->parent = parent;
            x->hash = key_hash(parent, k, at, k->positions ? pos3 : NULL);
            x->hnext = c->buckets[x->hash & (c->n_buckets - 1)];
            c->buckets[x->hash & (c->n_buckets - 1)] = x;
            if (parent) parent->n_children++;
            lru_front(c, x);
            c->n_blocks++;
            filled++;
            grow_table(c);
            parent = chain[nc++] = x;
        }
        /* last block first: a parent ends up more recent than its children */
        if (ok)
            for (size_t j = nc; j-- > 0;) {
                lru_unlink(c, chain[j]);
                lru_front(c, chain[j]);
            }
        if (ok && p->reuse[i]) hits++, reused += p->reuse[i];
    }
    for (size_t j = 0; j < p->n_read; j++) ((sc_block *)p->rb[j])->pinned--;
    free(chain);
    pthread_mutex_lock(&c->lock);
    if (ok) {
        c->st.lookups += p->n;
        c->st.hits += hits;
        c->st.tokens_reused += reused;
        c->st.blocks_filled += filled;
        c->st.blocks = c->n_blocks;
    }
    pthread_mutex_unlock(&c->lock);
    free(p->reuse), free(p->fill), free(p->read), free(p->write), free(p->rb), free(p->wb);
    memset(p, 0, sizeof *p);
}

int clef_parse_size(const char *option, const char *text, size_t *out, clef_err *err) {
    if (!text || !*text) return clef_fail(err, 400, CLEF_E_REQUEST, option, "%s: expected a size such as 512M or 4G, got ''", option);
    if (!strcasecmp(text, "off")) return *out = 0, 0;
    const char *s = text;
    if (!isdigit((unsigned char)*s)) goto bad;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno) goto bad;
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    case 'T': shift = 40; end++; break;
    default: break;
    }
    if (shift && (*end == 'i' || *end == 'I')) end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end) goto bad;
    if (shift && v > (SIZE_MAX >> shift)) goto bad;
    *out = (size_t)(v << shift);
    return 0;
bad:
    return clef_fail(err, 400, CLEF_E_REQUEST, option,
                     "%s: '%s' is not a size (a number of bytes with an optional K, M, G or T suffix, e.g. 512M or "
                     "4G; 0 or off turns it off)",
                     option, text);
}
