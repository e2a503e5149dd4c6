/* bpe.c — hash tables and the merge loop of the byte-level BPE (see bpe.h). */
#include "text/bpe.h"

#include <stdlib.h>
#include <string.h>

/* ---- string -> id map (open addressing, linear probing) ---- */

static uint64_t hash_bytes(const char *s, size_t len) {
    uint64_t h = 1469598103934665603ULL;  /* FNV-1a: short keys, good spread */
    for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h ^ (h >> 29);
}

static void strmap_grow(bpe_strmap *m) {
    size_t cap = m->mask ? (m->mask + 1) * 2 : 1024;
    free(m->slots);
    m->slots = clef_xcalloc(cap, sizeof *m->slots);
    m->mask = cap - 1;
    for (size_t e = 0; e < m->n; e++) {
        size_t i = m->ents[e].hash & m->mask;
        while (m->slots[i]) i = (i + 1) & m->mask;
        m->slots[i] = (uint32_t)(e + 1);
    }
}

/* Slot holding `s`, or the empty slot where it would go. */
static size_t strmap_find(const bpe_strmap *m, const char *s, size_t len, uint64_t h) {
    size_t i = h & m->mask;
    for (;; i = (i + 1) & m->mask) {
        uint32_t e = m->slots[i];
        if (!e) return i;
        const struct bpe_strent *en = &m->ents[e - 1];
        if (en->hash == h && en->len == len && memcmp(m->pool.data + en->off, s, len) == 0) return i;
    }
}

void bpe_strmap_put(bpe_strmap *m, const char *s, size_t len, int32_t id) {
    if ((m->n + 1) * 2 > m->mask + 1) strmap_grow(m);  /* load factor <= 1/2 */
    uint64_t h = hash_bytes(s, len);
    size_t i = strmap_find(m, s, len, h);
    if (m->slots[i]) {
        m->ents[m->slots[i] - 1].id = id;
        return;
    }
    if (m->n == m->cap) {
        m->cap = m->cap ? m->cap * 2 : 1024;
        m->ents = clef_xrealloc(m->ents, m->cap * sizeof *m->ents);
    }
    m->ents[m->n] = (struct bpe_strent){.hash = h, .off = m->pool.len, .len = (uint32_t)len, .id = id};
    clef_buf_append(&m->pool, s, len);
    m->slots[i] = (uint32_t)(++m->n);
}

int32_t bpe_strmap_get(const bpe_strmap *m, const char *s, size_t len) {
    if (!m->mask) return -1;
    size_t i = strmap_find(m, s, len, hash_bytes(s, len));
    return m->slots[i] ? m->ents[m->slots[i] - 1].id : -1;
}

void bpe_strmap_free(bpe_strmap *m) {
    free(m->slots);
    free(m->ents);
    clef_buf_free(&m->pool);
    memset(m, 0, sizeof *m);
}

/* ---- (left, right) -> merge map ---- */

#define PAIR_EMPTY UINT64_MAX

static uint64_t pair_key(int32_t l, int32_t r) { return ((uint64_t)(uint32_t)l << 32) | (uint32_t)r; }

static size_t pair_hash(uint64_t k) {
    k ^= k >> 33;  /* murmur3 finalizer */
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    return (size_t)(k ^ (k >> 33));
}

static size_t pair_slot(const bpe_pairmap *m, uint64_t k) {
    size_t i = pair_hash(k) & m->mask;
    while (m->keys[i] != PAIR_EMPTY && m->keys[i] != k) i = (i + 1) & m->mask;
    return i;
}

static void pairmap_grow(bpe_pairmap *m) {
    bpe_pairmap old = *m;
    size_t cap = m->mask ? (m->mask + 1) * 2 : 1024;
    m->keys = clef_xmalloc(cap * sizeof *m->keys);
    memset(m->keys, 0xff, cap * sizeof *m->keys);
    m->vals = clef_xmalloc(cap * sizeof *m->vals);
    m->mask = cap - 1;
    for (size_t i = 0; old.mask && i <= old.mask; i++) {
        if (old.keys[i] == PAIR_EMPTY) continue;
        size_t j = pair_slot(m, old.keys[i]);
        m->keys[j] = old.keys[i];
        m->vals[j] = old.vals[i];
    }
    free(old.keys);
    free(old.vals);
}

void bpe_pairmap_put(bpe_pairmap *m, int32_t left, int32_t right, bpe_merge v) {
    if ((m->n + 1) * 2 > m->mask + 1) pairmap_grow(m);
    uint64_t k = pair_key(left, right);
    size_t i = pair_slot(m, k);
    if (m->keys[i] == PAIR_EMPTY) m->n++;
    m->keys[i] = k;
    m->vals[i] = v;
}

const bpe_merge *bpe_pairmap_get(const bpe_pairmap *m, int32_t left, int32_t right) {
    if (!m->mask) return NULL;
    size_t i = pair_slot(m, pair_key(left, right));
    return m->keys[i] == PAIR_EMPTY ? NULL : &m->vals[i];
}

void bpe_pairmap_free(bpe_pairmap *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ---- merge loop ---- */

/* Heap order of HF's Merge: lower rank first, then lower (leftmost) pos. */
static int cand_less(const struct bpe_cand *a, const struct bpe_cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(bpe_scratch *s, struct bpe_cand c) {
    if (s->heap_n == s->heap_cap) {
        s->heap_cap = s->heap_cap ? s->heap_cap * 2 : 256;
        s->heap = clef_xrealloc(s->heap, s->heap_cap * sizeof *s->heap);
    }
    size_t i = s->heap_n++;
    while (i > 0 && cand_less(&c, &s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = c;
}

static struct bpe_cand heap_pop(bpe_scratch *s) {
    struct bpe_cand top = s->heap[0], last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && cand_less(&s->heap[c + 1], &s->heap[c])) c++;
        if (!cand_less(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

/* ---- the rank-bucket queue (long pieces) ----
 *
 * The candidates of one rank form a bucket: an array sorted by position,
 * consumed from `head`, plus a small binary heap (`late`) for a candidate
 * pushed left of the array's last one (rare: most merges create their new
 * pairs while a rank is swept left to right, so pushes arrive in position
 * order).  A min-heap of bucket indices by rank finds the lowest rank that
 * has candidates.  Popping takes that bucket's leftmost candidate, so the
 * order is the binary heap's (rank, then position). */
typedef struct bpe_ent {
    int32_t pos, new_id;
} bpe_ent;

struct bpe_bucket {
    bpe_ent *v;
    size_t head, len, cap;
    bpe_ent *late;
    size_t late_n, late_cap;
    int32_t rank;
    int in_heap;
};

static void late_push(struct bpe_bucket *b, bpe_ent e) {
    if (b->late_n == b->late_cap) {
        b->late_cap = b->late_cap ? 2 * b->late_cap : 64;
        b->late = clef_xrealloc(b->late, b->late_cap * sizeof *b->late);
    }
    size_t i = b->late_n++;
    while (i > 0 && e.pos < b->late[(i - 1) / 2].pos) {
        b->late[i] = b->late[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    b->late[i] = e;
}

static bpe_ent late_pop(struct bpe_bucket *b) {
    bpe_ent top = b->late[0], last = b->late[--b->late_n];
    size_t i = 0, n = b->late_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && b->late[c + 1].pos < b->late[c].pos) c++;
        if (!(b->late[c].pos < last.pos)) break;
        b->late[i] = b->late[c];
        i = c;
    }
    if (n) b->late[i] = last;
    return top;
}

static int bucket_empty(const struct bpe_bucket *b) { return b->head == b->len && b->late_n == 0; }

static int rank_less(const bpe_scratch *s, int32_t a, int32_t b) { return s->buckets[a].rank < s->buckets[b].rank; }

static void rheap_push(bpe_scratch *s, int32_t bi) {
    if (s->rheap_n == s->rheap_cap) {
        s->rheap_cap = s->rheap_cap ? 2 * s->rheap_cap : 64;
        s->rheap = clef_xrealloc(s->rheap, s->rheap_cap * sizeof *s->rheap);
    }
    size_t i = s->rheap_n++;
    while (i > 0 && rank_less(s, bi, s->rheap[(i - 1) / 2])) {
        s->rheap[i] = s->rheap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->rheap[i] = bi;
}

static void rheap_pop(bpe_scratch *s) {
    int32_t last = s->rheap[--s->rheap_n];
    size_t i = 0, n = s->rheap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && rank_less(s, s->rheap[c + 1], s->rheap[c])) c++;
        if (!rank_less(s, s->rheap[c], last)) break;
        s->rheap[i] = s->rheap[c];
        i = c;
    }
    if (n) s->rheap[i] = last;
}

/* Slot of `rank` in the rank -> bucket map (its own, or the empty one where it goes). */
static size_t bmap_slot(const bpe_scratch *s, int32_t rank) {
    size_t i = ((uint32_t)rank * 2654435761u) & (s->bmap_cap - 1);
    while (s->bmap_rank[i] >= 0 && s->bmap_rank[i] != rank) i = (i + 1) & (s->bmap_cap - 1);
    return i;
}

/* (Re)size the map to `cap` slots and enter every bucket. */
static void bmap_rebuild(bpe_scratch *s, size_t cap) {
    if (cap != s->bmap_cap) {
        s->bmap_rank = clef_xrealloc(s->bmap_rank, cap * sizeof *s->bmap_rank);
        s->bmap_bucket = clef_xrealloc(s->bmap_bucket, cap * sizeof *s->bmap_bucket);
        s->bmap_cap = cap;
    }
    memset(s->bmap_rank, 0xff, cap * sizeof *s->bmap_rank);
    for (size_t b = 0; b < s->n_buckets; b++) {
        size_t i = bmap_slot(s, s->buckets[b].rank);
        s->bmap_rank[i] = s->buckets[b].rank;
        s->bmap_bucket[i] = (int32_t)b;
    }
}

static void bucket_push(bpe_scratch *s, int32_t rank, int32_t pos, int32_t new_id) {
    size_t slot = bmap_slot(s, rank);
    int32_t bi = s->bmap_rank[slot] == rank ? s->bmap_bucket[slot] : -1;
    if (bi < 0) {
        if (s->n_buckets == s->buckets_cap) {
            s->buckets_cap = s->buckets_cap ? 2 * s->buckets_cap : 256;
            s->buckets = clef_xrealloc(s->buckets, s->buckets_cap * sizeof *s->buckets);
        }
        bi = (int32_t)s->n_buckets++;
        s->buckets[bi] = (struct bpe_bucket){.rank = rank};
        if (2 * s->n_buckets > s->bmap_cap) {
            bmap_rebuild(s, 2 * s->bmap_cap);
        } else {
            s->bmap_rank[slot] = rank;
            s->bmap_bucket[slot] = bi;
        }
    }
    struct bpe_bucket *b = &s->buckets[bi];
    bpe_ent e = {pos, new_id};
    if (b->head == b->len) b->head = b->len = 0; /* the sorted part is used up: start it again */
    if (b->len == 0 || pos > b->v[b->len - 1].pos) {
        if (b->len == b->cap) {
            b->cap = b->cap ? 2 * b->cap : 64;
            b->v = clef_xrealloc(b->v, b->cap * sizeof *b->v);
        }
        b->v[b->len++] = e;
    } else {
        late_push(b, e);
    }
    if (!b->in_heap) {
        b->in_heap = 1;
        rheap_push(s, bi);
    }
}

/* The lowest (rank, position) candidate; 0 when none is left. */
static int bucket_pop(bpe_scratch *s, struct bpe_cand *c) {
    while (s->rheap_n) {
        struct bpe_bucket *b = &s->buckets[s->rheap[0]];
        if (bucket_empty(b)) {
            b->in_heap = 0;
            rheap_pop(s);
            continue;
        }
        bpe_ent e;
        if (b->late_n && (b->head == b->len || b->late[0].pos < b->v[b->head].pos))
            e = late_pop(b);
        else
            e = b->v[b->head++];
        if (b->head == b->len && b->cap > 4096) { /* a swept rank's array is not needed again soon: give it back */
            free(b->v);
            b->v = NULL;
            b->head = b->len = b->cap = 0;
        }
        *c = (struct bpe_cand){b->rank, e.pos, e.new_id};
        return 1;
    }
    return 0;
}

/* Queue the merge of the pair starting at symbol `pos`, if it has one. */
static void queue_pair(const bpe_pairmap *merges, bpe_scratch *s, int32_t pos, int buckets) {
    int32_t nx = s->sym[pos].next;
    if (nx < 0) return;
    const bpe_merge *m = bpe_pairmap_get(merges, s->sym[pos].id, s->sym[nx].id);
    if (!m) return;
    if (buckets)
        bucket_push(s, m->rank, pos, m->new_id);
    else
        heap_push(s, (struct bpe_cand){m->rank, pos, m->new_id});
}

void bpe_encode_piece_ex(const bpe_pairmap *merges, const int32_t byte_id[256], const uint8_t *bytes, size_t n,
                         size_t long_min, bpe_scratch *s, clef_ids *out) {
    if (n == 1) {  /* nothing to merge */
        clef_ids_push(out, byte_id[bytes[0]]);
        return;
    }
    if (n > s->sym_cap) {
        s->sym_cap = n;
        s->sym = clef_xrealloc(s->sym, n * sizeof *s->sym);
    }
    for (size_t i = 0; i < n; i++)
        s->sym[i] = (struct bpe_sym){byte_id[bytes[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
    const int buckets = n >= long_min;
    if (buckets) {
        s->n_buckets = 0;
        bmap_rebuild(s, s->bmap_cap ? s->bmap_cap : 64);
        s->rheap_n = 0;
    }
    s->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++) queue_pair(merges, s, (int32_t)i, buckets);
    struct bpe_cand c;
    while (buckets ? bucket_pop(s, &c) : s->heap_n ? (c = heap_pop(s), 1) : 0) {
        struct bpe_sym *l = &s->sym[c.pos];
        if (l->id < 0 || l->next < 0) continue;  /* merged away, or now last */
        /* Stale entry check, as HF: the pair now at pos must merge into the same id. */
        const bpe_merge *m = bpe_pairmap_get(merges, l->id, s->sym[l->next].id);
        if (!m || m->new_id != c.new_id) continue;
        int32_t right = l->next;
        l->id = c.new_id;
        l->next = s->sym[right].next;
        if (l->next >= 0) s->sym[l->next].prev = c.pos;
        s->sym[right].id = -1;
        if (l->prev >= 0) queue_pair(merges, s, l->prev, buckets);
        queue_pair(merges, s, c.pos, buckets);
    }
    if (buckets) { /* forget this piece's buckets (the map is cleared at the next long piece) */
        for (size_t i = 0; i < s->n_buckets; i++) {
            free(s->buckets[i].v);
            free(s->buckets[i].late);
        }
        s->n_buckets = 0;
    }
    for (int32_t i = 0; i >= 0; i = s->sym[i].next) clef_ids_push(out, s->sym[i].id);
}

void bpe_encode_piece(const bpe_pairmap *merges, const int32_t byte_id[256], const uint8_t *bytes, size_t n,
                      bpe_scratch *s, clef_ids *out) {
    bpe_encode_piece_ex(merges, byte_id, bytes, n, BPE_LONG_PIECE, s, out);
}

void bpe_scratch_free(bpe_scratch *s) {
    free(s->sym);
    free(s->heap);
    for (size_t i = 0; i < s->n_buckets; i++) {
        free(s->buckets[i].v);
        free(s->buckets[i].late);
    }
    free(s->buckets);
    free(s->bmap_rank);
    free(s->bmap_bucket);
    free(s->rheap);
    memset(s, 0, sizeof *s);
}
