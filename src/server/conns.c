/* conns.c — every open connection of `clef serve`: the --max-connections
 * count, the request-head and body deadlines, and the sweeper that
 * enforces them.  See server_internal.h.
 *
 * libmicrohttpd's own connection timeout is an idle timeout: every byte
 * restarts it, so a client that trickles a header byte every few seconds
 * keeps its connection forever.  Here a deadline starts with the phase
 * (accept or the previous answer for a request head, the head for its body)
 * and bytes do not restart it; a body's deadline grows only by what the
 * bytes received are worth at --min-body-rate-kb.  The sweeper shuts the
 * socket down (shutdown(2), from its own thread, under the lock that the
 * close notification also takes, so the descriptor is still the
 * connection's); libmicrohttpd then reads the end of the stream on the
 * connection's polling thread and closes it there as if the client had. */
#define _GNU_SOURCE /* pthread_setname_np */
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/server_internal.h"
#include "util/timer.h"

#define SWEEP_INTERVAL_MS 100
/* At most one log line per phase this often: an idle keep-alive connection
 * closed at --header-timeout-s is routine, and a flood of slow clients must
 * not become a flood of log lines (the metrics count every one). */
#define LOG_EVERY_S 10.0

void clef_conns_init(clef_server *s) {
    clef_conns *t = &s->conns;
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->tick, &ca);
    pthread_condattr_destroy(&ca);
    t->limit = s->opt.max_connections;
    t->header_timeout_s = s->opt.header_timeout_s;
    t->body_timeout_s = s->opt.body_timeout_s;
    t->min_body_rate = (double)s->opt.min_body_rate;
}

void clef_conns_destroy(clef_server *s) {
    clef_conns_stop_sweeper(s);
    pthread_cond_destroy(&s->conns.tick);
    pthread_mutex_destroy(&s->conns.lock);
}

static void numeric_address(struct MHD_Connection *c, char *out, size_t cap) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    snprintf(out, cap, "-");
    if (!ci || !ci->client_addr) return;
    socklen_t len = ci->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    if (getnameinfo(ci->client_addr, len, out, (socklen_t)cap, NULL, 0, NI_NUMERICHOST) != 0) snprintf(out, cap, "-");
}

void clef_server_notify_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                                   enum MHD_ConnectionNotificationCode code) {
    clef_server *s = cls;
    clef_conns *t = &s->conns;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        clef_conn *k = clef_xcalloc(1, sizeof *k);
        k->c = c;
        const union MHD_ConnectionInfo *fd = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        k->fd = fd ? fd->connect_fd : -1;
        numeric_address(c, k->addr, sizeof k->addr);
        k->phase = CONN_WAITING;
        k->since = clef_now();
        pthread_mutex_lock(&t->lock);
        if (t->admitted < t->limit) {
            t->admitted++;
        } else {
            k->over_limit = 1;
            t->over_limit_total++;
        }
        t->open++;
        k->next = t->head;
        if (t->head) t->head->prev = k;
        t->head = k;
        pthread_mutex_unlock(&t->lock);
        *socket_context = k;
        return;
    }
    clef_conn *k = *socket_context;
    if (!k) return;
    pthread_mutex_lock(&t->lock);
    if (k->prev) k->prev->next = k->next;
    else t->head = k->next;
    if (k->next) k->next->prev = k->prev;
    t->open--;
    if (!k->over_limit) t->admitted--;
    pthread_mutex_unlock(&t->lock);
    free(k);
    *socket_context = NULL;
}

clef_conn *clef_conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void clef_conn_set_phase(clef_server *s, clef_conn *k, clef_conn_phase phase) {
    if (!k) return;
    pthread_mutex_lock(&s->conns.lock);
    k->phase = phase;
    k->since = clef_now();
    k->held_at = 0;
    k->body_bytes = 0;
    pthread_mutex_unlock(&s->conns.lock);
}

int clef_conn_body_complete(clef_server *s, clef_conn *k) {
    if (!k) return 0;
    pthread_mutex_lock(&s->conns.lock);
    int cut = k->cut;
    k->phase = CONN_BUSY;
    k->held_at = 0;
    pthread_mutex_unlock(&s->conns.lock);
    return cut ? -1 : 0;
}

void clef_conn_body_bytes(clef_server *s, clef_conn *k, size_t n) {
    if (!k || !n) return;
    pthread_mutex_lock(&s->conns.lock);
    k->body_bytes += n;
    pthread_mutex_unlock(&s->conns.lock);
}

void clef_conn_hold(clef_server *s, clef_conn *k) {
    if (!k) return;
    pthread_mutex_lock(&s->conns.lock);
    if (k->phase == CONN_BODY) {
        k->phase = CONN_BUSY;
        k->held_at = clef_now();
    }
    pthread_mutex_unlock(&s->conns.lock);
}

void clef_conn_unhold(clef_server *s, clef_conn *k) {
    if (!k) return;
    pthread_mutex_lock(&s->conns.lock);
    if (k->held_at > 0) {
        k->since += clef_now() - k->held_at; /* the wait was the server's, not the client's */
        k->held_at = 0;
        k->phase = CONN_BODY;
    }
    pthread_mutex_unlock(&s->conns.lock);
}

void clef_conns_stats(clef_server *s, clef_conn_stats *out) {
    clef_conns *t = &s->conns;
    pthread_mutex_lock(&t->lock);
    *out = (clef_conn_stats){t->open, t->admitted, t->over_limit_total, t->cut_headers_total, t->cut_body_total};
    pthread_mutex_unlock(&t->lock);
}

/* Past its deadline at `now`? */
static int overdue(const clef_conns *t, const clef_conn *k, double now) {
    if (k->cut) return 0;
    if (k->phase == CONN_WAITING) return t->header_timeout_s > 0 && now > k->since + t->header_timeout_s;
    if (k->phase == CONN_BODY) {
        if (t->body_timeout_s <= 0) return 0;
        double grace = t->min_body_rate > 0 ? (double)k->body_bytes / t->min_body_rate : 0;
        return now > k->since + t->body_timeout_s + grace;
    }
    return 0;
}

/* Log the cuts of phase `body` (0 request heads, 1 bodies) not yet logged
 * if LOG_EVERY_S has passed since the last such line, or `force`.  Called
 * with the lock held (a line is one write(2) to stderr). */
static void log_cuts(clef_conns *t, int body, double now, int force) {
    size_t n = t->unlogged[body];
    if (!n || (!force && now - t->logged_at[body] < LOG_EVERY_S)) return;
    t->unlogged[body] = 0;
    t->logged_at[body] = now;
    if (!body) {
        clef_server_say("clef serve: closed %zu connection%s with no complete request head %.0f s after the connection or "
                 "its previous answer (--header-timeout-s; idle keep-alive ones included; the first from %s)",
                 n, n == 1 ? "" : "s", t->header_timeout_s, t->unlogged_addr[0]);
        return;
    }
    char extra[96] = "";
    if (t->min_body_rate > 0) snprintf(extra, sizeof extra, " + 1 s per %.0f KiB received", t->min_body_rate / 1024);
    clef_server_say("clef serve: closed %zu connection%s whose request body was not complete %.0f s%s after its head "
             "(--body-timeout-s, --min-body-rate-kb; the first from %s)",
             n, n == 1 ? "" : "s", t->body_timeout_s, extra, t->unlogged_addr[1]);
}

/* One sweep: cut what is overdue; at most every LOG_EVERY_S, one log line
 * per phase for the cuts since the last line. */
static void sweep(clef_server *s) {
    clef_conns *t = &s->conns;
    pthread_mutex_lock(&t->lock);
    double now = clef_now();
    for (clef_conn *k = t->head; k; k = k->next) {
        if (!overdue(t, k, now)) continue;
        k->cut = 1;
        if (k->fd >= 0) shutdown(k->fd, SHUT_RDWR);
        int body = k->phase != CONN_WAITING;
        if (!t->unlogged[body]++) snprintf(t->unlogged_addr[body], sizeof t->unlogged_addr[body], "%s", k->addr);
        if (body) t->cut_body_total++;
        else t->cut_headers_total++;
    }
    log_cuts(t, 0, now, 0);
    log_cuts(t, 1, now, 0);
    pthread_mutex_unlock(&t->lock);
}

static void *sweeper_main(void *arg) {
    clef_server *s = arg;
    clef_conns *t = &s->conns;
    pthread_mutex_lock(&t->lock);
    while (!t->sweeper_stop) {
        struct timespec next;
        clock_gettime(CLOCK_MONOTONIC, &next);
        next.tv_nsec += SWEEP_INTERVAL_MS * 1000000L;
        if (next.tv_nsec >= 1000000000L) next.tv_sec++, next.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&t->tick, &t->lock, &next);
        if (t->sweeper_stop) break;
        pthread_mutex_unlock(&t->lock);
        sweep(s);
        pthread_mutex_lock(&t->lock);
    }
    log_cuts(t, 0, clef_now(), 1); /* what the last lines did not cover */
    log_cuts(t, 1, clef_now(), 1);
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

int clef_conns_start_sweeper(clef_server *s) {
    clef_conns *t = &s->conns;
    if (t->header_timeout_s <= 0 && t->body_timeout_s <= 0) return 0; /* nothing to enforce */
    if (pthread_create(&t->sweeper, NULL, sweeper_main, s) != 0) return -1;
    pthread_setname_np(t->sweeper, "clef-sweeper");
    t->sweeper_running = 1;
    return 0;
}

void clef_conns_stop_sweeper(clef_server *s) {
    clef_conns *t = &s->conns;
    if (!t->sweeper_running) return;
    pthread_mutex_lock(&t->lock);
    t->sweeper_stop = 1;
    pthread_cond_signal(&t->tick);
    pthread_mutex_unlock(&t->lock);
    pthread_join(t->sweeper, NULL);
    t->sweeper_running = 0;
}
