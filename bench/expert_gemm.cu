/* expert_gemm.cu — the grouped expert GEMM kernels of the CUDA backend
 * (cuda_kernels.h: ck_gemm = mma.sync, ck_gemm_tma = warp-specialised TMA,
 * ck_gemm_wgmma = Hopper warpgroup MMA, ck_gemm_wgmma_ws = its persistent
 * warp-specialised form for 128-row tiles) timed in isolation on one layer of
 * the full model's experts (128 experts, hidden 2048, inter 768, top-8) for
 * a routing plan of N tokens, and their outputs compared bitwise (the
 * backend mixes them by pass size, so they must agree to the bit).
 *
 * Routing: each token picks k distinct experts uniformly at random (seeded).
 * Weights and activations: random bf16 (weights ~0.03, activations ~1;
 * [hi | lo] rows when --split 2), drawn from --seed.  Times: CUDA events
 * around each launch, best and mean of --reps after one warm-up; bytes =
 * every expert's weights (at 300 tokens every expert is routed); TFLOP/s =
 * 2 rows K N of each product (gate+up: N = 2 inter) over the best time.
 * Every output is poisoned (NaN) before each kernel runs, so an element a
 * kernel leaves unwritten shows as a difference.
 *
 * build: the CMake target expert_gemm (CUDA builds for sm_90a)
 * usage: expert_gemm [--tokens N] [--split 1|2] [--tile 32|64|128] [--reps R] [--seed S]
 *                    [--counts FILE] [--reruns N]
 *   --tile: rows per tile (ck_gemm_bm: 32 = big 2, 64 = big 0, 128 = big 1;
 *           the TMA kernel takes 32 and 64, wgmma 64 and 128, wgmma_ws 128)
 *   --counts: write the routing's rows per expert (E lines) to FILE, for
 *           bench/grouped_mm.py (torch._grouped_mm on the same sizes)
 *   --reruns: runs of each warp-specialised kernel (tma, wgmma_ws) after the
 *           timed ones, each compared bitwise again (default 10)
 * exit status: 0, 1 on a CUDA error or when two kernels' outputs differ. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "backend/cuda/cuda_kernels.h"
#include "tensor/dtype.h"
}

#include "bench_cuda.h"

BENCH_CK_PROGRAM("expert_gemm")

enum { E = 128, H = 2048, NI = 768, TOPK = 8 };

static uint32_t rng = 12345u;
static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 8388608.0f - 1.0f;
}

typedef cudaError_t (*kernel_fn)(const ck_gemm_args *, cudaStream_t);
/* ck_gemm_wgmma_ws without its consumers' proxy fence (what the fence costs) */
static cudaError_t ws_nofence(const ck_gemm_args *a, cudaStream_t st) {
    return ck_gemm_wgmma_ws_opts(a, CK_WS_NOFENCE, st);
}
/* ck_gemm_wgmma_ws in CTA pairs sharing each weight tile */
static cudaError_t ws_pairs(const ck_gemm_args *a, cudaStream_t st) { return ck_gemm_wgmma_ws_opts(a, CK_WS_PAIRS, st); }

/* Best and mean microseconds of reps launches of fn(a) (after one warm-up). */
static void time_kernel(kernel_fn fn, const ck_gemm_args *a, int reps, double *best, double *mean) {
    cudaEvent_t t0, t1;
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    CK(fn(a, 0));
    CK(cudaDeviceSynchronize());
    *best = 1e30, *mean = 0.0;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(t0));
        CK(fn(a, 0));
        CK(cudaEventRecord(t1));
        CK(cudaEventSynchronize(t1));
        float ms;
        CK(cudaEventElapsedTime(&ms, t0, t1));
        if (ms * 1e3 < *best) *best = ms * 1e3;
        *mean += ms * 1e3 / reps;
    }
    CK(cudaEventDestroy(t0));
    CK(cudaEventDestroy(t1));
}

/* Elements of got that differ bitwise from ref (n elements of esz bytes, rows of `cols`); prints the
 * first few with the tile, expert and row within the tile they fall in (tile_row0 / tile_expert of
 * the plan's `tiles` tiles, rows sorted by expert). */
static size_t count_diff(const void *got, const void *ref, size_t n, int esz, int64_t rows, int64_t cols,
                         const int32_t *trow, const int32_t *texp, int tiles, const char *kname, const char *what) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!memcmp((const char *)got + i * esz, (const char *)ref + i * esz, (size_t)esz)) continue;
        if (bad++ < 6) {
            const int64_t r = (int64_t)(i / (size_t)cols), c = (int64_t)(i % (size_t)cols);
            int t = 0;
            while (t + 1 < tiles && trow[t + 1] <= r) t++;
            double gv, rv;
            if (esz == 2)
                gv = clef_bf16_to_f32(((const uint16_t *)got)[i]), rv = clef_bf16_to_f32(((const uint16_t *)ref)[i]);
            else gv = ((const float *)got)[i], rv = ((const float *)ref)[i];
            printf("    %s %s: row %lld (tile %d, expert %d, row %lld of the tile) col %lld: %.9g vs %.9g\n", kname,
                   what, (long long)r, t, texp[t], (long long)(r - trow[t]), (long long)c, gv, rv);
        }
    }
    if (bad && esz == 4 && cols % 128 == 0 && getenv("EXPERT_GEMM_MAP")) { /* the first differing 64 x 128 output tile, one char per column */
        size_t i0 = 0;
        while (!memcmp((const char *)got + i0 * esz, (const char *)ref + i0 * esz, (size_t)esz)) i0++;
        const int64_t r = (int64_t)(i0 / (size_t)cols), c0 = (int64_t)(i0 % (size_t)cols) / 128 * 128;
        int t = 0;
        while (t + 1 < tiles && trow[t + 1] <= r) t++;
        printf("    map of tile %d (rows %d.., cols %lld..): x = differs\n", t, trow[t], (long long)c0);
        for (int64_t rr = trow[t]; rr < trow[t] + 64 && rr < rows && (t + 1 >= tiles || rr < trow[t + 1]); rr++) {
            char line[129];
            for (int c = 0; c < 128; c++) {
                const size_t i = (size_t)rr * (size_t)cols + (size_t)(c0 + c);
                line[c] = memcmp((const char *)got + i * esz, (const char *)ref + i * esz, (size_t)esz) ? 'x' : '.';
            }
            line[128] = 0;
            printf("    %3lld %s\n", (long long)(rr - trow[t]), line);
        }
    }
    return bad;
}

int main(int argc, char **argv) {
    int T = 300, split = 2, tile = 32, reps = 20, reruns = 10;
    const char *counts_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--tokens") && v) T = atoi(v), i++;
        else if (!strcmp(argv[i], "--split") && v) split = atoi(v), i++;
        else if (!strcmp(argv[i], "--tile") && v) tile = atoi(v), i++;
        else if (!strcmp(argv[i], "--reps") && v) reps = atoi(v), i++;
        else if (!strcmp(argv[i], "--seed") && v) rng = (uint32_t)strtoul(v, NULL, 10), i++;
        else if (!strcmp(argv[i], "--counts") && v) counts_path = v, i++;
        else if (!strcmp(argv[i], "--reruns") && v) reruns = atoi(v), i++;
        else {
            fprintf(stderr, "usage: expert_gemm [--tokens N] [--split 1|2] [--tile 32|64|128] [--reps R] [--seed S] "
                            "[--counts FILE] [--reruns N]\n");
            return 2;
        }
    }
    const int big = tile == 32 ? 2 : tile == 64 ? 0 : tile == 128 ? 1 : -1;
    if (T < 1 || T > 100000 || (split != 1 && split != 2) || big < 0 || reps < 1 || reruns < 0) {
        fprintf(stderr, "expert_gemm: --tokens 1..100000, --split 1 or 2, --tile 32, 64 or 128, --reps >= 1, --reruns >= 0\n");
        return 2;
    }
    const int64_t TK = (int64_t)T * TOPK, BM = ck_gemm_bm(big);

    /* routing plan */
    int32_t *idx = (int32_t *)malloc((size_t)TK * 4);
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < TOPK; j++) {
            int e, dup;
            do {
                rng = rng * 1664525u + 1013904223u;
                e = (int)((rng >> 8) % E);
                dup = 0;
                for (int q = 0; q < j; q++) dup |= idx[t * TOPK + q] == e;
            } while (dup);
            idx[t * TOPK + j] = e;
        }
    int32_t *d_idx, *ix;
    const int64_t max_tiles = (TK + BM - 1) / BM + E;
    CK(cudaMalloc(&d_idx, (size_t)TK * 4));
    CK(cudaMemcpy(d_idx, idx, (size_t)TK * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&ix, (size_t)(2 * E + 2 * TK + 2 * max_tiles + 1) * 4));
    int32_t *cnt = ix, *end = cnt + E, *row_tok = end + E, *slot_pos = row_tok + TK, *t_exp = slot_pos + TK,
            *t_row = t_exp + max_tiles, *n_tiles = t_row + max_tiles;
    CK(ck_moe_plan(d_idx, T, TOPK, E, (int)BM, cnt, end, row_tok, slot_pos, t_exp, t_row, n_tiles, 0));
    int tiles = 0;
    CK(cudaMemcpy(&tiles, n_tiles, 4, cudaMemcpyDeviceToHost));
    if (counts_path) { /* rows per expert, for torch._grouped_mm on the same sizes */
        int32_t h_end[E];
        CK(cudaMemcpy(h_end, end, sizeof h_end, cudaMemcpyDeviceToHost));
        FILE *cf = fopen(counts_path, "w");
        if (!cf) {
            fprintf(stderr, "expert_gemm: cannot write %s\n", counts_path);
            return 1;
        }
        for (int e = 0; e < E; e++) fprintf(cf, "%d\n", h_end[e] - (e ? h_end[e - 1] : 0));
        fclose(cf);
    }

    /* weights: one arena, [gate E | up E | down E], each [NI, H] or [H, NI] */
    const size_t per = (size_t)H * NI, wbytes = 3 * (size_t)E * per * 2;
    uint16_t *hw = (uint16_t *)malloc(per * 2), *arena;
    CK(cudaMalloc(&arena, wbytes));
    for (int m = 0; m < 3 * E; m++) {
        for (size_t i = 0; i < per; i++) hw[i] = clef_f32_to_bf16(0.03f * frand());
        CK(cudaMemcpy(arena + (size_t)m * per, hw, per * 2, cudaMemcpyHostToDevice));
    }
    const uint16_t *ptrs[3 * E];
    static ck_tmap maps[3 * E];
    int maps_ok = 1; /* the tensor maps of the TMA kernel (sm_90a builds, a driver that encodes them) */
    for (int m = 0; m < 3 * E; m++) {
        ptrs[m] = arena + (size_t)m * per;
        const int gu = m < 2 * E;
        maps_ok &= ck_tmap_bf16(&maps[m], ptrs[m], gu ? NI : H, gu ? H : NI, gu ? 64 : 128) == cudaSuccess;
    }
    const uint16_t **d_ptrs;
    ck_tmap *d_maps;
    CK(cudaMalloc(&d_ptrs, sizeof ptrs));
    CK(cudaMemcpy(d_ptrs, ptrs, sizeof ptrs, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_maps, sizeof maps));
    CK(cudaMemcpy(d_maps, maps, sizeof maps, cudaMemcpyHostToDevice));

    /* activations [T, H * split] ([hi | lo] rows), SwiGLU rows, outputs */
    uint16_t *ha = (uint16_t *)malloc((size_t)T * H * split * 2), *A, *Hb;
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < H; c++) {
            const float v = frand();
            const uint16_t hi = clef_f32_to_bf16(v);
            ha[t * H * split + c] = hi;
            if (split == 2) ha[t * H * split + H + c] = clef_f32_to_bf16(v - clef_bf16_to_f32(hi));
        }
    float *Y;
    CK(cudaMalloc(&A, (size_t)T * H * split * 2));
    CK(cudaMemcpy(A, ha, (size_t)T * H * split * 2, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&Hb, (size_t)TK * NI * split * 2));
    CK(cudaMalloc(&Y, (size_t)TK * H * 4));

    ck_gemm_args g, d;
    memset(&g, 0, sizeof g);
    memset(&d, 0, sizeof d);
    g.mode = CK_GEMM_GATEUP, g.A = A, g.lda = H * split, g.K = H, g.split = split, g.N = NI;
    g.W0 = d_ptrs, g.W1 = d_ptrs + E, g.tile_expert = t_exp, g.tile_row0 = t_row, g.expert_end = end;
    g.n_tiles = n_tiles, g.max_tiles = max_tiles, g.row_src = row_tok, g.H = Hb, g.big = big;
    g.wmaps = d_maps, g.n_experts = E;
    d.mode = CK_GEMM_DOWN, d.A = Hb, d.lda = NI * split, d.K = NI, d.split = split, d.N = H;
    d.W0 = d_ptrs + 2 * E, d.tile_expert = t_exp, d.tile_row0 = t_row, d.expert_end = end, d.n_tiles = n_tiles;
    d.max_tiles = max_tiles, d.Y = Y, d.ldy = H, d.big = big, d.wmaps = d_maps + 2 * E, d.n_experts = E;

    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("expert_gemm: %s; %d tokens x top-%d = %lld expert rows, %d tiles of %lld rows, split %d\n", prop.name, T,
           TOPK, (long long)TK, tiles, (long long)BM, split);
    const int sm90 = ck_wgmma_built() && prop.major == 9 && prop.minor == 0;
    enum { NK = 6 };
    const struct {
        const char *name;
        kernel_fn fn;
        int ok;
    } ks[NK] = {{"mma.sync", ck_gemm, 1},
                {"tma", ck_gemm_tma, maps_ok && sm90 && big != 1},
                {"wgmma", ck_gemm_wgmma, sm90 && big != 2},
                {"wgmma_ws", ck_gemm_wgmma_ws, maps_ok && sm90 && big == 1},
                {"ws_pairs", ws_pairs, maps_ok && sm90 && big == 1},
                {"ws_nofnc", ws_nofence, maps_ok && sm90 && big == 1 && getenv("EXPERT_GEMM_NOFENCE") != NULL}};
    const double fl_gu = 2.0 * (double)TK * H * 2 * NI, fl_dn = 2.0 * (double)TK * NI * H;
    const size_t hn = (size_t)TK * NI * split, yn = (size_t)TK * H;
    uint16_t *h_ref = (uint16_t *)malloc(hn * 2), *h_got = (uint16_t *)malloc(hn * 2);
    float *y_ref = (float *)malloc(yn * 4), *y_got = (float *)malloc(yn * 4);
    int32_t *h_trow = (int32_t *)malloc((size_t)max_tiles * 4), *h_texp = (int32_t *)malloc((size_t)max_tiles * 4);
    CK(cudaMemcpy(h_trow, t_row, (size_t)max_tiles * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h_texp, t_exp, (size_t)max_tiles * 4, cudaMemcpyDeviceToHost));
    int differ = 0;
    for (int i = 0; i < NK; i++) {
        if (!ks[i].ok) continue;
        double gb, gm, db, dm;
        CK(cudaMemset(Hb, 0xFF, hn * 2)); /* NaN: an element left unwritten differs */
        time_kernel(ks[i].fn, &g, reps, &gb, &gm);
        CK(cudaMemcpy(i ? h_got : h_ref, Hb, hn * 2, cudaMemcpyDeviceToHost));
        /* the down product of every kernel reads the reference kernel's SwiGLU rows, so a difference in
         * gate+up does not show again in down */
        if (i) CK(cudaMemcpy(Hb, h_ref, hn * 2, cudaMemcpyHostToDevice));
        CK(cudaMemset(Y, 0xFF, yn * 4));
        time_kernel(ks[i].fn, &d, reps, &db, &dm);
        CK(cudaMemcpy(i ? y_got : y_ref, Y, yn * 4, cudaMemcpyDeviceToHost));
        char same[160] = "(reference)";
        if (i) {
            const size_t dh = count_diff(h_got, h_ref, hn, 2, TK, NI * split, h_trow, h_texp, tiles, ks[i].name, "gate+up");
            const size_t dy = count_diff(y_got, y_ref, yn, 4, TK, H, h_trow, h_texp, tiles, ks[i].name, "down");
            differ |= dh || dy;
            if (dh || dy)
                snprintf(same, sizeof same, "DIFFERS from mma.sync: %zu of %zu gate+up values, %zu of %zu down values", dh,
                         hn, dy, yn);
            else
                snprintf(same, sizeof same, "bitwise = mma.sync");
        }
        printf("  %-9s gate+up %8.1f us (mean %8.1f, %5.2f TB/s, %4.0f TFLOP/s)  down %8.1f us (mean %8.1f, %5.2f TB/s, "
               "%4.0f TFLOP/s)  %s\n",
               ks[i].name, gb, gm, wbytes * 2.0 / 3.0 / (gb * 1e-6) / 1e12, fl_gu / (gb * 1e-6) / 1e12, db, dm,
               wbytes / 3.0 / (db * 1e-6) / 1e12, fl_dn / (db * 1e-6) / 1e12, same);
        fflush(stdout);
    }
    /* a timing-dependent fault shows as runs that differ from each other: the warp-specialised kernels
     * again, gate+up and down, outputs poisoned before each run (down reads the reference rows) */
    const int ws_kernels[3] = {1, 3, 4}; /* tma, wgmma_ws, ws_pairs */
    for (int wi = 0; wi < 3; wi++) {
        const int i = ws_kernels[wi];
        if (!ks[i].ok) continue;
        size_t lo = (size_t)-1, hi = 0;
        int nbad = 0;
        for (int r = 0; r < reruns; r++) {
            CK(cudaMemset(Hb, 0xFF, hn * 2));
            CK(ks[i].fn(&g, 0));
            CK(cudaMemcpy(h_got, Hb, hn * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(Hb, h_ref, hn * 2, cudaMemcpyHostToDevice));
            CK(cudaMemset(Y, 0xFF, yn * 4));
            CK(ks[i].fn(&d, 0));
            CK(cudaMemcpy(y_got, Y, yn * 4, cudaMemcpyDeviceToHost));
            size_t dh = 0;
            for (size_t j = 0; j < hn; j++) dh += h_got[j] != h_ref[j];
            for (size_t j = 0; j < yn; j++) dh += memcmp(&y_got[j], &y_ref[j], 4) != 0;
            nbad += dh != 0, lo = dh < lo ? dh : lo, hi = dh > hi ? dh : hi;
        }
        printf("  %s gate+up and down, %d more runs: %d differ from mma.sync (%zu to %zu values each)\n", ks[i].name,
               reruns, nbad, reruns ? lo : 0, hi);
        differ |= nbad != 0;
    }
    free(h_trow), free(h_texp);
    free(idx), free(hw), free(ha), free(h_ref), free(h_got), free(y_ref), free(y_got);
    cudaFree(d_idx), cudaFree(ix), cudaFree(arena), cudaFree(d_ptrs), cudaFree(d_maps), cudaFree(A), cudaFree(Hb);
    cudaFree(Y);
    return differ;
}
