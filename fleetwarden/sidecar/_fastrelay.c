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

static PyTypeObject StreamType;
static PyTypeObject RelayType;

static void lock(RelayObject *relay) {
    if (pthread_mutex_trylock(&relay->mu) == 0) return;
    Py_BEGIN_ALLOW_THREADS /* the relay thread never waits for the GIL, but let others run */
    pthread_mutex_lock(&relay->mu);
    Py_END_ALLOW_THREADS
}

static void unlock(RelayObject *relay) { pthread_mutex_unlock(&relay->mu); }

/* ---- Stream ---------------------------------------------------------------------------------- */

static void Stream_dealloc(StreamObject *s) {
    /* Not running (the relay holds a reference while it does): no other thread touches it. */
    fr_close_fds(s);
    fr_buf_free(&s->line);
    fr_buf_free(&s->sse);
    fr_buf_free(&s->out);
    fr_buf_free(&s->scratch);
    fr_buf_free(&s->usage_event);
    free(s->records);
    Py_XDECREF(s->on_usage);
    Py_XDECREF((PyObject *)s->owner);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *Stream_take(StreamObject *s, PyObject *Py_UNUSED(ignored)) {
    lock(s->owner);
    size_t n = s->n_records;
    Record *records = NULL;
    if (n > 0) {
        records = malloc(n * sizeof(Record));
        if (records != NULL) {
            memcpy(records, s->records, n * sizeof(Record));
            s->n_records = 0;
        }
    }
    unlock(s->owner);
    if (n > 0 && records == NULL) return PyErr_NoMemory();
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject *item = Py_BuildValue("(dl)", records[i].t, records[i].n);
        if (item == NULL) Py_CLEAR(list);
        else PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    free(records);
    return list;
}

static int answer_usage(RelayObject *relay, StreamObject *s);

static PyObject *Stream_cancel(StreamObject *s, PyObject *Py_UNUSED(ignored)) {
    RelayObject *relay = s->owner;
    lock(relay);
    int was_running = s->outcome == RUNNING;
    fr_finish(s, CANCELLED, NULL, 0);
    fr_list_remove(&relay->asking, s);
    int pending = s->usage_event.len > 0; /* ended: the relay thread leaves it alone now */
    unlock(relay);
    if (was_running) fr_wake_relay(relay); /* a batch boundary releases the relay's reference */
    /* A usage event it was parked on was read: its counts still settle the request. */
    if (pending) answer_usage(relay, s);
    /* on_usage is usually a bound method of the object that holds this stream: a cycle the
       garbage collector cannot see (this type is not tracked), so it is broken here. */
    Py_CLEAR(s->on_usage);
    Py_RETURN_NONE;
}

static PyObject *Stream_take_unsent(StreamObject *s, PyObject *Py_UNUSED(ignored)) {
    lock(s->owner);
    if (s->outcome == RUNNING) {
        unlock(s->owner);
        PyErr_SetString(PyExc_RuntimeError, "the stream is still being relayed");
        return NULL;
    }
    unlock(s->owner); /* ended: the relay thread no longer writes it */
    PyObject *bytes = PyBytes_FromStringAndSize(s->out.data, (Py_ssize_t)s->out.len);
    if (bytes != NULL) s->out.len = 0;
    return bytes;
}

static PyObject *Stream_get_error(StreamObject *s, void *c) {
    lock(s->owner);
    const char *error = s->error;
    unlock(s->owner);
    if (error == NULL) Py_RETURN_NONE;
    return PyUnicode_FromString(error);
}

static PyObject *Stream_get_int(StreamObject *s, void *which) {
    long long value = 0;
    double last_rx;
    lock(s->owner);
    switch ((intptr_t)which) {
    case 0: value = s->outcome; break;
    case 1: value = s->seen_event; break;
    case 2: value = s->outcome == ENDED && !s->extra_bytes; break;
    case 3: value = s->bytes_written; break;
    case 4: value = s->tokens; break;
    case 5: value = s->engine_paused; break;
    case 7: value = (long long)s->out.len; break;
    default: break;
    }
    last_rx = s->last_rx;
    unlock(s->owner);
    switch ((intptr_t)which) {
    case 1: case 2: case 5: return PyBool_FromLong((long)value);
    case 6: return PyFloat_FromDouble(last_rx);
    default: return PyLong_FromLongLong(value);
    }
}

static PyMethodDef Stream_methods[] = {
    {"take", (PyCFunction)Stream_take, METH_NOARGS,
     "The (monotonic time, token events) of each engine read since the last take."},
    {"cancel", (PyCFunction)Stream_cancel, METH_NOARGS,
     "Stop relaying: out of the relay's set, its socket duplicates closed (no-op once ended)."},
    {"take_unsent", (PyCFunction)Stream_take_unsent, METH_NOARGS,
     "The bytes the client's socket had not taken when the stream ended (the caller sends them)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Stream_getset[] = {
    {"outcome", (getter)Stream_get_int, NULL, "0 running, 1 ended, 2 client gone, 3 engine closed, 4 bad framing, 5 cancelled", (void *)0},
    {"seen_event", (getter)Stream_get_int, NULL, "whether a data: event was forwarded", (void *)1},
    {"clean_end", (getter)Stream_get_int, NULL, "the body ended and nothing followed it", (void *)2},
    {"bytes_written", (getter)Stream_get_int, NULL, "bytes the client's socket took (not unsent)", (void *)3},
    {"tokens", (getter)Stream_get_int, NULL, "token events relayed", (void *)4},
    {"engine_paused", (getter)Stream_get_int, NULL, "the engine is not read (a slow client)", (void *)5},
    {"last_rx", (getter)Stream_get_int, NULL, "monotonic time of the last engine byte", (void *)6},
    {"unsent", (getter)Stream_get_int, NULL, "bytes held for the client's socket", (void *)7},
    {"error", (getter)Stream_get_error, NULL, "why the stream ended, if it failed", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject StreamType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fleetwarden.sidecar._fastrelay.Stream",
    .tp_basicsize = sizeof(StreamObject),
    .tp_dealloc = (destructor)Stream_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One streamed response relayed in C; made by Relay.start.",
    .tp_methods = Stream_methods,
    .tp_getset = Stream_getset,
};

/* ---- Relay ----------------------------------------------------------------------------------- */

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* Stops and joins the relay thread (it holds no Python state, so joining with the GIL released
   cannot deadlock, nor with it held). */
static void stop_thread(RelayObject *relay) {
    if (!relay->thread_started) return;
    pthread_mutex_lock(&relay->mu);
    relay->stopping = 1;
    pthread_mutex_unlock(&relay->mu);
    fr_wake_relay(relay);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(relay->thread, NULL);
    Py_END_ALLOW_THREADS
    relay->thread_started = 0;
}

/* After the thread stopped: drops the references the relay still holds. */
static void drop_references(RelayObject *relay) {
    StreamList *lists[] = {&relay->graveyard, &relay->released};
    relay->finished.len = relay->dirty.len = relay->asking.len = relay->answered.len = 0;
    for (size_t l = 0; l < 2; l++) {
        StreamList held = *lists[l];
        *lists[l] = (StreamList){NULL, 0, 0};
        for (size_t i = 0; i < held.len; i++) Py_DECREF((PyObject *)held.items[i]);
        fr_list_free(&held);
    }
}

static PyObject *Relay_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"nice", NULL};
    int nice = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|i:Relay", keywords, &nice)) return NULL;
    if (nice < 0 || nice > 19) {
        PyErr_SetString(PyExc_ValueError, "nice must be between 0 and 19");
        return NULL;
    }
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
    stop_thread(relay);
    drop_references(relay);
    close_fd(&relay->epfd);
    close_fd(&relay->notify_fd);
    close_fd(&relay->wake_fd);
    fr_list_free(&relay->finished);
    fr_list_free(&relay->dirty);
    fr_list_free(&relay->asking);
    fr_list_free(&relay->answered);
    pthread_mutex_destroy(&relay->mu);
    Py_TYPE(relay)->tp_free((PyObject *)relay);
}

static int busy(RelayObject *relay) {
    if (!relay->busy) return 0;
    PyErr_SetString(PyExc_RuntimeError, "the relay is polling (called from on_usage?)");
    return 1;
}

static int dup_fd(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 0); }

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
    StreamObject *s = PyObject_New(StreamObject, &StreamType);
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
    s->state = SIZE_LINE;
    s->last_rx = fr_now();
    s->engine_fd = dup_fd(engine_fd);
    s->client_fd = dup_fd(client_fd);
    if (s->engine_fd < 0 || s->client_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        PyBuffer_Release(&initial);
        s->outcome = CANCELLED;
        Py_DECREF(s);
        return NULL;
    }
    lock(relay);
    if (fr_epoll_set(relay, EPOLL_CTL_ADD, s->client_fd, EPOLLRDHUP, s, CLIENT_SIDE) < 0) {
        unlock(relay);
        PyErr_SetFromErrno(PyExc_OSError);
        PyBuffer_Release(&initial);
        s->outcome = CANCELLED;
        Py_DECREF(s);
        return NULL;
    }
    Py_INCREF(s); /* the relay's reference while it runs; fr_finish() moves it to the graveyard */
    s->running_in_relay = 1;
    relay->active++;
    if (initial.len > 0) fr_on_engine_bytes(s, initial.buf, (size_t)initial.len, s->last_rx);
    if (s->outcome == RUNNING) fr_update_engine_watch(s);
    int ended = s->outcome != RUNNING;
    unlock(relay);
    PyBuffer_Release(&initial);
    if (ended) fr_wake_relay(relay); /* a batch boundary releases the relay's reference */
    return (PyObject *)s;
}

/* What poll() took from the relay's lists, with references of its own (borrowed ones INCREF'd
   under the mutex; released ones are the relay's). */
typedef struct {
    StreamList finished, released, asking;
} Taken;

static int take_list(StreamList *from, StreamList *to, int incref) {
    *to = *from;
    *from = (StreamList){NULL, 0, 0};
    if (incref)
        for (size_t i = 0; i < to->len; i++) Py_INCREF((PyObject *)to->items[i]);
    return 0;
}

/* Calls on_usage on the stream's parked usage event (once: the event is consumed); 1 (usage
   chunk), 0, or -1 when on_usage raised (reported as unraisable). With `busy` set. Parked or
   ended, the relay thread leaves usage_event alone, so it is read without the mutex. */
static int answer_usage(RelayObject *relay, StreamObject *s) {
    if (s->usage_event.len == 0) return 1;
    int only = 1;
    PyObject *on_usage = s->on_usage != NULL ? Py_NewRef(s->on_usage) : NULL;
    if (on_usage != NULL) {
        int was_busy = relay->busy;
        relay->busy = 1;
        PyObject *answer = PyObject_CallFunction(on_usage, "y#", s->usage_event.data,
                                                 (Py_ssize_t)s->usage_event.len);
        relay->busy = was_busy;
        Py_DECREF(on_usage);
        only = answer == NULL ? -1 : PyObject_IsTrue(answer);
        Py_XDECREF(answer);
        if (only < 0) PyErr_WriteUnraisable((PyObject *)s);
    }
    s->usage_event.len = 0;
    return only;
}

/* Asks on_usage about each parked stream's event, ended ones too (their usage still settles
   the request); the answers for running ones go back to the relay thread. */
static void ask(RelayObject *relay, StreamList *asking) {
    int wake = 0;
    for (size_t i = 0; i < asking->len; i++) {
        StreamObject *s = asking->items[i];
        int only = answer_usage(relay, s);
        lock(relay);
        if (s->outcome == RUNNING && s->parked) {
            if (only < 0) {
                fr_finish(s, ENGINE_CLOSED, "the relay could not read a usage event", 1);
                wake = 1; /* a batch boundary releases the relay's reference */
            } else {
                s->answer = only;
                wake |= fr_list_push(&relay->answered, s) == 0;
            }
        }
        unlock(relay);
    }
    if (wake) fr_wake_relay(relay);
}

static PyObject *Relay_poll(RelayObject *relay, PyObject *Py_UNUSED(ignored)) {
    if (relay->epfd < 0) Py_RETURN_NONE;
    if (busy(relay)) return NULL;
    Taken taken;
    lock(relay);
    uint64_t count;
    if (read(relay->notify_fd, &count, sizeof(count)) < 0) { /* EAGAIN: nothing signalled */
    }
    relay->notified = 0;
    take_list(&relay->finished, &taken.finished, 1);
    take_list(&relay->released, &taken.released, 0);
    take_list(&relay->asking, &taken.asking, 1);
    unlock(relay);
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
    StreamList dirty;
    lock(relay);
    take_list(&relay->dirty, &dirty, 1);
    for (size_t i = 0; i < dirty.len; i++) dirty.items[i]->dirty = 0;
    unlock(relay);
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
    lock(relay);
    long active = relay->active;
    unlock(relay);
    if (active > 0) {
        PyErr_SetString(PyExc_RuntimeError, "streams are still being relayed: cancel them first");
        return NULL;
    }
    stop_thread(relay);
    drop_references(relay);
    close_fd(&relay->epfd);
    close_fd(&relay->notify_fd);
    close_fd(&relay->wake_fd);
    Py_RETURN_NONE;
}

static PyObject *Relay_get_active(RelayObject *relay, void *c) {
    lock(relay);
    long active = relay->active;
    unlock(relay);
    return PyLong_FromLong(active);
}

static PyObject *Relay_get_has_dirty(RelayObject *relay, void *c) {
    lock(relay);
    int has = relay->dirty.len > 0;
    unlock(relay);
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
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An epoll set of relayed streams and the thread that relays them.",
    .tp_methods = Relay_methods,
    .tp_getset = Relay_getset,
    .tp_new = Relay_new,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastrelay", "The streamed-response byte relay in C.", -1, NULL,
};

PyMODINIT_FUNC PyInit__fastrelay(void) {
    if (PyType_Ready(&StreamType) < 0 || PyType_Ready(&RelayType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Relay", (PyObject *)&RelayType) < 0 ||
        PyModule_AddObjectRef(m, "Stream", (PyObject *)&StreamType) < 0 ||
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
