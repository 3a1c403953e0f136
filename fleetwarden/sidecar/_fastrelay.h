/*
 * The C relay's shared definitions (`_fastrelay.c`: the Relay type; `_fastrelay_stream.c`: the
 * Stream type; `_fastrelay_thread.c`: the relay thread and the hand-over lists;
 * `_fastrelay_wire.c`: the sockets, the chunk decoder and the event rules). See `_fastrelay.c`
 * for what it is and why.
 *
 * Threads: the relay thread runs `fr_relay_main` and never holds the GIL or touches a Python
 * object (not even a reference count). Every field of a running stream and every list of the
 * relay but `owned` is guarded by the relay's mutex `mu`; the event loop's thread takes it with
 * the GIL held, through `fr_lock`, which lets go of the GIL while it waits (the relay thread
 * never waits for the GIL, so the order GIL -> mu cannot deadlock). `owned`, the relay's strong
 * references, is touched with the GIL only, never by the relay thread: the garbage collector
 * traverses it without the mutex, never waiting for a relay thread starved of its core (only a
 * relay dropped without close() is cleared by joining its thread with the GIL held).
 */
#ifndef FLEETWARDEN_FASTRELAY_H
#define FLEETWARDEN_FASTRELAY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define READ_SIZE (64 * 1024)
#define HIGH_WATER (256 * 1024) /* unsent client bytes above which the engine is not read */
#define LOW_WATER (64 * 1024)
#define MAX_CHUNK_LINE 4096
#define MAX_TRAILERS (64 * 1024)
#define MAX_EVENTS 256
#define WAKE_TAG ((uint64_t)2) /* epoll data of the relay thread's wake-up eventfd */

enum { RUNNING = 0, ENDED, CLIENT_GONE, ENGINE_CLOSED, BAD_FRAMING, CANCELLED };
enum { SIZE_LINE = 0, CHUNK_DATA, CHUNK_CRLF, TRAILERS, BODY_DONE };
enum { ENGINE_SIDE = 0, CLIENT_SIDE = 1 };
enum { NO_ANSWER = -1 };

typedef struct {
    char *data;
    size_t len, cap;
} Buf;

typedef struct {
    double t;
    long n;
} Record;

struct RelayObject;
struct StreamObject;

/* A list of streams in C (no references of its own: who owns what is said where it is used). */
typedef struct {
    struct StreamObject **items;
    size_t len, cap;
} StreamList;

typedef struct StreamObject {
    PyObject_HEAD struct RelayObject *owner; /* strong, for the stream's whole life (its mutex) */
    int running_in_relay;                    /* in the relay's epoll set: the relay's reference */
    size_t running_at;                       /* its index in the relay's `running` list */
    size_t owned_at;                         /* its index in the relay's `owned` list (GIL) */
    int engine_fd, client_fd;                /* our duplicates; -1 once closed */
    int chunked_out, wants_usage;
    int state;               /* chunk decoder state */
    unsigned long long left; /* bytes left in the current chunk */
    Buf line;                /* a chunk-size line or the trailers, until complete */
    Buf sse;                 /* decoded body bytes not yet ended by a blank line */
    Buf out;                 /* bytes the client's socket did not take yet */
    Buf scratch;             /* forwarded events when a dropped one splits them */
    Buf usage_event;         /* a usage event waiting for Python's answer (parked) */
    Record *records;
    size_t n_records, cap_records;
    int dirty;
    int outcome;
    const char *error;
    int seen_event, extra_bytes, engine_paused, engine_watched, client_watch_out;
    int parked;       /* waiting for on_usage's answer on `usage_event`: the engine is not read */
    int answer;       /* on_usage's answer for the parked event, or NO_ANSWER */
    int body_ended;   /* the body ended in a read decoded while parked */
    double parked_at; /* when the read that parked it came (the time of what follows it) */
    long long bytes_written, tokens;
    double last_rx;
    PyObject *on_usage; /* on_usage(event: bytes) -> bool: parses a usage event, True if usage-only */
} StreamObject;

typedef struct RelayObject {
    PyObject_HEAD int epfd;
    int notify_fd;        /* eventfd the event loop watches: poll() has something to hand over */
    int wake_fd;          /* eventfd in epfd: wakes the relay thread (answers, releases, stop) */
    pthread_t thread;
    int thread_started, stopping, notified;
    int closing; /* shut_down() began: start() refuses (under mu) */
    int nice; /* the relay thread's niceness (0-19) */
    pthread_mutex_t mu;
    StreamList owned;     /* the relay's references, one per stream until poll() drops it (GIL) */
    StreamList running;   /* its running streams (s->running_at) */
    StreamList finished;  /* ended, to report (borrowed: the relay's reference is elsewhere) */
    StreamList dirty;     /* running streams with token records since take_dirty() (borrowed) */
    StreamList asking;    /* parked streams whose usage event Python must answer (borrowed) */
    StreamList answered;  /* parked streams whose answer the relay thread must apply (borrowed) */
    StreamList graveyard; /* ended streams whose reference stays until a batch boundary */
    StreamList released;  /* ended streams whose reference poll() drops (after a boundary) */
    int busy; /* in poll()'s on_usage calls: start, poll and close refuse (no re-entry) */
    char readbuf[READ_SIZE]; /* the relay thread's */
} RelayObject;

/* Takes the mutex with the GIL held: at once when it is free, else with the GIL let go while
   waiting (the relay thread may hold it for a batch, at niceness 19 on a busy core). */
static inline void fr_lock(RelayObject *relay) {
    if (pthread_mutex_trylock(&relay->mu) == 0) return;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&relay->mu);
    Py_END_ALLOW_THREADS
}

static inline void fr_unlock(RelayObject *relay) { pthread_mutex_unlock(&relay->mu); }

extern PyTypeObject FrStreamType;
int fr_answer_usage(RelayObject *relay, StreamObject *s);
double fr_now(void);
void fr_buf_free(Buf *b);
int fr_list_reserve(StreamList *list, size_t cap);
int fr_list_push(StreamList *list, StreamObject *s);
#define RUNNING_AT offsetof(StreamObject, running_at)
#define OWNED_AT offsetof(StreamObject, owned_at)
int fr_indexed_add(StreamList *list, StreamObject *s, size_t at);
void fr_indexed_remove(StreamList *list, StreamObject *s, size_t at);
void fr_list_remove(StreamList *list, StreamObject *s);
void fr_list_free(StreamList *list);
void fr_signal_loop(RelayObject *relay);
void fr_wake_relay(RelayObject *relay);
int fr_epoll_set(RelayObject *relay, int op, int fd, uint32_t events, StreamObject *s, int side);
void fr_update_engine_watch(StreamObject *s);
void fr_close_fds(StreamObject *s);
void fr_finish(StreamObject *s, int outcome, const char *error, int report);
int fr_on_engine_bytes(StreamObject *s, const char *p, size_t n, double now);
void fr_on_engine_ready(RelayObject *relay, StreamObject *s);
void fr_on_client_ready(StreamObject *s, uint32_t events);
void fr_apply_answer(StreamObject *s);
void *fr_relay_main(void *arg);

#endif
