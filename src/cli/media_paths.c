/* media_paths.c — file paths in a request's media fields become data URLs
 * (see media_paths.h).  Only the CLI does this: the server never touches
 * the filesystem on a request's behalf. */
#include "cli/media_paths.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "json/json.h"
#include "util/buf.h"

static const char *const FIELDS[] = {"images", "audio", "videos"};

/* A container that carries sound or pictures: its MIME type for each
 * top-level type (`audio` field -> audio/..., anything else -> video/...). */
typedef struct container {
    const char *audio, *video;
} container;

static const container MATROSKA = {"audio/x-matroska", "video/x-matroska"};
static const container WEBM = {"audio/webm", "video/webm"};
static const container MP4 = {"audio/mp4", "video/mp4"};
static const container OGG = {"audio/ogg", "video/ogg"};

static const char *pick(const container *c, const char *field) {
    return strcmp(field, "audio") == 0 ? c->audio : c->video;
}

static int has(const uint8_t *d, size_t n, size_t off, const char *magic, size_t m) {
    return n >= off + m && memcmp(d + off, magic, m) == 0;
}

/* Matroska's DocType sits in the EBML header, within its first bytes. */
static int matroska_is_webm(const uint8_t *d, size_t n) {
    size_t lim = n < 64 ? n : 64;
    for (size_t i = 0; i + 4 <= lim; i++)
        if (memcmp(d + i, "webm", 4) == 0) return 1;
    return 0;
}

/* The type named by the file's leading bytes, or NULL. */
static const char *sniff(const uint8_t *d, size_t n, const char *field) {
    if (has(d, n, 0, "\x89PNG\r\n\x1a\n", 8)) return "image/png";
    if (has(d, n, 0, "\xff\xd8\xff", 3)) return "image/jpeg";
    if (has(d, n, 0, "GIF87a", 6) || has(d, n, 0, "GIF89a", 6)) return "image/gif";
    if (has(d, n, 0, "RIFF", 4)) {
        if (has(d, n, 8, "WEBP", 4)) return "image/webp";
        if (has(d, n, 8, "WAVE", 4)) return "audio/wav";
        if (has(d, n, 8, "AVI ", 4)) return "video/x-msvideo";
    }
    if (has(d, n, 0, "FORM", 4) && (has(d, n, 8, "AIFF", 4) || has(d, n, 8, "AIFC", 4))) return "audio/aiff";
    if (has(d, n, 0, "II*\0", 4) || has(d, n, 0, "MM\0*", 4)) return "image/tiff";
    if (has(d, n, 0, "fLaC", 4)) return "audio/flac";
    if (has(d, n, 0, "OggS", 4)) return pick(&OGG, field);
    if (has(d, n, 0, "\x1a\x45\xdf\xa3", 4)) return pick(matroska_is_webm(d, n) ? &WEBM : &MATROSKA, field);
    if (has(d, n, 4, "ftyp", 4)) return has(d, n, 8, "qt  ", 4) ? "video/quicktime" : pick(&MP4, field);
    if (has(d, n, 0, "ID3", 3)) return "audio/mpeg";
    if (n >= 2 && d[0] == 0xff && (d[1] & 0xf6) == 0xf0) return "audio/aac";   /* ADTS sync, layer 0 */
    if (n >= 2 && d[0] == 0xff && (d[1] & 0xe0) == 0xe0) return "audio/mpeg";  /* MPEG audio frame sync */
    if (has(d, n, 0, "BM", 2) && n >= 26) return "image/bmp";
    return NULL;
}

/* The type named by the extension of `path`, or NULL. */
static const char *by_extension(const char *path, const char *field) {
    const char *dot = strrchr(path, '.');
    if (!dot || strchr(dot, '/')) return NULL;
    static const struct {
        const char *ext, *mime;
    } plain[] = {{"png", "image/png"},   {"jpg", "image/jpeg"},  {"jpeg", "image/jpeg"}, {"jpe", "image/jpeg"},
                 {"webp", "image/webp"}, {"gif", "image/gif"},   {"bmp", "image/bmp"},   {"tif", "image/tiff"},
                 {"tiff", "image/tiff"}, {"wav", "audio/wav"},   {"wave", "audio/wav"},  {"mp3", "audio/mpeg"},
                 {"flac", "audio/flac"}, {"opus", "audio/ogg"},  {"oga", "audio/ogg"},   {"m4a", "audio/mp4"},
                 {"aac", "audio/aac"},   {"aif", "audio/aiff"},  {"aiff", "audio/aiff"},   {"mka", "audio/x-matroska"}, {"mov", "video/quicktime"},
                 {"avi", "video/x-msvideo"}, {"m4v", "video/mp4"}};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        if (strcasecmp(dot + 1, plain[i].ext) == 0) return plain[i].mime;
    static const struct {
        const char *ext;
        const container *c;
    } boxes[] = {{"mkv", &MATROSKA}, {"webm", &WEBM}, {"mp4", &MP4}, {"ogg", &OGG}};
    for (size_t i = 0; i < sizeof boxes / sizeof boxes[0]; i++)
        if (strcasecmp(dot + 1, boxes[i].ext) == 0) return pick(boxes[i].c, field);
    return NULL;
}

const char *cli_media_mime(const uint8_t *data, size_t size, const char *path, const char *field) {
    const char *m = sniff(data, size, field);
    if (!m) m = by_extension(path, field);
    return m ? m : "application/octet-stream";
}

/* Standard-alphabet base64 with '=' padding (RFC 4648 §4), what the data URL
 * parser of media/dataurl.c accepts. */
static void base64_append(const uint8_t *d, size_t n, clef_buf *out) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    clef_buf_reserve(out, (n + 2) / 3 * 4 + 1);
    char *p = out->data + out->len;
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (uint32_t)d[i + 1] << 8 | d[i + 2];
        *p++ = A[v >> 18], *p++ = A[v >> 12 & 63], *p++ = A[v >> 6 & 63], *p++ = A[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0);
        *p++ = A[v >> 18], *p++ = A[v >> 12 & 63];
        *p++ = i + 1 < n ? A[v >> 6 & 63] : '=';
        *p++ = '=';
    }
    out->len = (size_t)(p - out->data);
    *p = '\0';
}

/* Read the file `path` (at most `max` bytes) into `data`, or fail
 * naming `param`.  The size check comes first so a huge file is not read. */
static int read_media_file(const char *param, const char *path, size_t max, clef_buf *data, clef_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return clef_fail(err, 400, CLEF_E_REQUEST, param, "%s: cannot read file '%s': %s", param, path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && (unsigned long long)st.st_size > max) {
        fclose(f);
        return clef_fail(err, 400, CLEF_E_REQUEST, param, "%s: file '%s' is %lld bytes, more than the limit of %zu", param,
                         path, (long long)st.st_size, max);
    }
    char chunk[65536];
    size_t n;
    errno = 0;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (n > max - data->len) {
            fclose(f);
            return clef_fail(err, 400, CLEF_E_REQUEST, param, "%s: file '%s' is more than the limit of %zu bytes", param,
                             path, max);
        }
        clef_buf_append(data, chunk, n);
    }
    int bad = ferror(f), e = errno; /* EISDIR for a directory */
    fclose(f);
    if (bad)
        return clef_fail(err, 400, CLEF_E_REQUEST, param, "%s: cannot read file '%s': %s", param, path,
                         e ? strerror(e) : "read error");
    return 0;
}

/* Replace *slot (a path) by the data URL of the file it names. */
static int inline_one(const char *field, size_t i, json_value **slot, size_t max, clef_err *err) {
    char param[64];
    snprintf(param, sizeof param, "%s[%zu]", field, i);
    const char *path = (*slot)->str;
    if ((*slot)->len != strlen(path))
        return clef_fail(err, 400, CLEF_E_REQUEST, param, "%s: a file path must not contain NUL bytes", param);
    if (strncasecmp(path, "http://", 7) == 0 || strncasecmp(path, "https://", 8) == 0)
        return clef_fail(err, 400, CLEF_E_REQUEST, param, "%s: URLs are not fetched; give a file path or a data URL",
                         param);
    clef_buf data = {0};
    if (read_media_file(param, path, max, &data, err)) {
        clef_buf_free(&data);
        return -1;
    }
    clef_buf url = {0};
    clef_buf_printf(&url, "data:%s;base64,", cli_media_mime((const uint8_t *)data.data, data.len, path, field));
    base64_append((const uint8_t *)data.data, data.len, &url);
    clef_buf_free(&data);
    json_free(*slot);
    *slot = json_new_string(url.data, url.len);
    clef_buf_free(&url);
    return 0;
}

/* Inline every path of the document; *changed counts the replacements. */
static int inline_all(json_value *root, size_t max, size_t *changed, clef_err *err) {
    for (size_t f = 0; f < sizeof FIELDS / sizeof FIELDS[0]; f++) {
        json_value *m = (json_value *)json_get(root, FIELDS[f]);
        if (!m || m->type != JSON_ARRAY) continue;
        for (size_t i = 0; i < m->n; i++) {
            json_value *it = m->items[i];
            /* non-strings are left for the engine's 400 */
            if (it->type != JSON_STRING || (it->len >= 5 && strncasecmp(it->str, "data:", 5) == 0)) continue;
            if (inline_one(FIELDS[f], i, &m->items[i], max, err)) return -1;
            (*changed)++;
        }
    }
    return 0;
}

int cli_media_inline_paths(const char *body, size_t len, size_t max_file_bytes, char **out, size_t *out_len,
                           clef_err *err) {
    *out = NULL;
    *out_len = 0;
    clef_err perr;
    json_value *root = json_parse(body, len, &perr);
    if (!root) return 0; /* the engine reports the JSON error */
    size_t changed = 0;
    int rc = root->type == JSON_OBJECT ? inline_all(root, max_file_bytes, &changed, err) : 0;
    if (rc == 0 && changed) {
        clef_buf b = {0};
        json_render_opts(root, 0, &b); /* keep key order: questions are answered in request order */
        *out = b.data;
        *out_len = b.len;
    }
    json_free(root);
    return rc;
}
