/* server_internal.h — state shared by server.c (lifecycle) and routes.c
 * (the request handler).  Not a public header. */
#ifndef CLEF_SERVER_SERVER_INTERNAL_H
#define CLEF_SERVER_SERVER_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "server/metrics.h"
#include "server/server.h"
#include "util/budget.h"
#include "util/buf.h"

enum { SERVER_LOADING, SERVER_READY, SERVER_FAILED };

typedef struct clef_server {
    clef_server_options opt;  /* defaults filled in */
    char listed_name[256];    /* --served-model-name, else CLEF_SERVER_DEFAULT_LISTED_NAME */
    char release_date[16];    /* config.json's "release_date" (YYYY-MM-DD), or "" = null */
    struct MHD_Daemon *daemon;
    clef_metrics *metrics;
    clef_budget *media_budget; /* decoded media (opt.limits.media.budget points here) */
    clef_budget *body_budget;  /* request bodies held in memory (routes.c) */
    atomic_int state;         /* SERVER_*; engine and sched are valid once READY (release/acquire) */
    clef_engine *engine;
    clef_scheduler *sched;
    clef_err load_err;        /* why loading failed (state FAILED) */
    atomic_int stopping;      /* 1 after SIGINT/SIGTERM: new requests get 503 + Connection: close */
    atomic_long in_flight;    /* requests between their first call and completion */
    atomic_long deciding;     /* of those, requests whose body is complete (being decided or answered):
                                 the ones a stop waits for */
    pthread_t loader;
} clef_server;

/* libmicrohttpd access handler and completion callback (routes.c). */
enum MHD_Result clef_server_handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                   const char *version, const char *upload_data, size_t *upload_data_size,
                                   void **con_cls);
void clef_server_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe);

#endif
