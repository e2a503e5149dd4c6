/* bpe.h — internal to src/text: the vocabulary and merge tables of a BPE
 * model and the merge loop of one pre-token (SPEC.md §5 steps 4–5).
 *
 * Reproduces HF `tokenizers` BPE::merge_word with dropout off: start from
 * one symbol per byte-level character, repeatedly merge the adjacent pair
 * with the lowest merge rank (leftmost on equal rank), then emit the symbol
 * ids.  A binary heap keeps this O(n log n) in the piece length, so a 100 KB
 * run of one character (one pre-token) is still fast.
 *
 * All tables are built once at load time and are read-only afterwards; the
 * merge loop keeps its state in a caller-owned bpe_scratch, so concurrent
 * callers with separate scratches are safe.
 */
#ifndef CLEF_TEXT_BPE_H
#define CLEF_TEXT_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"

/* Hash map from a byte string (vocab token, byte-level form) to an id. */
typedef struct bpe_strmap {
    uint32_t *slots;  /* entry index + 1, 0 = empty; capacity mask + 1 slots */
    size_t mask;
    struct bpe_strent {
        uint64_t hash;
        size_t off;   /* into pool */
        uint32_t len;
        int32_t id;
    } *ents;
    size_t n, cap;
    clef_buf pool;    /* concatenated key bytes */
} bpe_strmap;

/* Insert or overwrite (a later duplicate key wins, as in a Rust HashMap
 * collect).  Ids are >= 0. */
void bpe_strmap_put(bpe_strmap *m, const char *s, size_t len, int32_t id);
/* Id of the key, or -1. */
int32_t bpe_strmap_get(const bpe_strmap *m, const char *s, size_t len);
void bpe_strmap_free(bpe_strmap *m);

/* Hash map from a symbol pair (left id, right id) to its merge. */
typedef struct bpe_merge {
    int32_t rank;    /* position in the merges list: lower merges first */
    int32_t new_id;  /* vocab id of the concatenated symbol */
} bpe_merge;

typedef struct bpe_pairmap {
    uint64_t *keys;  /* (left << 32) | right; UINT64_MAX = empty */
    bpe_merge *vals;
    size_t mask, n;
} bpe_pairmap;

/* Insert or overwrite (the later rank wins for a repeated pair, as HF's
 * HashMap collect does). */
void bpe_pairmap_put(bpe_pairmap *m, int32_t left, int32_t right, bpe_merge v);
/* The merge of (left, right), or NULL. */
const bpe_merge *bpe_pairmap_get(const bpe_pairmap *m, int32_t left, int32_t right);
void bpe_pairmap_free(bpe_pairmap *m);

/* Per-call working memory of bpe_encode_piece (grown on demand; zero-init). */
typedef struct bpe_scratch {
    struct bpe_sym { int32_t id, prev, next; } *sym;
    size_t sym_cap;
    struct bpe_cand { int32_t rank, pos, new_id; } *heap;
    size_t heap_n, heap_cap;
    /* the rank-bucket queue of long pieces (see bpe.c) */
    int32_t *bmap_rank;  /* open-addressing map rank -> bucket index: keys (-1 = empty) */
    int32_t *bmap_bucket; /* values */
    size_t bmap_cap;     /* power of two, at least twice the buckets */
    struct bpe_bucket *buckets;
    size_t n_buckets, buckets_cap;
    int32_t *rheap;      /* min-heap of bucket indices by rank */
    size_t rheap_n, rheap_cap;
} bpe_scratch;

void bpe_scratch_free(bpe_scratch *s);

/* Pieces of at least this many bytes merge through rank buckets instead of
 * one binary heap: the same merges in the same (rank, position) order, so
 * the same ids, but the candidates of one rank sit in one array that is
 * mostly appended to and read front to back, where the heap's random
 * accesses over tens of millions of entries made a 16 MiB run of spaces take
 * 30 s. */
#define BPE_LONG_PIECE 256

/* BPE-encode one pre-token given as `n` raw bytes (before the byte-level
 * mapping): `byte_id[b]` is the vocab id of the byte-level symbol of byte b.
 * Appends the resulting ids to `out`. */
void bpe_encode_piece(const bpe_pairmap *merges, const int32_t byte_id[256], const uint8_t *bytes, size_t n,
                      bpe_scratch *s, clef_ids *out);

/* bpe_encode_piece with the long-piece threshold `long_min` (bytes; SIZE_MAX:
 * always the binary heap).  For tests, which check both queues agree. */
void bpe_encode_piece_ex(const bpe_pairmap *merges, const int32_t byte_id[256], const uint8_t *bytes, size_t n,
                         size_t long_min, bpe_scratch *s, clef_ids *out);

#endif
