/* embedded.h — static files compiled into the binary (CMakeLists.txt runs
 * cmake/embed.cmake over them): bytes [len], NUL-terminated (the NUL not
 * counted), read-only, static storage. */
#ifndef CLEF_SERVER_EMBEDDED_H
#define CLEF_SERVER_EMBEDDED_H

#include <stddef.h>

/* src/server/ui/index.html: the playground page served at GET / */
extern const unsigned char clef_embed_index_html[];
extern const size_t clef_embed_index_html_len;

/* src/server/openapi.json: the OpenAPI 3.1 document served at GET /openapi.json */
extern const unsigned char clef_embed_openapi_json[];
extern const size_t clef_embed_openapi_json_len;

#endif
