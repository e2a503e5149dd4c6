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
#include "util/workq.h"

enum { SERVER_LOADING, SERVER_READY, SERVER_FAILED };

/* Where a connection is, for its deadlines (conns.c sweeps them). */
typedef enum clef_conn_phase {
    CONN_WAITING, /* waiting for a request head: since accept, or since the previous answer was sent;
                     closed --header-timeout-s after `since` */
    CONN_BODY,    /* head in, body arriving (or being read and dropped before a held refusal);
                     closed --body-timeout-s + body_bytes / --min-body-rate-kb after `since` */
    CONN_BUSY     /* body complete (being decided, answered), or the server itself is waiting
                     (a body-budget wait): no deadline of ours (libmicrohttpd's idle timeout
                     covers a reader that stalls) */
} clef_conn_phase;

/* One TCP connection, from libmicrohttpd's accept to its close: the socket
 * context of MHD_OPTION_NOTIFY_CONNECTION (allocated and freed by conns.c,
 * on the polling thread that owns the connection).  The fields below the
 * lock line are guarded by clef_conns.lock; the others are set once at
 * accept. */
typedef struct clef_conn {
    struct MHD_Connection *c;
    int fd;                /* its socket, valid until the close notification (which precedes close(2)) */
    int over_limit;        /* accepted past --max-connections: each of its requests is answered 503 */
    char addr[64];         /* numeric client address, for the log */
    /* -- guarded by clef_conns.lock -- */
    clef_conn_phase phase;
    double since;          /* clef_now() when the phase's clock started (see clef_conn_phase) */
    double held_at;        /* while a server-side wait interrupts CONN_BODY: when it began, else 0 */
    size_t body_bytes;     /* body bytes received in CONN_BODY (they extend its deadline) */
    int cut;               /* the sweeper shut the socket down: the connection is closing */
    struct clef_conn *prev, *next;
} clef_conn;

/* Every open connection and the deadlines' settings (conns.c). */
typedef struct clef_conns {
    pthread_mutex_t lock;
    pthread_cond_t tick;      /* the sweeper's sleep (CLOCK_MONOTONIC); signalled to stop it */
    clef_conn *head;
    size_t open;              /* connections open now (admitted + over the limit) */
    size_t admitted;          /* of those, the ones within --max-connections */
    size_t limit;             /* --max-connections */
    uint64_t over_limit_total, cut_headers_total, cut_body_total;
    double header_timeout_s;  /* 0 = no deadline */
    double body_timeout_s;    /* 0 = no deadline */
    double min_body_rate;     /* bytes per second that extend the body deadline; 0 = none */
    size_t unlogged[2];       /* cuts not yet logged, [0] request heads, [1] bodies (a line per LOG_EVERY_S) */
    char unlogged_addr[2][64]; /* the first address of each */
    double logged_at[2];
    int sweeper_running, sweeper_stop;
    pthread_t sweeper;
} clef_conns;

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
    size_t open_limit;        /* libmicrohttpd's own connection limit (>= opt.max_connections): what the
                                 open-file limit allows, so the excess is answered 503 instead of reset */
    clef_conns conns;         /* open connections, their deadlines and the --max-connections count */
    clef_workq *deciders;     /* decisions off the polling threads: parse, validate, encode, submit */
    clef_workq *body_waiter;  /* one thread serving body-budget waits in arrival order */
} clef_server;

/* One line on stderr, "\n" added, written with a single write(2) so lines
 * from the polling, worker and sweeper threads never interleave (longer
 * than 1 KiB: cut).  server.c. */
void clef_server_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- conns.c ---------------------------------------------------------- */

/* Settings from s->opt (limits, deadlines); the lists empty.  Call once. */
void clef_conns_init(clef_server *s);
/* Start / stop the sweeper thread (every 100 ms it shuts down the sockets
 * of connections past their deadline: shutdown(2), so libmicrohttpd sees
 * the end of the stream and closes them on its own thread).  start returns
 * 0, or -1 when the thread cannot be created.  stop is idempotent. */
int clef_conns_start_sweeper(clef_server *s);
void clef_conns_stop_sweeper(clef_server *s);
void clef_conns_destroy(clef_server *s);
/* MHD_OPTION_NOTIFY_CONNECTION: track accepts and closes. */
void clef_server_notify_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                                   enum MHD_ConnectionNotificationCode code);
/* The connection's state (NULL only if libmicrohttpd never announced it). */
clef_conn *clef_conn_of(struct MHD_Connection *c);
/* Phase changes (each restarts the phase's clock). */
void clef_conn_set_phase(clef_server *s, clef_conn *k, clef_conn_phase phase);
/* The body is complete: CONN_BUSY.  Returns -1 when the sweeper already cut
 * the connection (the caller then closes it instead of deciding). */
int clef_conn_body_complete(clef_server *s, clef_conn *k);
/* `n` more body bytes arrived. */
void clef_conn_body_bytes(clef_server *s, clef_conn *k, size_t n);
/* A server-side wait interrupts CONN_BODY (its time does not count against
 * the client); unhold resumes the body's clock where it stopped. */
void clef_conn_hold(clef_server *s, clef_conn *k);
void clef_conn_unhold(clef_server *s, clef_conn *k);

typedef struct clef_conn_stats {
    size_t open, admitted;
    uint64_t over_limit_total, cut_headers_total, cut_body_total;
} clef_conn_stats;
void clef_conns_stats(clef_server *s, clef_conn_stats *out);

/* libmicrohttpd access handler and completion callback (routes.c). */
enum MHD_Result clef_server_handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                   const char *version, const char *upload_data, size_t *upload_data_size,
                                   void **con_cls);
void clef_server_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe);

#endif
