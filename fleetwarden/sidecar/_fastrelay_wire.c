/*
 * The C relay's wire side: buffers, the engine's chunked framing, the event rules, the client's
 * socket with its back-pressure (`_fastrelay.c` says what the relay is and why).
 *
 * Everything here runs with the relay's mutex held, on the relay thread or (start, cancel) on the
 * event loop's; nothing here touches a Python object, so memory is malloc'd, and a failure to
 * allocate ends the stream as an engine failure instead of raising.
 */
#include "_fastrelay.h"

static int buf_reserve(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + extra) cap *= 2;
    char *data = realloc(b->data, cap);
    if (data == NULL) return -1;
    b->data = data;
    b->cap = cap;
    return 0;
}

static int buf_append(Buf *b, const char *p, size_t n) {
    if (n == 0) return 0;
    if (buf_reserve(b, n) < 0) return -1;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

static void buf_consume(Buf *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

void fr_buf_free(Buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

double fr_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int fr_epoll_set(RelayObject *relay, int op, int fd, uint32_t events, StreamObject *s, int side) {
    struct epoll_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.events = events;
    ev.data.u64 = (uint64_t)(uintptr_t)s | (uint64_t)side;
    return epoll_ctl(relay->epfd, op, fd, &ev);
}

void fr_close_fds(StreamObject *s) {
    /* Removed from the set before closing: the loop's descriptor keeps the socket open, and a
       closed duplicate would otherwise stay registered (epoll keys on the open socket). */
    int epfd = s->owner != NULL ? s->owner->epfd : -1;
    if (s->engine_fd >= 0) {
        if (s->engine_watched && epfd >= 0) epoll_ctl(epfd, EPOLL_CTL_DEL, s->engine_fd, NULL);
        s->engine_watched = 0;
        close(s->engine_fd);
        s->engine_fd = -1;
    }
    if (s->client_fd >= 0) {
        if (s->running_in_relay && epfd >= 0) epoll_ctl(epfd, EPOLL_CTL_DEL, s->client_fd, NULL);
        close(s->client_fd);
        s->client_fd = -1;
    }
}

/* The engine's socket is in the set exactly while the stream runs, unpaused and not parked:
   out of the set altogether otherwise, since epoll reports a hang-up even to an empty mask, and
   reading on then would bypass the pause. */
void fr_update_engine_watch(StreamObject *s) {
    int want = s->outcome == RUNNING && s->engine_fd >= 0 && !s->engine_paused && !s->parked;
    if (want == s->engine_watched) return;
    if (want) {
        if (fr_epoll_set(s->owner, EPOLL_CTL_ADD, s->engine_fd, EPOLLIN | EPOLLRDHUP, s, ENGINE_SIDE) < 0) {
            fr_finish(s, ENGINE_CLOSED, "the relay could not watch the engine's socket", 1);
            return;
        }
    } else {
        epoll_ctl(s->owner->epfd, EPOLL_CTL_DEL, s->engine_fd, NULL);
    }
    s->engine_watched = want;
}

/* Ends a running stream: out of the set, duplicates closed, out of every list it was waiting in;
   reported by the next poll() if `report`. It goes to the graveyard: the relay thread may hold an
   epoll event of this stream fetched before it ended, so the relay's reference is dropped only
   after the relay thread's next batch boundary (`handle_batch`). */
void fr_finish(StreamObject *s, int outcome, const char *error, int report) {
    if (s->outcome != RUNNING) return;
    RelayObject *relay = s->owner;
    s->outcome = outcome;
    s->error = error;
    fr_close_fds(s);
    s->parked = 0;
    if (!s->running_in_relay) return;
    /* A parked stream stays in `asking`: its usage event was read, and the next poll() still
       hands it to on_usage (the exact counts settle the request however it ended). */
    fr_list_remove(&relay->dirty, s);
    fr_list_remove(&relay->answered, s);
    s->dirty = 0;
    s->running_in_relay = 0;
    fr_indexed_remove(&relay->running, s, RUNNING_AT);
    /* Neither push can fail: `Relay_start` reserved room in both for every stream the relay
       owns, and each list holds owned streams only. */
    if (report) {
        fr_list_push(&relay->finished, s);
        fr_signal_loop(relay);
    }
    fr_list_push(&relay->graveyard, s);
}

static int add_record(StreamObject *s, double t, long n) {
    if (s->n_records == s->cap_records) {
        size_t cap = s->cap_records ? s->cap_records * 2 : 16;
        Record *records = realloc(s->records, cap * sizeof(Record));
        if (records == NULL) return -1;
        s->records = records;
        s->cap_records = cap;
    }
    s->records[s->n_records].t = t;
    s->records[s->n_records].n = n;
    s->n_records++;
    s->tokens += n;
    if (!s->dirty && s->running_in_relay) {
        RelayObject *relay = s->owner;
        if (fr_list_push(&relay->dirty, s) < 0) return -1;
        s->dirty = 1;
        if (relay->dirty.len == 1) fr_signal_loop(relay); /* the loop times its flush from now */
    }
    return 0;
}

static int has(const char *p, size_t n, const char *needle) {
    return memmem(p, n, needle, strlen(needle)) != NULL;
}

/* A usage event needs Python's answer (is it the usage chunk, with no choices, as Python's JSON
   parse says?). Parks the stream: the event is kept for poll() to hand to on_usage, and the
   engine is not read until the answer came back (`fr_apply_answer`). 0, or -1 out of memory. */
static int park(StreamObject *s, const char *event, size_t n, double now) {
    s->usage_event.len = 0;
    s->parked_at = now;
    if (buf_append(&s->usage_event, event, n) < 0) return -1;
    if (fr_list_push(&s->owner->asking, s) < 0) return -1;
    s->parked = 1;
    fr_update_engine_watch(s);
    fr_signal_loop(s->owner);
    return 0;
}

static void update_client_watch(StreamObject *s) {
    int want_out = s->out.len > 0;
    if (want_out != s->client_watch_out && s->client_fd >= 0) {
        uint32_t events = EPOLLRDHUP | (want_out ? EPOLLOUT : 0);
        fr_epoll_set(s->owner, EPOLL_CTL_MOD, s->client_fd, events, s, CLIENT_SIDE);
        s->client_watch_out = want_out;
    }
    if (s->engine_fd < 0) return;
    if (!s->engine_paused && s->out.len > HIGH_WATER) {
        s->engine_paused = 1;
        fr_update_engine_watch(s);
    } else if (s->engine_paused && s->out.len <= LOW_WATER) {
        s->engine_paused = 0;
        s->last_rx = fr_now(); /* the engine is timed again from now on */
        fr_update_engine_watch(s);
    }
}

/* Sends `iov` to the client, keeping what its socket did not take; 0, or -1 (client gone,
   the stream ended) or -2 (out of memory). */
static int client_send(StreamObject *s, struct iovec *iov, int iovcnt) {
    ssize_t sent = 0;
    if (s->out.len == 0 && s->client_fd >= 0) {
        struct msghdr msg;
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)iovcnt;
        sent = sendmsg(s->client_fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                fr_finish(s, CLIENT_GONE, "the client closed the connection", 1);
                return -1;
            }
            sent = 0;
        }
        s->bytes_written += sent;
    }
    size_t skip = (size_t)sent;
    for (int i = 0; i < iovcnt; i++) {
        size_t len = iov[i].iov_len;
        if (skip >= len) {
            skip -= len;
            continue;
        }
        if (buf_append(&s->out, (const char *)iov[i].iov_base + skip, len - skip) < 0) return -2;
        skip = 0;
    }
    update_client_watch(s);
    return 0;
}

/* Forwards the complete events of `sse` (framed as one chunk) and counts tokens; stops at a
   usage event Python has not answered yet (the stream parks). 0, -1 (the stream ended: the
   client left), or -2 (out of memory). */
static int relay_events(StreamObject *s, double now) {
    const char *p = s->sse.data;
    size_t len = s->sse.len, start = 0, span = 0;
    int use_scratch = 0;
    long tokens = 0;
    s->scratch.len = 0;
    while (start < len) {
        const char *nl = memmem(p + start, len - start, "\n\n", 2);
        if (nl == NULL) break;
        size_t end = (size_t)(nl - p) + 2;
        const char *event = p + start;
        size_t n = end - start;
        int forward = 1;
        if (n >= 12 && memcmp(event, "data: [DONE]", 12) == 0) {
            /* forwarded, not a token */
        } else {
            int only = 0;
            if (has(event, n, "\"usage\":{") || has(event, n, "\"usage\": {")) {
                if (s->answer == NO_ANSWER) {
                    if (park(s, event, n, now) < 0) return -2;
                    break; /* what came before it is sent below; the rest waits in `sse` */
                }
                only = s->answer;
                s->answer = NO_ANSWER;
                s->usage_event.len = 0;
                if (only) forward = s->wants_usage;
            }
            if (!only && n >= 5 && memcmp(event, "data:", 5) == 0 &&
                !(has(event, n, "\"role\":\"assistant\"") && has(event, n, "\"content\":\"\""))) {
                tokens++;
            }
        }
        if (forward) {
            if (!s->seen_event)
                s->seen_event = (n >= 5 && memcmp(event, "data:", 5) == 0) || has(event, n, "\ndata:");
            if (use_scratch) {
                if (buf_append(&s->scratch, event, n) < 0) return -2;
            } else {
                span = end;
            }
        } else if (!use_scratch) {
            if (buf_append(&s->scratch, p, span) < 0) return -2;
            use_scratch = 1;
        }
        start = end;
    }
    if (tokens && add_record(s, now, tokens) < 0) return -2;
    const char *payload = use_scratch ? s->scratch.data : p;
    size_t payload_len = use_scratch ? s->scratch.len : span;
    int rc = 0;
    if (payload_len > 0) {
        char head[24];
        struct iovec iov[3];
        int n = 0;
        if (s->chunked_out) {
            int hl = snprintf(head, sizeof(head), "%zx\r\n", payload_len);
            iov[n].iov_base = head;
            iov[n++].iov_len = (size_t)hl;
        }
        iov[n].iov_base = (void *)payload;
        iov[n++].iov_len = payload_len;
        if (s->chunked_out) {
            iov[n].iov_base = (void *)"\r\n";
            iov[n++].iov_len = 2;
        }
        rc = client_send(s, iov, n);
    }
    buf_consume(&s->sse, start);
    return rc;
}

static int parse_chunk_size(const char *p, size_t n, unsigned long long *size) {
    size_t i = 0;
    unsigned long long v = 0;
    while (i + 1 < n && p[i] == '0' && p[i + 1] != ';') i++; /* leading zeros: any number */
    size_t first = i;
    while (i < n && p[i] != ';') {
        char c = p[i];
        int d = (c >= '0' && c <= '9') ? c - '0'
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                : -1;
        if (d < 0 || i - first >= 15) return -1;
        v = v * 16 + (unsigned long long)d;
        i++;
    }
    if (i == 0) return -1;
    *size = v;
    return 0;
}

/* Decodes the chunked framing of one engine read into `sse`; 1 when the body ended, 0 when more
   is due, -1 on bad framing (the stream ended), -2 on a Python error. */
static int decode(StreamObject *s, const char *p, size_t n) {
    size_t pos = 0;
    while (pos < n) {
        if (s->state == BODY_DONE) {
            s->extra_bytes = 1; /* bytes after the response: not HTTP we can follow */
            return 1;
        }
        if (s->state == CHUNK_DATA) {
            size_t take = n - pos;
            if (take > s->left) take = (size_t)s->left;
            if (buf_append(&s->sse, p + pos, take) < 0) return -2;
            pos += take;
            s->left -= take;
            if (s->left == 0) s->state = CHUNK_CRLF;
            continue;
        }
        /* the other states read lines: accumulate until complete */
        size_t want_max = s->state == TRAILERS ? MAX_TRAILERS : MAX_CHUNK_LINE;
        if (s->state == CHUNK_CRLF) {
            size_t need = 2 - s->line.len;
            size_t take = n - pos < need ? n - pos : need;
            if (buf_append(&s->line, p + pos, take) < 0) return -2;
            pos += take;
            if (s->line.len < 2) continue;
            if (memcmp(s->line.data, "\r\n", 2) != 0) {
                fr_finish(s, BAD_FRAMING, "bad chunk framing: no CRLF after a chunk", 1);
                return -1;
            }
            s->line.len = 0;
            s->state = SIZE_LINE;
            continue;
        }
        /* SIZE_LINE or TRAILERS: take up to the next LF */
        const char *lf = memchr(p + pos, '\n', n - pos);
        size_t take = lf ? (size_t)(lf - (p + pos)) + 1 : n - pos;
        if (s->line.len + take > want_max) {
            fr_finish(s, BAD_FRAMING,
                   s->state == TRAILERS ? "chunked trailers too long" : "chunk-size line too long", 1);
            return -1;
        }
        if (buf_append(&s->line, p + pos, take) < 0) return -2;
        pos += take;
        if (lf == NULL) continue;
        const char *line = s->line.data;
        size_t ll = s->line.len;
        if (s->state == SIZE_LINE) {
            unsigned long long size;
            if (ll < 2 || line[ll - 2] != '\r' || parse_chunk_size(line, ll - 2, &size) < 0) {
                fr_finish(s, BAD_FRAMING, "bad chunk size", 1);
                return -1;
            }
            s->line.len = 0;
            if (size == 0) {
                s->state = TRAILERS;
            } else {
                s->left = size;
                s->state = CHUNK_DATA;
            }
        } else { /* TRAILERS: ended by an empty line */
            if (ll >= 2 && line[ll - 2] == '\r' && (ll == 2 || (ll >= 4 && memcmp(line + ll - 4, "\r\n\r\n", 4) == 0))) {
                s->line.len = 0;
                s->state = BODY_DONE;
                if (pos < n) s->extra_bytes = 1;
                return 1;
            }
        }
    }
    return s->state == BODY_DONE ? 1 : 0;
}

/* Out of memory after bytes were read: the stream can no longer follow the wire, so it ends as
   an engine failure. */
static int failed(StreamObject *s) {
    fr_finish(s, ENGINE_CLOSED, "the relay ran out of memory", 1);
    return -1;
}

/* Relays what `sse` holds, then ends the stream if its body ended (unless it parked first). */
static int relay_and_end(StreamObject *s, int ended, double now) {
    if (relay_events(s, now) == -2) return failed(s);
    if (s->outcome != RUNNING) return 0;
    if (ended == 1 || s->body_ended) {
        if (s->parked) {
            s->body_ended = 1; /* ends once the parked event is answered and relayed */
            return 0;
        }
        fr_finish(s, ENDED, NULL, 1);
    }
    return 0;
}

int fr_on_engine_bytes(StreamObject *s, const char *p, size_t n, double now) {
    s->last_rx = now;
    int ended = decode(s, p, n);
    if (ended == -2) return failed(s);
    if (ended == -1) return 0; /* finished with bad framing */
    return relay_and_end(s, ended, now);
}

void fr_on_engine_ready(RelayObject *relay, StreamObject *s) {
    /* A few full reads at most: the socket stays ready (level-triggered) for the next batch,
       and the mutex is not held for one fast engine's whole backlog. */
    for (int reads = 0; reads < 4; reads++) {
        ssize_t got = recv(s->engine_fd, relay->readbuf, READ_SIZE, MSG_DONTWAIT);
        if (got > 0) {
            if (fr_on_engine_bytes(s, relay->readbuf, (size_t)got, fr_now()) < 0) return;
            if (s->outcome != RUNNING || got < READ_SIZE || !s->engine_watched) return;
            continue;
        }
        if (got == 0) {
            fr_finish(s, ENGINE_CLOSED, "the engine closed the connection mid-response", 1);
            return;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        fr_finish(s, ENGINE_CLOSED, "the engine connection failed mid-response", 1);
        return;
    }
}


void fr_on_client_ready(StreamObject *s, uint32_t events) {
    if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
        fr_finish(s, CLIENT_GONE, "the client closed the connection", 1);
        return;
    }
    if ((events & EPOLLOUT) && s->out.len > 0) {
        ssize_t sent = send(s->client_fd, s->out.data, s->out.len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                fr_finish(s, CLIENT_GONE, "the client closed the connection", 1);
                return;
            }
            sent = 0;
        }
        s->bytes_written += sent;
        buf_consume(&s->out, (size_t)sent);
        update_client_watch(s);
    }
}

/* Python answered the parked stream's usage event: relay it and what followed, then read the
   engine again (or end, if the body ended meanwhile). */
void fr_apply_answer(StreamObject *s) {
    if (s->outcome != RUNNING || !s->parked || s->answer == NO_ANSWER) return;
    s->parked = 0;
    relay_and_end(s, 0, s->parked_at); /* token events after it were read when it was */
    if (s->outcome == RUNNING) fr_update_engine_watch(s);
}
