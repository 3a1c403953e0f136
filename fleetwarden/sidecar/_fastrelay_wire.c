/*
 * The C relay's wire side: buffers, the engine's chunked framing, the event rules, the client's
 * socket with its back-pressure (`_fastrelay.c` says what the relay is and why).
 */
#include "_fastrelay.h"

static int buf_reserve(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + extra) cap *= 2;
    char *data = PyMem_Realloc(b->data, cap);
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
    PyMem_Free(b->data);
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
    if (s->engine_fd >= 0) {
        if (s->relay != NULL) epoll_ctl(s->relay->epfd, EPOLL_CTL_DEL, s->engine_fd, NULL);
        close(s->engine_fd);
        s->engine_fd = -1;
    }
    if (s->client_fd >= 0) {
        if (s->relay != NULL) epoll_ctl(s->relay->epfd, EPOLL_CTL_DEL, s->client_fd, NULL);
        close(s->client_fd);
        s->client_fd = -1;
    }
}

/* Ends a running stream: out of the set, duplicates closed; reported by the next poll() if
   `report`. The relay's reference moves to its `finished` list (or is dropped). */
int fr_finish(StreamObject *s, int outcome, const char *error, int report) {
    if (s->outcome != RUNNING) return 0;
    s->outcome = outcome;
    s->error = error;
    RelayObject *relay = s->relay;
    fr_close_fds(s);
    /* on_usage is usually a bound method of the object that holds this stream: a cycle the
       garbage collector cannot see (this type is not tracked), so it is broken here. */
    Py_CLEAR(s->on_usage);
    s->relay = NULL;
    int rc = 0;
    if (relay != NULL) {
        relay->active--;
        if (report) rc = PyList_Append(relay->finished, (PyObject *)s);
        Py_DECREF(s); /* the relay's reference taken by start() */
        Py_DECREF(relay);
    }
    return rc;
}

static int add_record(StreamObject *s, double t, long n) {
    if (s->n_records == s->cap_records) {
        size_t cap = s->cap_records ? s->cap_records * 2 : 16;
        Record *records = PyMem_Realloc(s->records, cap * sizeof(Record));
        if (records == NULL) return -1;
        s->records = records;
        s->cap_records = cap;
    }
    s->records[s->n_records].t = t;
    s->records[s->n_records].n = n;
    s->n_records++;
    s->tokens += n;
    if (!s->dirty && s->relay != NULL) {
        if (PyList_Append(s->relay->dirty, (PyObject *)s) < 0) return -1;
        s->dirty = 1;
    }
    return 0;
}

static int has(const char *p, size_t n, const char *needle) {
    return memmem(p, n, needle, strlen(needle)) != NULL;
}

/* Whether a usage event is the usage chunk (no choices), as Python's JSON parse says; the
   callable also keeps the usage. 1, 0, or -1 with a Python exception set. */
static int usage_only(StreamObject *s, const char *event, size_t n) {
    if (s->on_usage == NULL) return 1;
    PyObject *bytes = PyBytes_FromStringAndSize(event, (Py_ssize_t)n);
    if (bytes == NULL) return -1;
    PyObject *on_usage = Py_NewRef(s->on_usage); /* the call may end the stream, which drops it */
    PyObject *answer = PyObject_CallOneArg(on_usage, bytes);
    Py_DECREF(on_usage);
    Py_DECREF(bytes);
    if (answer == NULL) return -1;
    int only = PyObject_IsTrue(answer);
    Py_DECREF(answer);
    return only;
}

static void update_client_watch(StreamObject *s) {
    int want_out = s->out.len > 0;
    if (want_out != s->client_watch_out && s->client_fd >= 0) {
        uint32_t events = EPOLLRDHUP | (want_out ? EPOLLOUT : 0);
        fr_epoll_set(s->relay, EPOLL_CTL_MOD, s->client_fd, events, s, CLIENT_SIDE);
        s->client_watch_out = want_out;
    }
    if (s->engine_fd < 0) return;
    /* Paused: out of the set altogether, since epoll reports a hang-up even to an empty mask,
       and reading on then would bypass the pause. */
    if (!s->engine_paused && s->out.len > HIGH_WATER) {
        epoll_ctl(s->relay->epfd, EPOLL_CTL_DEL, s->engine_fd, NULL);
        s->engine_paused = 1;
    } else if (s->engine_paused && s->out.len <= LOW_WATER) {
        fr_epoll_set(s->relay, EPOLL_CTL_ADD, s->engine_fd, EPOLLIN | EPOLLRDHUP, s, ENGINE_SIDE);
        s->engine_paused = 0;
        s->last_rx = fr_now(); /* the engine is timed again from now on */
    }
}

/* Sends `iov` to the client, keeping what its socket did not take; 0, or -1 (client gone,
   the stream ended) or -2 (out of memory, a Python exception set). */
static int client_send(StreamObject *s, struct iovec *iov, int iovcnt) {
    ssize_t sent = 0;
    if (s->out.len == 0) {
        struct msghdr msg;
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)iovcnt;
        sent = sendmsg(s->client_fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                return fr_finish(s, CLIENT_GONE, "the client closed the connection", 1) < 0 ? -2 : -1;
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
        if (buf_append(&s->out, (const char *)iov[i].iov_base + skip, len - skip) < 0) {
            PyErr_NoMemory();
            return -2;
        }
        skip = 0;
    }
    update_client_watch(s);
    return 0;
}

/* Forwards the complete events of `sse` (framed as one chunk), counts tokens, keeps usage. */
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
                only = usage_only(s, event, n);
                if (only < 0) return -2;
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
                if (buf_append(&s->scratch, event, n) < 0) return PyErr_NoMemory(), -2;
            } else {
                span = end;
            }
        } else if (!use_scratch) {
            if (buf_append(&s->scratch, p, span) < 0) return PyErr_NoMemory(), -2;
            use_scratch = 1;
        }
        start = end;
    }
    if (tokens && add_record(s, now, tokens) < 0) return PyErr_NoMemory(), -2;
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
            if (buf_append(&s->sse, p + pos, take) < 0) return PyErr_NoMemory(), -2;
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
            if (buf_append(&s->line, p + pos, take) < 0) return PyErr_NoMemory(), -2;
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
        if (buf_append(&s->line, p + pos, take) < 0) return PyErr_NoMemory(), -2;
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

/* Engine bytes: decode, relay, and end the stream when the body ended; <0 on a Python error. */
/* A Python error (out of memory, or raised by on_usage) after bytes were read: the stream can no
   longer follow the wire, so it ends as an engine failure; the error propagates. */
static int failed(StreamObject *s) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    fr_finish(s, ENGINE_CLOSED, "the relay failed (out of memory?)", 1);
    PyErr_Restore(type, value, traceback);
    return -1;
}

int fr_on_engine_bytes(StreamObject *s, const char *p, size_t n, double now) {
    s->last_rx = now;
    int ended = decode(s, p, n);
    if (ended == -2) return failed(s);
    if (ended == -1) return 0; /* finished with bad framing */
    if (relay_events(s, now) == -2) return failed(s);
    if (s->outcome != RUNNING) return 0;
    if (ended == 1) return fr_finish(s, ENDED, NULL, 1);
    return 0;
}

int fr_on_engine_ready(RelayObject *relay, StreamObject *s) {
    for (;;) {
        ssize_t got = recv(s->engine_fd, relay->readbuf, READ_SIZE, MSG_DONTWAIT);
        if (got > 0) {
            if (fr_on_engine_bytes(s, relay->readbuf, (size_t)got, fr_now()) < 0) return -1;
            if (s->outcome != RUNNING || got < READ_SIZE || s->engine_paused) return 0;
            continue;
        }
        if (got == 0) return fr_finish(s, ENGINE_CLOSED, "the engine closed the connection mid-response", 1);
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        if (errno == EINTR) continue;
        return fr_finish(s, ENGINE_CLOSED, "the engine connection failed mid-response", 1);
    }
}

int fr_on_client_ready(StreamObject *s, uint32_t events) {
    if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
        return fr_finish(s, CLIENT_GONE, "the client closed the connection", 1);
    }
    if ((events & EPOLLOUT) && s->out.len > 0) {
        ssize_t sent = send(s->client_fd, s->out.data, s->out.len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                return fr_finish(s, CLIENT_GONE, "the client closed the connection", 1);
            sent = 0;
        }
        s->bytes_written += sent;
        buf_consume(&s->out, (size_t)sent);
        update_client_watch(s);
    }
    return 0;
}
