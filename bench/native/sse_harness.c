/*
 * sse_harness: a stub OpenAI-compatible streaming engine and a closed-loop SSE load generator,
 * both single-threaded epoll loops in C, so that a benchmark of the Python sidecar (pinned to
 * one core) is never limited by the engine behind it or the clients in front of it.
 *
 * Build:  cc -O2 -Wall -Wextra -std=gnu11 -o sse_harness sse_harness.c -lm
 *
 * sse_harness engine --port P [--pace-us 20000] [--lockstep] [--model stub-model]
 *                    [--metrics-pad N]
 *   Serves on 127.0.0.1:P (HTTP/1.1 keep-alive): GET /health, GET /metrics (vLLM gauges, after
 *   N histogram-bucket lines shaped like vLLM's, so that a scrape costs what a real one does),
 *   GET /v1/models, POST /v1/chat/completions (scans the body for "max_tokens", "stream" and
 *   "include_usage"; no JSON parser). A stream is a role event at once, then one token event
 *   every pace from the moment the request was read (or, with --lockstep, at every global
 *   decode tick after that moment), an optional usage event, and [DONE]; each SSE event is one
 *   HTTP chunk. Tokens are never sent early; a slow reader makes them late, never lost.
 *   Prints "ready <port>" on stdout once listening; exits 0 on SIGTERM/SIGINT.
 *
 * sse_harness load --url http://IP:PORT/PATH [--concurrency 256] [--tokens 64]
 *                  [--duration-s 20] [--warmup-s 2] [--tenants 16] [--think-us 0]
 *                  [--seed 1] [--drain-s 30] [--ramp-s 0.8*warmup]
 *   C clients, each on its own keep-alive connection, stream chat completions of N tokens in a
 *   closed loop, thinking U(0, think-us) before each request; each client's first request
 *   waits U(0, ramp-s) so that the clients do not move as one herd. Requests sent inside
 *   [start+warmup, start+warmup+duration) are "measured" (TTFT, TTFB); tokens and completed
 *   requests count when they arrive inside that window. A client pauses 50 ms after an error.
 *   Prints one JSON object on stdout:
 *     {"concurrency","tokens","window_s","requests_done","tokens_in_window","tokens_per_s",
 *      "errors":{name:count},"ttft_us":{n,mean,p50,p90,p99,max},"ttfb_us":{...},
 *      "gap_us":{...},"cpu_s":{"user","system"}}
 *   Errors are counted over the whole run. Exit 2 on bad arguments or no connection in 10 s.
 *
 * sse_harness pipe --port P --upstream-port Q
 *   A byte pipe on 127.0.0.1:P to 127.0.0.1:Q, one upstream connection per client connection,
 *   no HTTP parsing: the latency floor of any single-core relay on this machine.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
#define HAVE_EPOLL_PWAIT2 1
#endif

#define MAX_EVENTS 1024
#define MAX_HEADER 65536           /* request/response head larger than this is refused */
#define MAX_BODY (8 << 20)         /* largest request body the engine accepts */
#define MAX_PENDING_OUT (1 << 20)  /* stop parsing pipelined requests beyond this much unsent */
#define MAX_BATCH 64               /* events one stream emits per wake (bounds catch-up bursts) */
#define MARK "\"content\":\"t"     /* a token event's delta; the role event has "content":"" */
#define MARK_LEN 12

/* ---------------------------------------------------------------- common ---------------- */

static volatile sig_atomic_t g_stop;
static sigset_t g_waitmask; /* the mask during epoll waits: the only place SIGTERM/SIGINT land */

static void on_signal(int sig) { (void)sig; g_stop = 1; }

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void die2(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die2(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("sse_harness: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n);
    if (!p) { perror("realloc"); exit(1); }
    return p;
}

/* A byte buffer: bytes [off, len) are pending; consumed bytes are reclaimed lazily. */
struct buf { char *p; size_t off, len, cap; };

static size_t buf_pending(const struct buf *b) { return b->len - b->off; }

static void buf_reserve(struct buf *b, size_t extra)
{
    if (b->off == b->len) b->off = b->len = 0;
    if (b->len + extra <= b->cap) return;
    if (b->off > 0) { /* slide pending bytes down before growing */
        memmove(b->p, b->p + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
        if (b->len + extra <= b->cap) return;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
}

static void buf_add(struct buf *b, const void *d, size_t n)
{
    buf_reserve(b, n);
    memcpy(b->p + b->len, d, n);
    b->len += n;
}

static void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    buf_reserve(b, 256); /* usually enough: one formatting pass */
    va_start(ap, fmt);
    size_t n = (size_t)vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n >= b->cap - b->len) {
        buf_reserve(b, n + 1);
        va_start(ap, fmt);
        vsnprintf(b->p + b->len, n + 1, fmt, ap);
        va_end(ap);
    }
    b->len += n;
}

/* Binary min-heap of timers. Entries are never removed early: a stale one (its gen no longer
 * matches its owner's) is skipped when popped, which keeps cancel O(1). */
struct hent { int64_t due; int id; uint32_t gen; };
struct heap { struct hent *a; size_t n, cap; };

static void heap_push(struct heap *h, struct hent e)
{
    if (h->n == h->cap) {
        h->cap = h->cap ? h->cap * 2 : 1024;
        h->a = xrealloc(h->a, h->cap * sizeof *h->a);
    }
    size_t i = h->n++;
    while (i > 0 && h->a[(i - 1) / 2].due > e.due) {
        h->a[i] = h->a[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->a[i] = e;
}

static struct hent heap_pop(struct heap *h)
{
    struct hent top = h->a[0], last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && h->a[c + 1].due < h->a[c].due) c++;
        if (h->a[c].due >= last.due) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n > 0) h->a[i] = last;
    return top;
}

/* Wait at most timeout_us (<0: forever). epoll_pwait2 keeps sub-millisecond paces honest;
 * without it the timeout is rounded up so a wake is never early (and never spins). The signal
 * mask is lifted only while waiting, so a SIGTERM can't slip in between the g_stop check and
 * the wait (and then sleep forever). */
static int wait_events(int ep, struct epoll_event *ev, int64_t timeout_us)
{
#ifdef HAVE_EPOLL_PWAIT2
    static bool no_pwait2;
    if (!no_pwait2) {
        struct timespec ts = {timeout_us / 1000000, (timeout_us % 1000000) * 1000};
        int n = epoll_pwait2(ep, ev, MAX_EVENTS, timeout_us < 0 ? NULL : &ts, &g_waitmask);
        if (n >= 0 || errno != ENOSYS) return n;
        no_pwait2 = true; /* old kernel: fall back below */
    }
#endif
    int ms = timeout_us < 0 ? -1 : (int)((timeout_us + 999) / 1000);
    return epoll_pwait(ep, ev, MAX_EVENTS, ms, &g_waitmask);
}

static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: epoll_wait returns EINTR and the loop exits */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &g_waitmask);
}

static double arg_num(const char *name, const char *v, double lo, double hi)
{
    char *end;
    if (!v) die2("%s needs a value", name);
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= lo && x <= hi)) die2("bad value for %s: %s", name, v);
    return x;
}

static void set_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* ---------------------------------------------------------------- engine ---------------- */

struct conn {
    int fd;
    uint32_t gen;           /* bumped on every schedule and close: older heap entries are stale */
    uint32_t sock_gen;      /* bumped per accepted socket: tags its epoll events */
    bool want_out, want_close;
    struct buf in, out;
    bool streaming, usage;  /* the stream being served (one request at a time) */
    long n, next, prompt, first_tick;
    int64_t t0;
    char head[320];         /* `data: {"id":...,"choices":` shared by the stream's events */
    int head_len;
};

static struct {
    int ep, lfd;
    int64_t pace, epoch;
    bool lockstep;
    long metrics_pad;
    const char *model;
    struct conn **conns; /* indexed by fd; structs are kept for reuse so gen keeps counting */
    int nconns;
    struct heap timers;
    long active;
    uint64_t seq;
} E;

static uint64_t ep_tag(int fd, uint32_t gen) { return (uint64_t)gen << 32 | (uint32_t)fd; }

static void conn_close(struct conn *c)
{
    if (c->fd < 0) return;
    close(c->fd); /* also removes it from epoll */
    if (c->streaming) E.active--;
    c->streaming = c->want_out = c->want_close = false;
    c->in.off = c->in.len = c->out.off = c->out.len = 0;
    c->fd = -1;
    c->gen++;
}

static void conn_watch(struct conn *c, bool want_out)
{
    if (c->want_out == want_out) return;
    struct epoll_event ev = {.events = EPOLLIN | (want_out ? EPOLLOUT : 0)};
    ev.data.u64 = ep_tag(c->fd, c->sock_gen);
    epoll_ctl(E.ep, EPOLL_CTL_MOD, c->fd, &ev);
    c->want_out = want_out;
}

/* Send what is pending; on EAGAIN wait for EPOLLOUT. Returns -1 if the connection closed. */
static int conn_flush(struct conn *c)
{
    while (buf_pending(&c->out)) {
        ssize_t n = send(c->fd, c->out.p + c->out.off, buf_pending(&c->out), MSG_NOSIGNAL);
        if (n > 0) { c->out.off += (size_t)n; continue; }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            conn_watch(c, true);
            return 0;
        }
        conn_close(c);
        return -1;
    }
    c->out.off = c->out.len = 0;
    conn_watch(c, false);
    return 0;
}

static void respond(struct conn *c, int code, const char *reason, const char *ctype,
                    const char *body, size_t len)
{
    buf_printf(&c->out, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s\r\n",
               code, reason, ctype, len, c->want_close ? "Connection: close\r\n" : "");
    buf_add(&c->out, body, len);
}

static void respond_error(struct conn *c, int code, const char *reason, const char *type,
                          const char *msg)
{
    char body[256];
    int n = snprintf(body, sizeof body, "{\"error\":{\"message\":\"%s\",\"type\":\"%s\","
                     "\"code\":%d}}", msg, type, code);
    respond(c, code, reason, "application/json", body, (size_t)n);
}

/* One SSE event as one HTTP chunk: "<hex>\r\n<event>\r\n". */
static void add_event(struct conn *c, const char *ev, int len)
{
    char hex[16];
    int h = snprintf(hex, sizeof hex, "%x\r\n", len);
    buf_reserve(&c->out, (size_t)(h + len + 2));
    char *p = c->out.p + c->out.len;
    memcpy(p, hex, (size_t)h);
    memcpy(p + h, ev, (size_t)len);
    memcpy(p + h + len, "\r\n", 2);
    c->out.len += (size_t)(h + len + 2);
}

/* An event is the stream's shared head plus a formatted tail (one snprintf per token). */
static void emit(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(struct conn *c, const char *fmt, ...)
{
    char ev[1024];
    va_list ap;
    memcpy(ev, c->head, (size_t)c->head_len);
    va_start(ap, fmt);
    int n = vsnprintf(ev + c->head_len, sizeof ev - (size_t)c->head_len, fmt, ap);
    va_end(ap);
    add_event(c, ev, c->head_len + n);
}

static void emit_token(struct conn *c)
{
    long i = c->next++;
    emit(c, "[{\"index\":0,\"delta\":{\"content\":\"t%ld \"},\"finish_reason\":%s}]}\n\n",
         i, i == c->n - 1 ? "\"length\"" : "null");
}

static void emit_tail(struct conn *c)
{
    if (c->usage)
        emit(c, "[],\"usage\":{\"prompt_tokens\":%ld,\"completion_tokens\":%ld,"
             "\"total_tokens\":%ld}}\n\n", c->prompt, c->n, c->prompt + c->n);
    add_event(c, "data: [DONE]\n\n", 14);
    buf_add(&c->out, "0\r\n\r\n", 5);
    c->streaming = false;
    E.active--;
}

/* When token i is due: staggered, pace after pace from the stream's own t0; lockstep, at the
 * global ticks (epoch + k*pace) that follow t0, like an engine's shared decode step. */
static int64_t token_due(const struct conn *c, long i)
{
    if (E.lockstep && E.pace > 0) return E.epoch + (c->first_tick + i) * E.pace;
    return c->t0 + (i + 1) * E.pace;
}

static void schedule(struct conn *c)
{
    heap_push(&E.timers, (struct hent){token_due(c, c->next), c->fd, ++c->gen});
}

static int serve_input(struct conn *c, int64_t now);

/* Emit every event due by now (never one early), send, and plan the next wake. No events are
 * made while earlier ones are unsent: under backpressure tokens are late, not piled up. */
static int stream_step(struct conn *c, int64_t now)
{
    if (buf_pending(&c->out)) return 0; /* the drain resumes us */
    int batch = 0;
    while (c->next < c->n && token_due(c, c->next) <= now && batch++ < MAX_BATCH) emit_token(c);
    if (c->next == c->n) emit_tail(c);
    if (conn_flush(c) < 0) return -1;
    if (buf_pending(&c->out)) return 0;
    if (c->streaming) { schedule(c); return 0; }
    return serve_input(c, now); /* the stream ended: next pipelined request, or close */
}

/* Find `"key":` and return a pointer just past it and any spaces, or NULL. */
static const char *json_after(const char *body, size_t len, const char *key)
{
    const char *p = memmem(body, len, key, strlen(key));
    if (!p) return NULL;
    p += strlen(key);
    while (p < body + len && (*p == ' ' || *p == '\t')) p++;
    return p;
}

static bool json_true(const char *body, size_t len, const char *key)
{
    const char *p = json_after(body, len, key);
    return p && body + len - p >= 4 && memcmp(p, "true", 4) == 0;
}

static long json_max_tokens(const char *body, size_t len)
{
    const char *p = json_after(body, len, "\"max_tokens\":");
    if (!p || p >= body + len || *p < '0' || *p > '9') return 16;
    long v = 0;
    while (p < body + len && *p >= '0' && *p <= '9' && v <= 100000) v = v * 10 + (*p++ - '0');
    return v < 1 ? 1 : v > 100000 ? 100000 : v;
}

static void start_stream(struct conn *c, const char *body, size_t len, int64_t now)
{
    c->streaming = true;
    E.active++;
    c->head_len = snprintf(c->head, sizeof c->head, "data: {\"id\":\"chatcmpl-h-%llu\","
                           "\"object\":\"chat.completion.chunk\",\"created\":%lld,"
                           "\"model\":\"%s\",\"choices\":", (unsigned long long)++E.seq,
                           (long long)time(NULL), E.model);
    c->n = json_max_tokens(body, len);
    c->next = 0;
    c->usage = json_true(body, len, "\"include_usage\":");
    c->prompt = len / 4 ? (long)(len / 4) : 1;
    c->t0 = now;
    c->first_tick = E.pace > 0 ? (now - E.epoch) / E.pace + 1 : 0;
    buf_printf(&c->out, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
               "Transfer-Encoding: chunked\r\n%s\r\n",
               c->want_close ? "Connection: close\r\n" : "");
    emit(c, "[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
         "\"finish_reason\":null}]}\n\n");
    schedule(c);
}

static void complete_at_once(struct conn *c, const char *body, size_t len)
{
    long n = json_max_tokens(body, len), prompt = len / 4 ? (long)(len / 4) : 1;
    struct buf b = {0};
    buf_printf(&b, "{\"id\":\"chatcmpl-h-%llu\",\"object\":\"chat.completion\",\"created\":%lld,"
               "\"model\":\"%s\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
               "\"content\":\"", (unsigned long long)++E.seq, (long long)time(NULL), E.model);
    for (long i = 0; i < n; i++) buf_printf(&b, "t%ld ", i);
    buf_printf(&b, "\"},\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":%ld,"
               "\"completion_tokens\":%ld,\"total_tokens\":%ld}}", prompt, n, prompt + n);
    respond(c, 200, "OK", "application/json", b.p, b.len);
    free(b.p);
}

static void route(struct conn *c, const char *method, const char *path, size_t plen,
                  const char *body, size_t blen, int64_t now)
{
    char text[1024];
    bool get = strcmp(method, "GET") == 0;
#define PATH_IS(s) (plen == strlen(s) && memcmp(path, s, plen) == 0)
    if (get && PATH_IS("/health")) {
        respond(c, 200, "OK", "text/plain", "ok", 2);
    } else if (get && PATH_IS("/metrics")) {
        struct buf b = {0};
        /* vLLM's own exposition is ~600 lines, mostly histogram buckets (57 KB measured). */
        for (long i = 0; i < E.metrics_pad; i++) {
            if (i % 20 == 0)
                buf_printf(&b, "# HELP vllm:pad_%ld_seconds A latency histogram.\n"
                           "# TYPE vllm:pad_%ld_seconds histogram\n", i / 20, i / 20);
            buf_printf(&b, "vllm:pad_%ld_seconds_bucket{engine=\"0\",le=\"%ld.0\","
                       "model_name=\"%s\"} %ld.0\n", i / 20, i % 20, E.model, i);
        }
        buf_printf(&b, "# TYPE vllm:num_requests_running gauge\n"
                   "vllm:num_requests_running{model_name=\"%s\"} %ld\n"
                   "# TYPE vllm:num_requests_waiting gauge\n"
                   "vllm:num_requests_waiting{model_name=\"%s\"} 0\n"
                   "# TYPE vllm:kv_cache_usage_perc gauge\n"
                   "vllm:kv_cache_usage_perc{model_name=\"%s\"} 0.1\n",
                   E.model, E.active, E.model, E.model);
        respond(c, 200, "OK", "text/plain; version=0.0.4", b.p, b.len);
        free(b.p);
    } else if (get && PATH_IS("/v1/models")) {
        int n = snprintf(text, sizeof text,
                         "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\"}]}",
                         E.model);
        respond(c, 200, "OK", "application/json", text, (size_t)n);
    } else if (strcmp(method, "POST") == 0 && PATH_IS("/v1/chat/completions")) {
        if (json_true(body, blen, "\"stream\":")) start_stream(c, body, blen, now);
        else complete_at_once(c, body, blen);
    } else {
        respond_error(c, 404, "Not Found", "NotFoundError", "not found");
    }
#undef PATH_IS
}

/* Refuse a malformed request and close after the answer: framing can't be trusted past it. */
static int refuse(struct conn *c, int code, const char *reason, const char *msg)
{
    c->want_close = true;
    respond_error(c, code, reason, "BadRequestError", msg);
    c->in.off = c->in.len = 0;
    return 1;
}

static bool header_is(const char *line, size_t nlen, const char *name)
{
    return nlen == strlen(name) && strncasecmp(line, name, nlen) == 0;
}

/* Handle one request if fully buffered: 1 handled, 0 incomplete. */
static int parse_request(struct conn *c, int64_t now)
{
    char *p = c->in.p + c->in.off;
    size_t avail = buf_pending(&c->in);
    char *end = memmem(p, avail, "\r\n\r\n", 4);
    if (!end && avail > MAX_HEADER) return refuse(c, 431, "Header Too Large", "head too long");
    if (!end) return 0;
    char *eol = memmem(p, (size_t)(end + 2 - p), "\r\n", 2);
    char *sp1 = memchr(p, ' ', (size_t)(eol - p));
    char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
    if (!sp2 || sp1 - p > 15) return refuse(c, 400, "Bad Request", "bad request line");
    char method[16];
    memcpy(method, p, (size_t)(sp1 - p));
    method[sp1 - p] = 0;
    const char *path = sp1 + 1;
    const char *q = memchr(path, '?', (size_t)(sp2 - path));
    size_t plen = (size_t)((q ? q : sp2) - path);
    long long clen = -1;
    bool chunked = false, close_hdr = false;
    for (char *line = eol + 2; line < end + 2;) {
        char *le = memmem(line, (size_t)(end + 2 - line), "\r\n", 2);
        char *colon = memchr(line, ':', (size_t)(le - line));
        if (colon) {
            size_t nlen = (size_t)(colon - line);
            char *v = colon + 1;
            while (v < le && (*v == ' ' || *v == '\t')) v++;
            if (header_is(line, nlen, "content-length")) clen = strtoll(v, NULL, 10);
            else if (header_is(line, nlen, "transfer-encoding")) chunked = true;
            else if (header_is(line, nlen, "connection"))
                close_hdr = le - v >= 5 && strncasecmp(v, "close", 5) == 0;
        }
        line = le + 2;
    }
    if (chunked) return refuse(c, 411, "Length Required", "chunked bodies are not supported");
    if (clen < 0 && !strcmp(method, "POST"))
        return refuse(c, 411, "Length Required", "Content-Length required");
    if (clen > MAX_BODY) return refuse(c, 413, "Payload Too Large", "body too large");
    size_t head = (size_t)(end + 4 - p), blen = clen > 0 ? (size_t)clen : 0;
    if (avail < head + blen) return 0;
    c->want_close = close_hdr;
    route(c, method, path, plen, p + head, blen, now);
    c->in.off += head + blen;
    return 1;
}

/* Serve buffered requests one at a time until one streams, then send; close if asked to. */
static int serve_input(struct conn *c, int64_t now)
{
    while (!c->streaming && !c->want_close && buf_pending(&c->out) < MAX_PENDING_OUT)
        if (!parse_request(c, now)) break;
    if (conn_flush(c) < 0) return -1;
    if (!c->streaming && c->want_close && !buf_pending(&c->out)) { conn_close(c); return -1; }
    return 0;
}

static void on_conn_event(struct conn *c, uint32_t events, int64_t now)
{
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        for (;;) {
            buf_reserve(&c->in, 16384);
            ssize_t n = read(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len);
            if (n > 0) c->in.len += (size_t)n;
            if (n > 0 && buf_pending(&c->in) <= MAX_BODY + MAX_HEADER) continue;
            if (n > 0) break; /* a client flooding us: closed below */
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
            conn_close(c); /* EOF or reset: the stream ends now */
            return;
        }
        if (buf_pending(&c->in) > MAX_BODY + MAX_HEADER) { conn_close(c); return; }
    }
    if (events & EPOLLOUT) {
        if (conn_flush(c) < 0 || buf_pending(&c->out)) return;
        if (c->streaming) { stream_step(c, now); return; }
    }
    if (!c->streaming) serve_input(c, now);
}

static void accept_all(void)
{
    for (;;) {
        int fd = accept4(E.lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return; /* EAGAIN, or a transient error (EMFILE): retried on next wake */
        set_nodelay(fd);
        if (fd >= E.nconns) {
            int n = E.nconns ? E.nconns : 1024;
            while (n <= fd) n *= 2;
            E.conns = xrealloc(E.conns, (size_t)n * sizeof *E.conns);
            memset(E.conns + E.nconns, 0, (size_t)(n - E.nconns) * sizeof *E.conns);
            E.nconns = n;
        }
        if (!E.conns[fd]) E.conns[fd] = calloc(1, sizeof(struct conn));
        struct conn *c = E.conns[fd];
        c->fd = fd;
        c->sock_gen++;
        struct epoll_event ev = {.events = EPOLLIN};
        ev.data.u64 = ep_tag(fd, c->sock_gen);
        epoll_ctl(E.ep, EPOLL_CTL_ADD, fd, &ev);
    }
}

/* Pop every timer due by now; entries whose gen no longer matches are stale and skipped. */
static void run_due(int64_t now)
{
    while (E.timers.n && E.timers.a[0].due <= now) {
        struct hent e = heap_pop(&E.timers);
        struct conn *c = E.conns[e.id];
        if (c->fd == e.id && c->gen == e.gen && c->streaming) stream_step(c, now);
    }
}

static int engine_listen(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 4096) < 0)
        die2("cannot listen on 127.0.0.1:%d: %s", port, strerror(errno));
    return fd;
}

static int engine_main(int argc, char **argv)
{
    int port = -1;
    E.pace = 20000;
    E.model = "stub-model";
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--port")) { port = (int)arg_num(a, v, 1, 65535); i++; }
        else if (!strcmp(a, "--pace-us")) { E.pace = (int64_t)arg_num(a, v, 0, 60e6); i++; }
        else if (!strcmp(a, "--lockstep")) E.lockstep = true;
        else if (!strcmp(a, "--metrics-pad")) { E.metrics_pad = (long)arg_num(a, v, 0, 1e5); i++; }
        else if (!strcmp(a, "--model") && v && strlen(v) < 200) { E.model = v; i++; }
        else die2("engine: bad argument %s", a);
    }
    if (port < 0) die2("engine: --port is required");
    install_signals();
    E.lfd = engine_listen(port);
    E.ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = UINT64_MAX};
    epoll_ctl(E.ep, EPOLL_CTL_ADD, E.lfd, &ev);
    E.epoch = now_us();
    printf("ready %d\n", port);
    fflush(stdout);
    struct epoll_event evs[MAX_EVENTS];
    while (!g_stop) {
        int64_t timeout = E.timers.n ? E.timers.a[0].due - now_us() : -1;
        int n = wait_events(E.ep, evs, E.timers.n && timeout < 0 ? 0 : timeout);
        int64_t now = now_us();
        for (int i = 0; i < n; i++) {
            if (evs[i].data.u64 == UINT64_MAX) { accept_all(); continue; }
            int fd = (int)(uint32_t)evs[i].data.u64;
            struct conn *c = E.conns[fd];
            if (c->fd == fd && c->sock_gen == (uint32_t)(evs[i].data.u64 >> 32))
                on_conn_event(c, evs[i].events, now);
        }
        run_due(now_us());
    }
    return 0;
}

/* ---------------------------------------------------------------- load ------------------ */

enum cstate { C_WAIT, C_CONNECTING, C_SENDING, C_HEAD, C_BODY, C_DONE };
enum body { B_CHUNKED, B_LENGTH, B_EOF };
enum chunk { CH_SIZE, CH_EXT, CH_DATA, CH_DATA_END, CH_TRAILER };

struct client {
    int fd, idx;
    uint32_t sock_gen;     /* tags epoll events so a late one for an old socket is ignored */
    uint32_t timer_gen;    /* only the latest timer of a client counts */
    bool started;          /* has had its ramp delay */
    bool out_armed;        /* EPOLLOUT is on (a request did not fit in one send) */
    enum cstate st;
    uint64_t rng;
    struct buf req;        /* this client's request bytes, built once */
    size_t sent;
    char head[8192];
    size_t hlen;
    int status;
    bool close_after, measured, got_data;
    enum body bm;
    enum chunk ch;
    long long remain;      /* bytes left in this chunk's data, or in a Content-Length body */
    int line_len;          /* bytes on the current trailer line */
    char carry[MARK_LEN];
    int carry_len;
    long tokens, read_tokens;
    int64_t t_send, t_last_tok;
};

struct samples { double *v; size_t n, cap; };

static struct {
    struct sockaddr_in addr;
    int ep, conc, tenants;
    long tokens;
    int64_t think, ramp, start, w_start, w_end, drain;
    struct client *cl;
    struct heap timers;
    int live;              /* clients not yet done */
    bool ever_connected;
    long done, tok_window;
    struct samples ttft, ttfb, gap;
    struct { char name[32]; long n; } err[64];
    int nerr;
} L;

static void add_sample(struct samples *s, double v)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 4096;
        s->v = xrealloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = v;
}

static void count_error(const char *name)
{
    for (int i = 0; i < L.nerr; i++)
        if (!strcmp(L.err[i].name, name)) { L.err[i].n++; return; }
    if (L.nerr == 64) return;
    snprintf(L.err[L.nerr].name, sizeof L.err[0].name, "%s", name);
    L.err[L.nerr++].n = 1;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static bool in_window(int64_t t) { return t >= L.w_start && t < L.w_end; }

static void wait_until(struct client *cl, int64_t due)
{
    cl->st = C_WAIT;
    heap_push(&L.timers, (struct hent){due, cl->idx, ++cl->timer_gen});
}

static void client_finish(struct client *cl)
{
    if (cl->fd >= 0) close(cl->fd);
    cl->fd = -1;
    cl->st = C_DONE;
    L.live--;
}

/* Drop the connection; come back in 50 ms (unless the window is over). */
static void client_drop(struct client *cl, const char *error, int64_t now)
{
    if (error) count_error(error);
    if (cl->fd >= 0) close(cl->fd);
    cl->fd = -1;
    if (now >= L.w_end && L.ever_connected) client_finish(cl);
    else wait_until(cl, now + 50000); /* before any connection, retry until the 10 s limit */
}

static void client_watch(struct client *cl, uint32_t events, int op)
{
    struct epoll_event ev = {.events = events};
    ev.data.u64 = (uint64_t)cl->sock_gen << 32 | (uint32_t)cl->idx;
    epoll_ctl(L.ep, op, cl->fd, &ev);
}

static void client_send(struct client *cl, int64_t now);

static void client_connect(struct client *cl, int64_t now)
{
    if (now >= L.w_end && L.ever_connected) { client_finish(cl); return; }
    cl->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (cl->fd < 0) { client_drop(cl, "socket", now); return; }
    set_nodelay(cl->fd);
    cl->sock_gen++;
    int r = connect(cl->fd, (struct sockaddr *)&L.addr, sizeof L.addr);
    if (r < 0 && errno != EINPROGRESS) {
        client_drop(cl, L.ever_connected ? "connect" : NULL, now);
        return;
    }
    cl->st = C_CONNECTING;
    client_watch(cl, EPOLLOUT, EPOLL_CTL_ADD);
}

/* Think (if asked) before the next request; stop at the window's end. */
static void client_next(struct client *cl, int64_t now)
{
    if (now >= L.w_end) { client_finish(cl); return; }
    if (L.think > 0) wait_until(cl, now + (int64_t)(splitmix(&cl->rng) % (uint64_t)(L.think + 1)));
    else client_send(cl, now);
}

static void client_write(struct client *cl, int64_t now)
{
    while (cl->sent < cl->req.len) {
        ssize_t n = send(cl->fd, cl->req.p + cl->sent, cl->req.len - cl->sent, MSG_NOSIGNAL);
        if (n > 0) { cl->sent += (size_t)n; continue; }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            client_watch(cl, EPOLLIN | EPOLLOUT, EPOLL_CTL_MOD);
            cl->out_armed = true;
            return;
        }
        client_drop(cl, "closed", now);
        return;
    }
    cl->st = C_HEAD;
    if (cl->out_armed) client_watch(cl, EPOLLIN, EPOLL_CTL_MOD);
    cl->out_armed = false;
}

static void client_send(struct client *cl, int64_t now)
{
    if (now >= L.w_end) { client_finish(cl); return; }
    cl->st = C_SENDING;
    cl->sent = cl->hlen = 0;
    cl->tokens = cl->read_tokens = 0;
    cl->carry_len = 0;
    cl->got_data = false;
    cl->t_last_tok = 0;
    cl->t_send = now;
    cl->measured = in_window(now);
    client_write(cl, now);
}

/* Token statistics for the markers of one read, all stamped with the read's time. */
static void account_tokens(struct client *cl, int64_t t)
{
    long k = cl->read_tokens;
    if (!k) return;
    cl->read_tokens = 0;
    if (cl->tokens == 0 && cl->measured) add_sample(&L.ttft, (double)(t - cl->t_send));
    if (in_window(t)) {
        L.tok_window += k;
        if (cl->t_last_tok) add_sample(&L.gap, (double)(t - cl->t_last_tok));
        for (long i = 1; i < k; i++) add_sample(&L.gap, 0.0); /* tokens that came in one read */
    }
    cl->tokens += k;
    cl->t_last_tok = t;
}

/* Count markers in chunk data; the carry holds the last MARK_LEN-1 bytes so that a marker
 * split across reads or chunks is still found (exactly once). */
static void on_data(struct client *cl, const char *d, size_t n, int64_t t)
{
    if (!n || cl->status != 200) return;
    if (!cl->got_data) {
        cl->got_data = true;
        if (cl->measured) add_sample(&L.ttfb, (double)(t - cl->t_send));
    }
    char edge[2 * MARK_LEN];
    size_t take = n < MARK_LEN - 1 ? n : MARK_LEN - 1;
    memcpy(edge, cl->carry, (size_t)cl->carry_len);
    memcpy(edge + cl->carry_len, d, take);
    size_t elen = (size_t)cl->carry_len + take;
    for (size_t i = 0; i < (size_t)cl->carry_len && i + MARK_LEN <= elen; i++)
        if (!memcmp(edge + i, MARK, MARK_LEN)) cl->read_tokens++;
    for (const char *p = d; (p = memmem(p, (size_t)(d + n - p), MARK, MARK_LEN)); p += MARK_LEN)
        cl->read_tokens++;
    /* the new carry: the last MARK_LEN-1 bytes of carry + d */
    size_t keep = elen < MARK_LEN - 1 ? elen : MARK_LEN - 1;
    memcpy(cl->carry, n >= MARK_LEN - 1 ? d + n - keep : edge + elen - keep, keep);
    cl->carry_len = (int)keep;
}

static void response_done(struct client *cl, int64_t t)
{
    account_tokens(cl, t);
    bool ok = cl->status == 200;
    if (ok && cl->tokens != L.tokens) { count_error("wrong_token_count"); ok = false; }
    else if (ok && in_window(t)) L.done++;
    if (cl->close_after || cl->bm == B_EOF) { client_drop(cl, NULL, t); return; }
    if (ok) client_next(cl, t);
    else wait_until(cl, t + 50000 + L.think); /* no hot loop against a refusing server */
}

/* Parse the status line and headers once the blank line is in; set up body framing. */
static bool parse_head(struct client *cl)
{
    cl->head[cl->hlen] = 0;
    if (sscanf(cl->head, "HTTP/1.%*d %d", &cl->status) != 1) return false;
    cl->bm = B_EOF;
    cl->close_after = false;
    for (char *eol = strstr(cl->head, "\r\n"); eol[2] != '\r'; eol = strstr(eol + 2, "\r\n")) {
        char *h = eol + 2, *next = strstr(h, "\r\n");
        if (!strncasecmp(h, "content-length:", 15) && cl->bm != B_CHUNKED) {
            cl->bm = B_LENGTH;
            cl->remain = strtoll(h + 15, NULL, 10);
        } else if (!strncasecmp(h, "transfer-encoding:", 18)
                   && memmem(h, (size_t)(next - h), "chunked", 7)) {
            cl->bm = B_CHUNKED;
            cl->ch = CH_SIZE;
            cl->remain = 0;
        } else if (!strncasecmp(h, "connection:", 11)) {
            cl->close_after = !strncasecmp(h + 11 + strspn(h + 11, " "), "close", 5);
        }
    }
    if (cl->status != 200) {
        char name[32];
        snprintf(name, sizeof name, "http_%d", cl->status);
        count_error(name);
    }
    return true;
}

static int hex_digit(char b)
{
    if (b >= '0' && b <= '9') return b - '0';
    if ((b | 32) >= 'a' && (b | 32) <= 'f') return (b | 32) - 'a' + 10;
    return -1;
}

/* Feed chunked body bytes, chunk sizes and all, to on_data; sets *done at the last chunk's end. */
static void feed_chunked(struct client *cl, const char *d, size_t n, int64_t t, bool *done)
{
    for (size_t i = 0; i < n && !*done;) {
        char b = d[i];
        if (cl->ch == CH_DATA) {
            size_t take = (size_t)cl->remain < n - i ? (size_t)cl->remain : n - i;
            on_data(cl, d + i, take, t);
            i += take;
            cl->remain -= (long long)take;
            if (!cl->remain) cl->ch = CH_DATA_END;
            continue;
        }
        i++;
        if (cl->ch == CH_SIZE && hex_digit(b) >= 0) {
            cl->remain = cl->remain * 16 + hex_digit(b);
        } else if (cl->ch == CH_SIZE || cl->ch == CH_EXT) { /* ";ext", spaces, CR up to the LF */
            cl->ch = b != '\n' ? CH_EXT : cl->remain ? CH_DATA : CH_TRAILER;
            cl->line_len = 0;
        } else if (cl->ch == CH_DATA_END) { /* the CRLF after the data */
            if (b == '\n') cl->ch = CH_SIZE, cl->remain = 0;
        } else if (b == '\n') { /* trailer lines until an empty one: "0\r\n\r\n" ends here */
            *done = cl->line_len == 0;
            cl->line_len = 0;
        } else if (b != '\r') {
            cl->line_len++;
        }
    }
}

/* Feed one read's bytes to the response parser. */
static void client_feed(struct client *cl, const char *d, size_t n, int64_t t)
{
    if (cl->st == C_HEAD) {
        size_t room = sizeof cl->head - 1 - cl->hlen, take = n < room ? n : room;
        size_t from = cl->hlen > 3 ? cl->hlen - 3 : 0;
        memcpy(cl->head + cl->hlen, d, take);
        cl->hlen += take;
        char *end = memmem(cl->head + from, cl->hlen - from, "\r\n\r\n", 4);
        if (!end) { if (!room) client_drop(cl, "bad_response", t); return; }
        size_t used = (size_t)(end + 4 - cl->head) - (cl->hlen - take);
        cl->hlen = (size_t)(end + 4 - cl->head);
        if (!parse_head(cl)) { client_drop(cl, "bad_response", t); return; }
        cl->st = C_BODY;
        d += used;
        n -= used;
    }
    if (cl->st != C_BODY) { if (n) client_drop(cl, "bad_response", t); return; }
    bool done = false;
    if (cl->bm == B_CHUNKED) feed_chunked(cl, d, n, t, &done);
    else if (cl->bm == B_LENGTH) {
        size_t take = (size_t)cl->remain < n ? (size_t)cl->remain : n;
        on_data(cl, d, take, t);
        cl->remain -= (long long)take;
        done = cl->remain == 0;
    }
    if (done) response_done(cl, t);
    else account_tokens(cl, t);
}

static char g_rbuf[1 << 18];

static void client_readable(struct client *cl, int64_t now)
{
    ssize_t n = read(cl->fd, g_rbuf, sizeof g_rbuf);
    int64_t t = now_us();
    if (n > 0) { client_feed(cl, g_rbuf, (size_t)n, t); return; }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (cl->st == C_BODY && cl->bm == B_EOF) { response_done(cl, t); return; }
    client_drop(cl, "closed", now);
}

static void on_client_event(struct client *cl, uint32_t events, int64_t now)
{
    if (cl->st == C_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(cl->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) { client_drop(cl, L.ever_connected ? "connect" : NULL, now); return; }
        L.ever_connected = true;
        client_watch(cl, EPOLLIN, EPOLL_CTL_MOD);
        if (cl->started || !L.ramp) { cl->started = true; client_next(cl, now); return; }
        /* First request after U(0, ramp): clients that all started together would otherwise
         * stay in lockstep forever (equal request lengths) and arrive as one herd. */
        cl->started = true;
        wait_until(cl, now + (int64_t)(splitmix(&cl->rng) % (uint64_t)L.ramp));
        return;
    }
    if (cl->st == C_SENDING && (events & EPOLLOUT)) client_write(cl, now);
    else if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) client_readable(cl, now);
}

static void on_timer(struct client *cl, uint32_t gen, int64_t now)
{
    if (cl->st != C_WAIT || gen != cl->timer_gen) return;
    if (cl->fd < 0) client_connect(cl, now);
    else client_send(cl, now);
}

static void build_request(struct client *cl, const char *host, int port, const char *path)
{
    char words[512];
    size_t w = 0;
    for (int i = 0; i < 32; i++)
        w += (size_t)snprintf(words + w, sizeof words - w, "%sword%d", i ? " " : "", i);
    char body[1024];
    int blen = snprintf(body, sizeof body, "{\"model\":\"stub-model\",\"messages\":[{\"role\":"
                        "\"user\",\"content\":\"%s\"}],\"max_tokens\":%ld,\"stream\":true}",
                        words, L.tokens);
    buf_printf(&cl->req, "POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
               "x-fleetwarden-tenant: tenant-%d\r\nContent-Length: %d\r\n\r\n%s",
               path, host, port, cl->idx % L.tenants, blen, body);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double quantile(const struct samples *s, double q)
{
    double pos = q * (double)(s->n - 1);
    size_t lo = (size_t)floor(pos), hi = (size_t)ceil(pos);
    return s->v[lo] + (s->v[hi] - s->v[lo]) * (pos - (double)lo);
}

static void print_dist(const char *name, struct samples *s)
{
    if (!s->n) { printf(",\"%s\":{\"n\":0}", name); return; }
    qsort(s->v, s->n, sizeof *s->v, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < s->n; i++) sum += s->v[i];
    printf(",\"%s\":{\"n\":%zu,\"mean\":%.1f,\"p50\":%.1f,\"p90\":%.1f,\"p99\":%.1f,\"max\":%.1f}",
           name, s->n, sum / (double)s->n, quantile(s, 0.5), quantile(s, 0.9), quantile(s, 0.99),
           s->v[s->n - 1]);
}

static void print_report(double window_s)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("{\"concurrency\":%d,\"tokens\":%ld,\"window_s\":%.1f,\"requests_done\":%ld,"
           "\"tokens_in_window\":%ld,\"tokens_per_s\":%.1f,\"errors\":{",
           L.conc, L.tokens, window_s, L.done, L.tok_window, (double)L.tok_window / window_s);
    for (int i = 0; i < L.nerr; i++)
        printf("%s\"%s\":%ld", i ? "," : "", L.err[i].name, L.err[i].n);
    printf("}");
    print_dist("ttft_us", &L.ttft);
    print_dist("ttfb_us", &L.ttfb);
    print_dist("gap_us", &L.gap);
    printf(",\"cpu_s\":{\"user\":%.3f,\"system\":%.3f}}\n",
           (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6,
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6);
}

/* http://A.B.C.D:PORT/path -> address and path (numeric IPv4 only). */
static void parse_url(const char *url, char *host, int *port, const char **path)
{
    if (strncmp(url, "http://", 7)) die2("--url must start with http://");
    const char *h = url + 7, *colon = strchr(h, ':'), *slash = strchr(h, '/');
    if (!colon || (slash && slash < colon) || colon - h > 15)
        die2("--url needs http://IPV4:PORT/path");
    memcpy(host, h, (size_t)(colon - h));
    host[colon - h] = 0;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (p < 1 || p > 65535 || (*end && *end != '/')) die2("bad port in --url");
    *port = (int)p;
    *path = *end ? end : "/";
    L.addr.sin_family = AF_INET;
    L.addr.sin_port = htons((uint16_t)p);
    if (inet_pton(AF_INET, host, &L.addr.sin_addr) != 1) die2("--url host must be numeric IPv4");
}

static int load_main(int argc, char **argv)
{
    const char *url = NULL, *path;
    double dur = 20, warm = 2, drain = 30, ramp = -1;
    uint64_t seed = 1;
    char host[16];
    int port;
    L.conc = 256; L.tokens = 64; L.tenants = 16;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--url")) { if (!v) die2("--url needs a value"); url = v; }
        else if (!strcmp(a, "--concurrency")) L.conc = (int)arg_num(a, v, 1, 100000);
        else if (!strcmp(a, "--tokens")) L.tokens = (long)arg_num(a, v, 1, 100000);
        else if (!strcmp(a, "--duration-s")) dur = arg_num(a, v, 0.001, 1e6);
        else if (!strcmp(a, "--warmup-s")) warm = arg_num(a, v, 0, 1e6);
        else if (!strcmp(a, "--tenants")) L.tenants = (int)arg_num(a, v, 1, 1e6);
        else if (!strcmp(a, "--think-us")) L.think = (int64_t)arg_num(a, v, 0, 60e6);
        else if (!strcmp(a, "--seed")) seed = (uint64_t)arg_num(a, v, 0, 1e15);
        else if (!strcmp(a, "--drain-s")) drain = arg_num(a, v, 0, 1e6);
        else if (!strcmp(a, "--ramp-s")) ramp = arg_num(a, v, 0, 1e6);
        else die2("load: bad argument %s", a);
        i++;
    }
    if (!url) die2("load: --url is required");
    parse_url(url, host, &port, &path);
    install_signals();
    L.ep = epoll_create1(EPOLL_CLOEXEC);
    L.start = now_us();
    L.w_start = L.start + (int64_t)(warm * 1e6);
    L.w_end = L.w_start + (int64_t)(dur * 1e6);
    L.drain = L.w_end + (int64_t)(drain * 1e6);
    L.ramp = (int64_t)((ramp < 0 ? 0.8 * warm : ramp) * 1e6);
    L.cl = calloc((size_t)L.conc, sizeof *L.cl);
    L.live = L.conc;
    for (int i = 0; i < L.conc; i++) {
        struct client *cl = &L.cl[i];
        cl->idx = i;
        cl->fd = -1;
        cl->rng = seed * 1000003u + (uint64_t)i;
        build_request(cl, host, port, path);
        client_connect(cl, L.start);
    }
    struct epoll_event evs[MAX_EVENTS];
    while (L.live > 0 && !g_stop) {
        int64_t now = now_us();
        if (now >= L.drain) {
            fprintf(stderr, "sse_harness: drain timeout, %d clients still busy\n", L.live);
            break;
        }
        if (!L.ever_connected && now - L.start > 10000000) die2("cannot connect to %s", url);
        int64_t timeout = L.drain - now;
        if (L.timers.n && L.timers.a[0].due - now < timeout) timeout = L.timers.a[0].due - now;
        int n = wait_events(L.ep, evs, timeout < 0 ? 0 : timeout);
        now = now_us();
        for (int i = 0; i < n; i++) {
            struct client *cl = &L.cl[(uint32_t)evs[i].data.u64];
            if (cl->fd >= 0 && cl->sock_gen == (uint32_t)(evs[i].data.u64 >> 32))
                on_client_event(cl, evs[i].events, now);
        }
        while (L.timers.n && L.timers.a[0].due <= now) {
            struct hent e = heap_pop(&L.timers);
            on_timer(&L.cl[e.id], e.gen, now);
        }
    }
    if (!L.ever_connected && !g_stop) die2("cannot connect to %s", url);
    print_report(dur);
    return 0;
}

/* ---------------------------------------------------------------- pipe ------------------- */

/*
 * The floor of any relay on one core: a byte pipe with no HTTP in it. Each accepted client
 * connection gets its own upstream connection, and bytes are copied both ways as they come, one
 * read and one write per wake-up, on a single epoll loop. Whatever latency this adds is what
 * the kernel, loopback TCP and the scheduler charge any relay on this machine; the sidecar's own
 * cost is what it adds beyond this.
 */
struct half { int fd; struct half *peer; struct buf out; bool closed; };

static struct { int ep, lfd; struct sockaddr_in up; } P;

static void half_watch(struct half *h, int op)
{
    uint32_t events = buf_pending(&h->out) ? EPOLLOUT : 0;
    if (!buf_pending(&h->peer->out)) events |= EPOLLIN; /* read only what the peer can take */
    struct epoll_event ev = {.events = events, .data.ptr = h};
    epoll_ctl(P.ep, op, h->fd, &ev);
}

static void pair_close(struct half *a)
{
    struct half *b = a->peer;
    close(a->fd);
    close(b->fd);
    free(a->out.p);
    free(b->out.p);
    free(a < b ? a : b); /* both halves live in one allocation */
}

/* Write what `h` holds for its socket; -1 on a dead socket. */
static int half_flush(struct half *h)
{
    while (buf_pending(&h->out)) {
        ssize_t n = send(h->fd, h->out.p + h->out.off, buf_pending(&h->out), MSG_NOSIGNAL);
        if (n < 0) return errno == EAGAIN ? 0 : -1;
        h->out.off += (size_t)n;
    }
    h->out.off = h->out.len = 0;
    return 0;
}

/* Readable: move what arrived to the peer's socket. -1 when the pair is done. */
static int half_read(struct half *h)
{
    char chunk[65536];
    ssize_t n = recv(h->fd, chunk, sizeof chunk, 0);
    if (n == 0) return -1;
    if (n < 0) return errno == EAGAIN ? 0 : -1;
    buf_add(&h->peer->out, chunk, (size_t)n);
    return half_flush(h->peer);
}

static void pipe_accept(void)
{
    for (;;) {
        int cfd = accept4(P.lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) return;
        int ufd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (ufd < 0 || (connect(ufd, (struct sockaddr *)&P.up, sizeof P.up) < 0
                        && errno != EINPROGRESS)) {
            close(cfd);
            if (ufd >= 0) close(ufd);
            continue;
        }
        set_nodelay(cfd);
        set_nodelay(ufd);
        struct half *pair = calloc(2, sizeof *pair);
        if (!pair) die2("out of memory");
        pair[0] = (struct half){.fd = cfd, .peer = &pair[1]};
        pair[1] = (struct half){.fd = ufd, .peer = &pair[0]};
        half_watch(&pair[0], EPOLL_CTL_ADD);
        half_watch(&pair[1], EPOLL_CTL_ADD);
    }
}

static int pipe_main(int argc, char **argv)
{
    int port = -1, upstream = -1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--port")) { port = (int)arg_num(a, v, 1, 65535); i++; }
        else if (!strcmp(a, "--upstream-port")) { upstream = (int)arg_num(a, v, 1, 65535); i++; }
        else die2("pipe: bad argument %s", a);
    }
    if (port < 0 || upstream < 0) die2("pipe: --port and --upstream-port are required");
    install_signals();
    P.up = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)upstream)};
    P.up.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    P.lfd = engine_listen(port);
    P.ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(P.ep, EPOLL_CTL_ADD, P.lfd, &lev);
    printf("ready %d\n", port);
    fflush(stdout);
    struct epoll_event evs[MAX_EVENTS];
    while (!g_stop) {
        int n = wait_events(P.ep, evs, -1);
        /* A pair closed earlier in this batch must not be touched again: collect, close last. */
        struct half *dead[MAX_EVENTS];
        int ndead = 0;
        for (int i = 0; i < n; i++) {
            struct half *h = evs[i].data.ptr;
            if (!h) { pipe_accept(); continue; }
            bool gone = false;
            for (int j = 0; j < ndead && !gone; j++) gone = dead[j] == h || dead[j] == h->peer;
            if (gone) continue;
            int rc = 0;
            if (evs[i].events & (EPOLLERR | EPOLLHUP)) rc = -1;
            if (!rc && (evs[i].events & EPOLLOUT)) rc = half_flush(h);
            if (!rc && (evs[i].events & EPOLLIN)) rc = half_read(h);
            if (rc < 0) { dead[ndead++] = h; continue; }
            half_watch(h, EPOLL_CTL_MOD);
            half_watch(h->peer, EPOLL_CTL_MOD);
        }
        for (int j = 0; j < ndead; j++) pair_close(dead[j]);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "engine")) return engine_main(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "load")) return load_main(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "pipe")) return pipe_main(argc - 2, argv + 2);
    die2("usage: sse_harness engine --port P [...] | sse_harness load --url URL [...]"
         " | sse_harness pipe --port P --upstream-port Q");
}
