/*
 * fleetwarden.sidecar._fastrelay: the streamed-response byte relay in C (docs/performance.md,
 * "The native relay").
 *
 * Why: after the response head, relaying a streamed completion is bytes in, bytes out, once per
 * token. In Python each of those reads costs a loop callback, the chunk parser and a transport
 * write, about 20 us of CPU on top of the kernel's share, and every new request waits behind
 * them: that was most of the sidecar's added first-token latency. Here one epoll set holds every
 * stream's engine and client sockets (duplicates of the event loop's, so a socket closed by the
 * loop can never be mistaken for another one that reuses its number), and a thread of the
 * relay's own (`_fastrelay_thread.c`) handles every ready socket without the GIL: a first token
 * is relayed while the event loop runs Python, and the event loop is not held up by token
 * events (docs/performance.md, "The relay thread"). Nothing here decides anything: no clock but
 * CLOCK_MONOTONIC (the clock of `time.monotonic`, which the sidecar's scheduler uses). Token
 * counts with their read times are kept per stream for Python to take (charges, metrics and the
 * fluidity index stay in the Python classes); the event loop watches `fileno()` and calls
 * `Relay.poll`, which hands over the streams that ended and asks Python about usage events.
 *
 * The rules are those of `stream.py` (split_events): an event is a run of bytes ended by a blank
 * line; `data: [DONE]` is forwarded, not counted; an event with a usage object is handed to the
 * stream's Python `on_usage` callable, which parses it as `split_events` does, keeps the usage
 * and says whether it is the engine's usage chunk (no choices: dropped from the client's stream
 * unless the client asked for usage, not a token); the role-only opening event is forwarded, not
 * counted; any other event whose first bytes are `data:` is one token. tests/sidecar run both
 * relays on the same cases. A usage event parks its stream (the engine is not read) until
 * `poll()`, on the event loop's thread, has called `on_usage`: one parser for both relays, and
 * the relay thread never waits for the GIL.
 *
 * Threads: see `_fastrelay.h`. Functions here run on the event loop's thread with the GIL held
 * and take the relay's mutex around every read or write of a stream's or the relay's state; they
 * never call Python while holding it (no allocation that could run a finalizer re-entering it).
 */
#include "_fastrelay.h"

#include <signal.h>

static PyTypeObject RelayType;

/* ---- Relay ----------------------------------------------------------------------------------- */

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* The mutex, for shut_down: through fr_lock when the GIL may be let go, else at once (the
   collector clears an unreachable relay, which no other Python thread can be using, and the
   relay thread never waits for the GIL). */
static void lock_for_shut_down(RelayObject *relay, int release_gil) {
    if (release_gil) fr_lock(relay);
    else pthread_mutex_lock(&relay->mu);
}

/* Stops and joins the relay thread. It never waits for the GIL, so joining with the GIL held
   cannot deadlock either: the garbage collector's clear joins so, without letting other threads
   run in the middle of a collection. */
static void stop_thread(RelayObject *relay, int release_gil) {
    if (!relay->thread_started) return;
    lock_for_shut_down(relay, release_gil);
    relay->stopping = 1;
    pthread_mutex_unlock(&relay->mu);
    fr_wake_relay(relay);
    if (release_gil) {
        Py_BEGIN_ALLOW_THREADS
        pthread_join(relay->thread, NULL);
        Py_END_ALLOW_THREADS
    } else {
        pthread_join(relay->thread, NULL);
    }
    relay->thread_started = 0;
}

/* After the thread stopped: drops the references the relay still holds, every list emptied
   first (a stream's dealloc may run Python code, which may poll this relay). */
static void drop_references(RelayObject *relay) {
    StreamList held = relay->owned;
    relay->owned = (StreamList){NULL, 0, 0};
    relay->running.len = relay->finished.len = relay->dirty.len = relay->asking.len = 0;
    relay->answered.len = relay->graveyard.len = relay->released.len = 0;
    for (size_t i = 0; i < held.len; i++) Py_DECREF((PyObject *)held.items[i]);
    fr_list_free(&held);
}

/* Ends the relay for good: its running streams cancelled (not reported: nobody polls any more),
   its thread stopped, its references dropped and its descriptors closed. Once: a second call,
   even from another thread while the first one joins the thread, returns at once. */
static void shut_down(RelayObject *relay, int release_gil) {
    lock_for_shut_down(relay, release_gil);
    if (relay->closing) {
        pthread_mutex_unlock(&relay->mu);
        return;
    }
    relay->closing = 1; /* no start() from here on, when the join below lets other threads run */
    while (relay->running.len > 0)
        fr_finish(relay->running.items[relay->running.len - 1], CANCELLED, NULL, 0);
    pthread_mutex_unlock(&relay->mu);
    stop_thread(relay, release_gil);
    drop_references(relay);
    close_fd(&relay->epfd);
    close_fd(&relay->notify_fd);
    close_fd(&relay->wake_fd);
}

/* The relay's references are its `owned` list, which only threads holding the GIL change: it is
   read without the mutex, so traversing never waits for the relay thread (clearing does). */
static int Relay_traverse(RelayObject *relay, visitproc visit, void *arg) {
    for (size_t i = 0; i < relay->owned.len; i++) Py_VISIT((PyObject *)relay->owned.items[i]);
    return 0;
}

/* A relay dropped without close() while streams still hold it (each does, for its mutex) is
   freed by the collector, which calls this to break the cycle. */
static int Relay_clear(RelayObject *relay) {
    shut_down(relay, 0);
    return 0;
}

static PyObject *Relay_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"nice", NULL};
    int nice = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|i:Relay", keywords, &nice)) return NULL;
    if (nice < 0 || nice > 19) {
        PyErr_SetString(PyExc_ValueError, "nice must be between 0 and 19");
        return NULL;
    }
    /* tp_alloc tracks it at once: a collection from here on traverses it, which reads `owned`
       only (zeroed), and cannot clear it while this function holds it. */
    RelayObject *relay = (RelayObject *)type->tp_alloc(type, 0);
    if (relay == NULL) return NULL;
    relay->nice = nice;
    relay->notify_fd = relay->wake_fd = -1;
    pthread_mutex_init(&relay->mu, NULL);
    relay->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (relay->epfd >= 0) relay->notify_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (relay->notify_fd >= 0) relay->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = WAKE_TAG};
    if (relay->wake_fd < 0 || epoll_ctl(relay->epfd, EPOLL_CTL_ADD, relay->wake_fd, &ev) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(relay);
        return NULL;
    }
    /* The thread starts with every signal blocked: they stay the main thread's (Python's). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&relay->thread, NULL, fr_relay_main, relay);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(relay);
        return NULL;
    }
    relay->thread_started = 1;
    return (PyObject *)relay;
}

static void Relay_dealloc(RelayObject *relay) {
    PyObject_GC_UnTrack(relay);
    shut_down(relay, 1);
    StreamList *lists[] = {&relay->running, &relay->finished, &relay->dirty,    &relay->asking,
                           &relay->answered, &relay->graveyard, &relay->released};
    for (size_t l = 0; l < sizeof(lists) / sizeof(*lists); l++) fr_list_free(lists[l]);
    pthread_mutex_destroy(&relay->mu);
    Py_TYPE(relay)->tp_free((PyObject *)relay);
}

static int busy(RelayObject *relay) {
    if (!relay->busy) return 0;
    PyErr_SetString(PyExc_RuntimeError, "the relay is polling (called from on_usage?)");
    return 1;
}

static int dup_fd(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 0); }

/* Room in every list a stream of the relay can be pushed to without a way to fail: `owned`,
   `finished` and `graveyard` (fr_finish), for as many streams as the relay will own. */
static int reserve_for(RelayObject *relay, size_t owned) {
    if (fr_list_reserve(&relay->owned, owned) < 0) return -1;
    if (fr_list_reserve(&relay->finished, owned) < 0) return -1;
    return fr_list_reserve(&relay->graveyard, owned);
}

/* Gives up a stream that never ran: its duplicates closed by its dealloc. */
static PyObject *abandon(StreamObject *s, Py_buffer *initial) {
    PyBuffer_Release(initial);
    s->outcome = CANCELLED;
    Py_DECREF(s);
    return NULL;
}

static PyObject *Relay_start(RelayObject *relay, PyObject *args) {
    int engine_fd, client_fd, chunked_out, wants_usage;
    Py_buffer initial;
    PyObject *on_usage;
    if (!PyArg_ParseTuple(args, "iiy*ppO", &engine_fd, &client_fd, &initial, &chunked_out, &wants_usage,
                          &on_usage))
        return NULL;
    if (!PyCallable_Check(on_usage)) {
        PyBuffer_Release(&initial);
        PyErr_SetString(PyExc_TypeError, "on_usage must be callable");
        return NULL;
    }
    if (relay->epfd < 0 || busy(relay)) {
        PyBuffer_Release(&initial);
        if (relay->epfd < 0) PyErr_SetString(PyExc_ValueError, "the relay is closed");
        return NULL;
    }
    StreamObject *s = PyObject_GC_New(StreamObject, &FrStreamType);
    if (s == NULL) {
        PyBuffer_Release(&initial);
        return NULL;
    }
    memset((char *)s + sizeof(PyObject), 0, sizeof(StreamObject) - sizeof(PyObject));
    s->owner = (RelayObject *)Py_NewRef((PyObject *)relay);
    s->engine_fd = s->client_fd = -1;
    s->chunked_out = chunked_out;
    s->wants_usage = wants_usage;
    s->answer = NO_ANSWER;
    s->on_usage = Py_NewRef(on_usage);
    PyObject_GC_Track(s);
    s->state = SIZE_LINE;
    s->last_rx = fr_now();
    s->engine_fd = dup_fd(engine_fd);
    s->client_fd = dup_fd(client_fd);
    if (s->engine_fd < 0 || s->client_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return abandon(s, &initial);
    }
    fr_lock(relay);
    if (relay->closing) { /* closed by another thread while this one waited for the mutex */
        fr_unlock(relay);
        PyErr_SetString(PyExc_ValueError, "the relay is closed");
        return abandon(s, &initial);
    }
    if (reserve_for(relay, relay->owned.len + 1) < 0 ||
        fr_indexed_add(&relay->running, s, RUNNING_AT) < 0) {
        fr_unlock(relay);
        PyErr_NoMemory();
        return abandon(s, &initial);
    }
    if (fr_epoll_set(relay, EPOLL_CTL_ADD, s->client_fd, EPOLLRDHUP, s, CLIENT_SIDE) < 0) {
        fr_indexed_remove(&relay->running, s, RUNNING_AT);
        fr_unlock(relay);
        PyErr_SetFromErrno(PyExc_OSError);
        return abandon(s, &initial);
    }
    /* The relay's reference, from now until poll() drops it after the stream ended; in `owned`
       (with the GIL only: `_fastrelay.h`), whose room was reserved above. */
    fr_indexed_add(&relay->owned, (StreamObject *)Py_NewRef((PyObject *)s), OWNED_AT);
    s->running_in_relay = 1;
    if (initial.len > 0) fr_on_engine_bytes(s, initial.buf, (size_t)initial.len, s->last_rx);
    if (s->outcome == RUNNING) fr_update_engine_watch(s);
    int ended = s->outcome != RUNNING;
    fr_unlock(relay);
    PyBuffer_Release(&initial);
    if (ended) fr_wake_relay(relay); /* a batch boundary releases the relay's reference */
    return (PyObject *)s;
}

/* What poll() took from the relay's lists, with references of its own (borrowed ones INCREF'd
   under the mutex; released ones are the relay's). */
typedef struct {
    StreamList finished, released, asking;
} Taken;

/* Moves a list's streams to `to`, which has room for them; the list keeps its own room
   (Relay_start reserved `finished`'s, and the others are not reallocated on every poll). */
static void move_list(StreamList *from, StreamList *to, int incref) {
    if (from->len == 0) return;
    memcpy(to->items, from->items, from->len * sizeof(*from->items));
    to->len = from->len;
    from->len = 0;
    if (incref)
        for (size_t i = 0; i < to->len; i++) Py_INCREF((PyObject *)to->items[i]);
}

/* Takes what poll() hands over, all or nothing: a released stream may still be named by
   `finished` or `asking`, so its reference goes only with them. Out of memory: -1, nothing
   taken (the next poll tries again). */
static int take(RelayObject *relay, Taken *taken) {
    *taken = (Taken){{NULL, 0, 0}, {NULL, 0, 0}, {NULL, 0, 0}};
    if (fr_list_reserve(&taken->finished, relay->finished.len) < 0 ||
        fr_list_reserve(&taken->released, relay->released.len) < 0 ||
        fr_list_reserve(&taken->asking, relay->asking.len) < 0) {
        fr_list_free(&taken->finished);
        fr_list_free(&taken->released);
        fr_list_free(&taken->asking);
        return -1;
    }
    move_list(&relay->finished, &taken->finished, 1);
    move_list(&relay->released, &taken->released, 0);
    move_list(&relay->asking, &taken->asking, 1);
    return 0;
}

/* Asks on_usage about each parked stream's event, ended ones too (their usage still settles
   the request); the answers for running ones go back to the relay thread. */
static void ask(RelayObject *relay, StreamList *asking) {
    int wake = 0;
    for (size_t i = 0; i < asking->len; i++) {
        StreamObject *s = asking->items[i];
        int only = fr_answer_usage(relay, s);
        fr_lock(relay);
        if (s->outcome == RUNNING && s->parked) {
            if (only < 0) {
                fr_finish(s, ENGINE_CLOSED, "the relay could not read a usage event", 1);
                wake = 1; /* a batch boundary releases the relay's reference */
            } else {
                s->answer = only;
                wake |= fr_list_push(&relay->answered, s) == 0;
            }
        }
        fr_unlock(relay);
    }
    if (wake) fr_wake_relay(relay);
}

static PyObject *Relay_poll(RelayObject *relay, PyObject *Py_UNUSED(ignored)) {
    if (relay->epfd < 0) Py_RETURN_NONE;
    if (busy(relay)) return NULL;
    Taken taken;
    fr_lock(relay);
    uint64_t count;
    if (read(relay->notify_fd, &count, sizeof(count)) < 0) { /* EAGAIN: nothing signalled */
    }
    relay->notified = 0;
    if (take(relay, &taken) < 0) fr_signal_loop(relay); /* out of memory: the next poll() */
    fr_unlock(relay);
    /* The released references are this call's now, before any Python code runs (on_usage, a
       finalizer) that could shut the relay down and drop what it still owns. */
    for (size_t i = 0; i < taken.released.len; i++)
        fr_indexed_remove(&relay->owned, taken.released.items[i], OWNED_AT);
    ask(relay, &taken.asking);
    for (size_t i = 0; i < taken.asking.len; i++) Py_DECREF((PyObject *)taken.asking.items[i]);
    fr_list_free(&taken.asking);
    PyObject *finished = NULL;
    if (taken.finished.len > 0) {
        finished = PyList_New((Py_ssize_t)taken.finished.len);
        for (size_t i = 0; i < taken.finished.len; i++) {
            StreamObject *s = taken.finished.items[i];
            Py_CLEAR(s->on_usage); /* ended: see Stream_cancel */
            if (finished != NULL) PyList_SET_ITEM(finished, (Py_ssize_t)i, (PyObject *)s);
            else Py_DECREF(s);
        }
    }
    fr_list_free(&taken.finished);
    for (size_t i = 0; i < taken.released.len; i++) Py_DECREF((PyObject *)taken.released.items[i]);
    fr_list_free(&taken.released);
    if (finished == NULL && !PyErr_Occurred()) Py_RETURN_NONE;
    return finished;
}

static PyObject *Relay_take_dirty(RelayObject *relay, PyObject *Py_UNUSED(ignored)) {
    StreamList dirty = {NULL, 0, 0};
    fr_lock(relay);
    if (fr_list_reserve(&dirty, relay->dirty.len) == 0) move_list(&relay->dirty, &dirty, 1);
    for (size_t i = 0; i < dirty.len; i++) dirty.items[i]->dirty = 0;
    fr_unlock(relay);
    PyObject *list = NULL;
    if (dirty.len > 0) {
        list = PyList_New((Py_ssize_t)dirty.len);
        for (size_t i = 0; i < dirty.len; i++) {
            if (list != NULL) PyList_SET_ITEM(list, (Py_ssize_t)i, (PyObject *)dirty.items[i]);
            else Py_DECREF((PyObject *)dirty.items[i]);
        }
    }
    fr_list_free(&dirty);
    if (list == NULL && !PyErr_Occurred()) Py_RETURN_NONE;
    return list;
}

static PyObject *Relay_fileno(RelayObject *relay, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromLong(relay->notify_fd);
}

static PyObject *Relay_close(RelayObject *relay, PyObject *Py_UNUSED(ignored)) {
    if (busy(relay)) return NULL;
    fr_lock(relay);
    long active = (long)relay->running.len;
    fr_unlock(relay);
    if (active > 0) {
        PyErr_SetString(PyExc_RuntimeError, "streams are still being relayed: cancel them first");
        return NULL;
    }
    shut_down(relay, 1);
    Py_RETURN_NONE;
}

static PyObject *Relay_get_active(RelayObject *relay, void *c) {
    fr_lock(relay);
    long active = (long)relay->running.len;
    fr_unlock(relay);
    return PyLong_FromLong(active);
}

static PyObject *Relay_get_has_dirty(RelayObject *relay, void *c) {
    fr_lock(relay);
    int has = relay->dirty.len > 0;
    fr_unlock(relay);
    return PyBool_FromLong(has);
}

static PyMethodDef Relay_methods[] = {
    {"start", (PyCFunction)Relay_start, METH_VARARGS,
     "start(engine_fd, client_fd, initial, chunked_out, wants_usage, on_usage) -> Stream: relay "
     "the rest of a chunked event-stream body (`initial`: its raw bytes already read) to the "
     "client; on_usage(event) parses each usage event and says whether it is the usage chunk."},
    {"poll", (PyCFunction)Relay_poll, METH_NOARGS,
     "Answer the usage events waiting (through on_usage); the streams that ended since the "
     "last poll, or None. Call it when fileno() is readable."},
    {"take_dirty", (PyCFunction)Relay_take_dirty, METH_NOARGS,
     "The streams with token records since the last call, or None."},
    {"fileno", (PyCFunction)Relay_fileno, METH_NOARGS,
     "A descriptor that is readable when poll() has something to do."},
    {"close", (PyCFunction)Relay_close, METH_NOARGS,
     "Stop the relay thread and close the set (no stream may run)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Relay_getset[] = {
    {"active", (getter)Relay_get_active, NULL, "streams being relayed", NULL},
    {"has_dirty", (getter)Relay_get_has_dirty, NULL, "whether take_dirty() has streams", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RelayType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fleetwarden.sidecar._fastrelay.Relay",
    .tp_basicsize = sizeof(RelayObject),
    .tp_dealloc = (destructor)Relay_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Relay_traverse,
    .tp_clear = (inquiry)Relay_clear,
    .tp_free = PyObject_GC_Del,
    .tp_doc = "An epoll set of relayed streams and the thread that relays them.",
    .tp_methods = Relay_methods,
    .tp_getset = Relay_getset,
    .tp_new = Relay_new,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastrelay", "The streamed-response byte relay in C.", -1, NULL,
};

PyMODINIT_FUNC PyInit__fastrelay(void) {
    if (PyType_Ready(&FrStreamType) < 0 || PyType_Ready(&RelayType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Relay", (PyObject *)&RelayType) < 0 ||
        PyModule_AddObjectRef(m, "Stream", (PyObject *)&FrStreamType) < 0 ||
        PyModule_AddIntConstant(m, "RUNNING", RUNNING) < 0 ||
        PyModule_AddIntConstant(m, "ENDED", ENDED) < 0 ||
        PyModule_AddIntConstant(m, "CLIENT_GONE", CLIENT_GONE) < 0 ||
        PyModule_AddIntConstant(m, "ENGINE_CLOSED", ENGINE_CLOSED) < 0 ||
        PyModule_AddIntConstant(m, "BAD_FRAMING", BAD_FRAMING) < 0 ||
        PyModule_AddIntConstant(m, "CANCELLED", CANCELLED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
