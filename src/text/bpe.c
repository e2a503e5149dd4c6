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

/* Queue the merge of the pair starting at symbol `pos`, if it has one. */
static void queue_pair(const bpe_pairmap *merges, bpe_scratch *s, int32_t pos) {
    int32_t nx = s->sym[pos].next;
    if (nx < 0) return;
    const bpe_merge *m = bpe_pairmap_get(merges, s->sym[pos].id, s->sym[nx].id);
    if (m) heap_push(s, (struct bpe_cand){m->rank, pos, m->new_id});
}

void bpe_encode_piece(const bpe_pairmap *merges, const int32_t byte_id[256], const uint8_t *bytes, size_t n,
                      bpe_scratch *s, clef_ids *out) {
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
    s->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++) queue_pair(merges, s, (int32_t)i);
    while (s->heap_n) {
        struct bpe_cand c = heap_pop(s);
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
        if (l->prev >= 0) queue_pair(merges, s, l->prev);
        queue_pair(merges, s, c.pos);
    }
    for (int32_t i = 0; i >= 0; i = s->sym[i].next) clef_ids_push(out, s->sym[i].id);
}

void bpe_scratch_free(bpe_scratch *s) {
    free(s->sym);
    free(s->heap);
    memset(s, 0, sizeof *s);
}
