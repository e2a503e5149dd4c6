/* device.h — choosing the backend a model runs on from a device string
 * ("cpu", "cuda", "cuda:N"), as `--device` and clef_engine_options.device
 * give it. */
#ifndef CLEF_BACKEND_DEVICE_H
#define CLEF_BACKEND_DEVICE_H

#include "backend/backend.h"
#include "backend/numerics.h"
#include "util/err.h"

/* A new backend for `device`:
 *   "cpu"              the CPU reference backend with n_threads threads (<= 0: all cores)
 *   "cuda", "cuda:N"   CUDA device 0 / N (backend/cuda/cuda.h)
 *   NULL or ""         automatic: the CLEF_DEVICE environment variable when set, else CUDA
 *                      device 0 when a GPU is present, else the CPU
 * `numerics` is the GPU's numeric mode (backend/numerics.h; CLEF_NUMERICS_ENV
 * = the environment, else fast); the CPU backend computes in f32 whatever it
 * says.  Returns NULL + err: 500 with param "device" for an unknown name, a
 * device that does not exist, or a build without CUDA.  Release with
 * be->ops->destroy(be) (or hand it to clef_model_create_on with own = 1). */
clef_backend *clef_backend_open(const char *device, int n_threads, clef_numerics numerics, clef_err *err);

/* The name the automatic choice resolves to now ("cuda" or "cpu"). */
const char *clef_backend_auto_name(void);

#endif
