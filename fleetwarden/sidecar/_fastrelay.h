/*
 * The C relay's shared definitions (`_fastrelay.c`: the Python types; `_fastrelay_wire.c`: the
 * sockets, the chunk decoder and the event rules). See `_fastrelay.c` for what it is and why.
 */
#ifndef FLEETWARDEN_FASTRELAY_H
#define FLEETWARDEN_FASTRELAY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
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

enum { RUNNING = 0, ENDED, CLIENT_GONE, ENGINE_CLOSED, BAD_FRAMING, CANCELLED };
enum { SIZE_LINE = 0, CHUNK_DATA, CHUNK_CRLF, TRAILERS, BODY_DONE };
enum { ENGINE_SIDE = 0, CLIENT_SIDE = 1 };

typedef struct {
    char *data;
    size_t len, cap;
} Buf;

typedef struct {
    double t;
    long n;
} Record;

struct RelayObject;

typedef struct {
    PyObject_HEAD struct RelayObject *relay; /* strong while the stream runs */
    int engine_fd, client_fd;                /* our duplicates; -1 once closed */
    int chunked_out, wants_usage;
    int state;               /* chunk decoder state */
    unsigned long long left; /* bytes left in the current chunk */
    Buf line;                /* a chunk-size line or the trailers, until complete */
    Buf sse;                 /* decoded body bytes not yet ended by a blank line */
    Buf out;                 /* bytes the client's socket did not take yet */
    Buf scratch;             /* forwarded events when a dropped one splits them */
    Record *records;
    size_t n_records, cap_records;
    int dirty;
    int outcome;
    const char *error;
    int seen_event, extra_bytes, engine_paused, client_watch_out;
    long long bytes_written, tokens;
    double last_rx;
    PyObject *on_usage; /* on_usage(event: bytes) -> bool: parses a usage event, True if usage-only */
} StreamObject;

typedef struct RelayObject {
    PyObject_HEAD int epfd;
    PyObject *finished; /* streams that ended in poll(), handed over by the next poll() */
    PyObject *dirty;    /* streams with token records since the last take_dirty() */
    long active;
    int busy; /* in poll(): start, poll and close refuse (on_usage must not re-enter) */
    char readbuf[READ_SIZE];
} RelayObject;

double fr_now(void);
void fr_buf_free(Buf *b);
int fr_epoll_set(RelayObject *relay, int op, int fd, uint32_t events, StreamObject *s, int side);
void fr_close_fds(StreamObject *s);
int fr_finish(StreamObject *s, int outcome, const char *error, int report);
int fr_on_engine_bytes(StreamObject *s, const char *p, size_t n, double now);
int fr_on_engine_ready(RelayObject *relay, StreamObject *s);
int fr_on_client_ready(StreamObject *s, uint32_t events);

#endif
