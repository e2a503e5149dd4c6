/* state_cache.h — reuse of the K/V and final hidden rows of shared token
 * prefixes across forwards (issue 19 part 2).
 *
 * The prompt puts the state before the questions (decision/encode.c: PREFIX,
 * media block, state, then schema and suffix), so requests that share a state,
 * or a prefix of it (a growing transcript), share leading tokens.  The cache
 * holds blocks of CLEF_KV_BLOCK (64) tokens (model.h: per layer K and V, then
 * the final hidden rows; clef_kv_block_floats f32 each) in the model backend's
 * memory, chained like vLLM's prefix caching: a block's key is its parent
 * block (NULL for a record's first block), its 64 token ids, its 64 M-RoPE
 * positions (3 axes; text-only records have positions = index, implied by the
 * chain) and, for the first block, the SHA-256 of the record's media tensors
 * (all zero without media).  Keys are compared whole (the 64-bit hash only
 * picks the bucket), so a hash collision cannot hand out another prefix's
 * rows.  Only blocks that end inside the state (the first `cacheable` tokens
 * of a record) are filled.
 *
 * Bound and eviction: bytes held (block data + ids + positions + the
 * block's bookkeeping) never exceed the capacity; to make room the least
 * recently used block without children that no running forward reads is
 * freed.  A chain is touched from its last block to its first, so a parent
 * is always more recent than its children and the least recently used
 * block is a leaf.
 *
 * Not thread-safe except clef_state_cache_stats: the engine calls the rest
 * under its forward lock.
 */
#ifndef CLEF_ENGINE_STATE_CACHE_H
#define CLEF_ENGINE_STATE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "util/err.h"

/* Default `--state-cache` of `serve` and `eval`. */
#define CLEF_STATE_CACHE_DEFAULT_BYTES ((size_t)2 << 30)

typedef struct clef_state_cache clef_state_cache;

/* A cache of at most `capacity` bytes whose blocks are `block_floats` f32 of
 * `be` memory (borrowed; must outlive the cache).  capacity 0 = NULL (off). */
clef_state_cache *clef_state_cache_new(clef_backend *be, size_t capacity, size_t block_floats);
/* Free every block.  NULL is ok. */
void clef_state_cache_free(clef_state_cache *c);

/* Counters since creation, and what is held now. */
typedef struct clef_state_cache_stats {
    uint64_t lookups;       /* records looked up (forwards that succeeded) */
    uint64_t hits;          /* of them, records that reused at least one block */
    uint64_t tokens_reused; /* tokens taken from blocks instead of computed */
    uint64_t blocks_filled; /* blocks added */
    uint64_t evictions;     /* blocks freed to make room */
    size_t bytes;           /* bytes held now (<= capacity) */
    size_t capacity;        /* the bound */
    size_t blocks;          /* blocks held now */
} clef_state_cache_stats;

/* Thread-safe (a mutex): the server's /metrics reads it while forwards run.
 * NULL cache: all zero. */
void clef_state_cache_stats_get(clef_state_cache *c, clef_state_cache_stats *out);

/* What identifies one record's prefix (all borrowed). */
typedef struct clef_sc_key {
    const int32_t *ids;       /* [n_ids] */
    size_t n_ids;
    const int32_t *positions; /* [3][n_ids] M-RoPE positions, or NULL (text: position = index) */
    const uint8_t *digest;    /* 32-byte SHA-256 of the record's media tensors, or NULL (no media) */
    size_t cacheable;         /* leading tokens whose blocks may be kept (the state's end); < n_ids */
} clef_sc_key;

/* One forward's use of the cache, for n records (arrays owned by the plan,
 * the blocks by the cache): the fields of clef_thinker_reuse (model.h). */
typedef struct clef_sc_plan {
    size_t n;
    size_t *reuse;  /* [n] tokens reused by record i (whole blocks) */
    float **read;   /* the reused blocks, record by record */
    size_t *fill;   /* [n] blocks record i fills */
    float **write;  /* the blocks to fill (not yet in the cache) */
    void **rb, **wb; /* the cache's block records behind read / write */
    size_t n_read, n_write;
} clef_sc_plan;

/* Look up each record's longest cached prefix of whole blocks (pinned until
 * clef_state_cache_finish) and allocate the blocks of the rest of its
 * cacheable prefix (as many as fit the bound after evicting).  Never fails:
 * a block that cannot be had is simply not filled. */
void clef_state_cache_plan(clef_state_cache *c, const clef_sc_key *keys, size_t n, clef_sc_plan *plan);

/* After the forward: ok = 1 adds the filled blocks (a block whose key a
 * record of the same forward added first is dropped) and counts the
 * lookups; ok = 0 drops them.  Unpins, touches the chains and frees the
 * plan's arrays.  NULL cache or a zeroed plan: nothing. */
void clef_state_cache_finish(clef_state_cache *c, const clef_sc_key *keys, clef_sc_plan *plan, int ok);

/* Parse a `--state-cache` size: a number of bytes with an optional suffix
 * K, M, G, T (powers of 1024; an optional trailing B or iB, any case), "0"
 * or "off" = 0.  Returns 0 with *out set, or -1 with err (400, naming the
 * option and the text). */
int clef_parse_size(const char *option, const char *text, size_t *out, clef_err *err);

#endif
