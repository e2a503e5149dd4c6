/* cpu.h — the reference CPU backend: f32 compute, its own blocked GEMM for
 * weight products and attention (cpu_gemm.h: AVX-512 / AVX2+FMA / plain C
 * kernels picked at run time, bitwise the same; weights decoded a tile at a
 * time, never whole), OpenMP threads for everything.
 */
#ifndef CLEF_BACKEND_CPU_CPU_H
#define CLEF_BACKEND_CPU_CPU_H

#include "backend/backend.h"

/* Most OpenMP threads a CPU backend accepts.  libgomp crashes (SIGSEGV in
 * GOMP_parallel) when a parallel region asks for tens of thousands. */
#define CLEF_CPU_MAX_THREADS 1024

/* A CPU backend using `n_threads` OpenMP threads (<= 0: all cores, or
 * OMP_NUM_THREADS when that is set).  Release with
 * be->ops->destroy(be).  Returns NULL + err (500) on allocation failure, or
 * when more than CLEF_CPU_MAX_THREADS threads are asked for (directly or
 * through OMP_NUM_THREADS). */
clef_backend *clef_backend_cpu_create(int n_threads, clef_err *err);

#endif
