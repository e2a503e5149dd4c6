/* clef.h — the public C API of clef.
 *
 *   clef_engine_options opt = {.model_dir = "path/to/clef-omni", .truncate_state = 1};
 *   clef_err err;
 *   clef_engine *e = clef_engine_open(&opt, &err);
 *   clef_buf out = {0};
 *   if (clef_engine_decide(e, body, body_len, 0, &out, &err) == 0) puts(out.data);
 *   else fprintf(stderr, "%d %s: %s\n", err.status, err.type, err.message);
 *   clef_buf_free(&out);
 *   clef_engine_close(e);
 *
 * See src/engine/engine.h for the full contract.
 */
#ifndef CLEF_CLEF_H
#define CLEF_CLEF_H

#include "engine/engine.h"

#endif
