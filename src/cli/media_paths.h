/* media_paths.h — `clef decide` accepts file paths for media (issue 6).
 *
 * A request's `images`, `audio` and `videos` are arrays of base64 data URLs
 * on the wire (SPEC §9); the server never reads paths or fetches URLs.  The
 * CLI is a local tool, so there an entry that is not a `data:` URL names a
 * file (relative to the current directory): it is read, its MIME type is
 * sniffed from its bytes (or, failing that, its extension), and it is
 * replaced by "data:<mime>;base64,<payload>" before the body reaches the
 * engine.  Everything else about the request is left for the engine to
 * judge, so a path request and its data-URL twin get identical answers.
 */
#ifndef CLEF_CLI_MEDIA_PATHS_H
#define CLEF_CLI_MEDIA_PATHS_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

/* MIME type of a media file of request field `field` ("images", "audio" or
 * "videos"): from its leading bytes (PNG, JPEG, WebP, GIF, BMP, TIFF, WAV,
 * FLAC, AIFF, Ogg, MP3, AAC, Matroska/WebM, MP4/MOV, AVI), else from the extension
 * of `path` (case-insensitive), else "application/octet-stream" (which the
 * engine then refuses with "MIME type ... is not image/...").  Containers that
 * hold sound or pictures (Matroska, MP4, Ogg) get the field's top-level type
 * ("audio/mp4" in `audio`, "video/mp4" in `videos`).  Returns a static string. */
const char *cli_media_mime(const uint8_t *data, size_t size, const char *path, const char *field);

/* Rewrite the request `body` (`len` bytes): every string entry of `images`,
 * `audio` and `videos` that does not start with "data:" (any case) is read as
 * a file of at most `max_file_bytes` and replaced by its data URL.
 *
 * Returns 0 with *out = a malloc'd NUL-terminated body (*out_len bytes)
 * when something was replaced, or *out = NULL when the body is to be sent
 * unchanged (no paths, or a body the engine will reject anyway: invalid
 * JSON, not an object, a media field of the wrong type).  The rewritten body
 * is the parsed document rendered back in its own key order, which parses
 * to the same tree.
 *
 * Errors: -1 with 400 invalid_request, param "<field>[<i>]":
 *   "images[0]: cannot read file 'x.png': No such file or directory"
 *   "images[0]: file 'big.png' is 300000000 bytes, more than the limit of 268435456"
 *   "images[0]: URLs are not fetched; give a file path or a data URL" */
int cli_media_inline_paths(const char *body, size_t len, size_t max_file_bytes, char **out, size_t *out_len,
                           clef_err *err);

#endif
