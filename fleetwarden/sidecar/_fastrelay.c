/*
 * fleetwarden.sidecar._fastrelay: the streamed-response byte relay in C (docs/performance.md,
 * "The native relay").
 *
 * Why: after the response head, relaying a streamed completion is bytes in, bytes out, once per
 * token. In Python each of those reads costs a loop callback, the chunk parser and a transport
 * write, about 20 us of CPU on top of the kernel's share, and every new request waits behind
 * them: that was most of the sidecar's added first-token latency. Here one epoll set holds every
 * stream's engine and client sockets (duplicates of the event loop's, so a socket closed by the
 * loop can never be mistaken for another one that reuses its number); the event loop watches that
 * set's descriptor and calls `Relay.poll`, which handles every ready socket in C. Nothing here
 * decides anything: no clock but CLOCK_MONOTONIC (the clock of `time.monotonic`, which the
 * sidecar's scheduler uses), no threads, no Python callbacks. Token counts with their read times
 * are kept per stream for Python to take (charges, metrics and the fluidity index stay in the
 * Python classes), and the engine's usage event is kept for Python to parse.
 *
 * The rules are those of `stream.py` (split_events): an event is a run of bytes ended by a blank
 * line; `data: [DONE]` is forwarded, not counted; an event with a usage object is handed to the
 * stream's Python `on_usage` callable, which parses it as `split_events` does, keeps the usage
 * and says whether it is the engine's usage chunk (no choices: dropped from the client's stream
 * unless the client asked for usage, not a token); the role-only opening event is forwarded, not
 * counted; any other event whose first bytes are `data:` is one token. tests/sidecar run both
 * relays on the same cases.
 *
 * Single-threaded by design: every function runs on the event loop's thread with the GIL held.
 */
#include "_fastrelay.h"

static PyTypeObject StreamType;
static PyTypeObject RelayType;

/* ---- Stream ---------------------------------------------------------------------------------- */

static void Stream_dealloc(StreamObject *s) {
    fr_close_fds(s);
    fr_buf_free(&s->line);
    fr_buf_free(&s->sse);
    fr_buf_free(&s->out);
    fr_buf_free(&s->scratch);
    PyMem_Free(s->records);
    Py_XDECREF(s->on_usage);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *Stream_take(StreamObject *s, PyObject *Py_UNUSED(ignored)) {
    PyObject *list = PyList_New((Py_ssize_t)s->n_records);
    if (list == NULL) return NULL;
    for (size_t i = 0; i < s->n_records; i++) {
        PyObject *item = Py_BuildValue("(dl)", s->records[i].t, s->records[i].n);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    s->n_records = 0;
    return list;
}

static PyObject *Stream_cancel(StreamObject *s, PyObject *Py_UNUSED(ignored)) {
    if (fr_finish(s, CANCELLED, NULL, 0) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Stream_take_unsent(StreamObject *s, PyObject *Py_UNUSED(ignored)) {
    if (s->outcome == RUNNING) {
        PyErr_SetString(PyExc_RuntimeError, "the stream is still being relayed");
        return NULL;
    }
    PyObject *bytes = PyBytes_FromStringAndSize(s->out.data, (Py_ssize_t)s->out.len);
    if (bytes != NULL) s->out.len = 0;
    return bytes;
}

static PyObject *Stream_get_error(StreamObject *s, void *c) {
    if (s->error == NULL) Py_RETURN_NONE;
    return PyUnicode_FromString(s->error);
}

static PyObject *Stream_get_int(StreamObject *s, void *which) {
    switch ((intptr_t)which) {
    case 0: return PyLong_FromLong(s->outcome);
    case 1: return PyBool_FromLong(s->seen_event);
    case 2: return PyBool_FromLong(s->outcome == ENDED && !s->extra_bytes);
    case 3: return PyLong_FromLongLong(s->bytes_written);
    case 4: return PyLong_FromLongLong(s->tokens);
    case 5: return PyBool_FromLong(s->engine_paused);
    case 7: return PyLong_FromSize_t(s->out.len);
    default: return PyFloat_FromDouble(s->last_rx);
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

static PyObject *Relay_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) > 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) > 0)) {
        PyErr_SetString(PyExc_TypeError, "Relay() takes no arguments");
        return NULL;
    }
    RelayObject *relay = (RelayObject *)type->tp_alloc(type, 0);
    if (relay == NULL) return NULL;
    relay->epfd = epoll_create1(EPOLL_CLOEXEC);
    relay->finished = PyList_New(0);
    relay->dirty = PyList_New(0);
    if (relay->epfd < 0 || relay->finished == NULL || relay->dirty == NULL) {
        if (relay->epfd < 0) PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(relay);
        return NULL;
    }
    return (PyObject *)relay;
}

static void Relay_dealloc(RelayObject *relay) {
    if (relay->epfd >= 0) close(relay->epfd);
    Py_XDECREF(relay->finished);
    Py_XDECREF(relay->dirty);
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
    s->engine_fd = s->client_fd = -1;
    s->chunked_out = chunked_out;
    s->wants_usage = wants_usage;
    s->on_usage = Py_NewRef(on_usage);
    s->state = SIZE_LINE;
    s->last_rx = fr_now();
    s->engine_fd = dup_fd(engine_fd);
    s->client_fd = dup_fd(client_fd);
    if (s->engine_fd < 0 || s->client_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto fail;
    }
    s->relay = relay; /* before registering: fr_close_fds() deregisters through it */
    if (fr_epoll_set(relay, EPOLL_CTL_ADD, s->engine_fd, EPOLLIN | EPOLLRDHUP, s, ENGINE_SIDE) < 0 ||
        fr_epoll_set(relay, EPOLL_CTL_ADD, s->client_fd, EPOLLRDHUP, s, CLIENT_SIDE) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto fail;
    }
    Py_INCREF(relay);
    Py_INCREF(s); /* the relay's reference while it runs; fr_finish() drops it */
    relay->active++;
    relay->busy = 1;
    int rc = initial.len > 0 ? fr_on_engine_bytes(s, initial.buf, (size_t)initial.len, s->last_rx) : 0;
    relay->busy = 0;
    if (rc < 0) {
        PyBuffer_Release(&initial);
        fr_finish(s, CANCELLED, NULL, 0);
        Py_DECREF(s);
        return NULL;
    }
    PyBuffer_Release(&initial);
    return (PyObject *)s;
fail:
    PyBuffer_Release(&initial);
    fr_close_fds(s);
    s->relay = NULL;
    s->outcome = CANCELLED;
    Py_DECREF(s);
    return NULL;
}

static PyObject *Relay_poll(RelayObject *relay, PyObject *Py_UNUSED(ignored)) {
    struct epoll_event events[MAX_EVENTS];
    if (relay->epfd < 0) Py_RETURN_NONE;
    if (busy(relay)) return NULL;
    relay->busy = 1;
    int rc = 0;
    for (;;) {
        int n = epoll_wait(relay->epfd, events, MAX_EVENTS, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            PyErr_SetFromErrno(PyExc_OSError);
            rc = -1;
            break;
        }
        /* Every stream of the batch stays alive until the batch is done, whatever the Python
           code that on_usage runs does meanwhile. */
        for (int i = 0; i < n; i++) Py_INCREF((PyObject *)(uintptr_t)(events[i].data.u64 & ~(uint64_t)1));
        for (int i = 0; i < n && rc == 0; i++) {
            uint64_t data = events[i].data.u64;
            StreamObject *s = (StreamObject *)(uintptr_t)(data & ~(uint64_t)1);
            if (s->outcome != RUNNING) continue; /* ended by an earlier event of this batch */
            rc = (data & 1) ? fr_on_client_ready(s, events[i].events) : fr_on_engine_ready(relay, s);
        }
        for (int i = 0; i < n; i++) Py_DECREF((PyObject *)(uintptr_t)(events[i].data.u64 & ~(uint64_t)1));
        if (rc < 0 || n < MAX_EVENTS) break;
    }
    relay->busy = 0;
    if (rc < 0) return NULL;
    if (PyList_GET_SIZE(relay->finished) == 0) Py_RETURN_NONE;
    PyObject *finished = relay->finished;
    relay->finished = PyList_New(0);
    if (relay->finished == NULL) {
        relay->finished = finished;
        return NULL;
    }
    return finished;
}

static PyObject *Relay_take_dirty(RelayObject *relay, PyObject *Py_UNUSED(ignored)) {
    if (PyList_GET_SIZE(relay->dirty) == 0) Py_RETURN_NONE;
    PyObject *dirty = relay->dirty;
    relay->dirty = PyList_New(0);
    if (relay->dirty == NULL) {
        relay->dirty = dirty;
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(dirty); i++)
        ((StreamObject *)PyList_GET_ITEM(dirty, i))->dirty = 0;
    return dirty;
}

static PyObject *Relay_fileno(RelayObject *relay, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromLong(relay->epfd);
}

static PyObject *Relay_close(RelayObject *relay, PyObject *Py_UNUSED(ignored)) {
    if (busy(relay)) return NULL;
    if (relay->active > 0) {
        PyErr_SetString(PyExc_RuntimeError, "streams are still being relayed: cancel them first");
        return NULL;
    }
    if (relay->epfd >= 0) close(relay->epfd);
    relay->epfd = -1;
    Py_RETURN_NONE;
}

static PyObject *Relay_get_active(RelayObject *relay, void *c) { return PyLong_FromLong(relay->active); }

static PyObject *Relay_get_has_dirty(RelayObject *relay, void *c) {
    return PyBool_FromLong(PyList_GET_SIZE(relay->dirty) > 0);
}

static PyMethodDef Relay_methods[] = {
    {"start", (PyCFunction)Relay_start, METH_VARARGS,
     "start(engine_fd, client_fd, initial, chunked_out, wants_usage, on_usage) -> Stream: relay "
     "the rest of a chunked event-stream body (`initial`: its raw bytes already read) to the "
     "client; on_usage(event) parses each usage event and says whether it is the usage chunk."},
    {"poll", (PyCFunction)Relay_poll, METH_NOARGS,
     "Handle every ready socket; the streams that ended meanwhile, or None."},
    {"take_dirty", (PyCFunction)Relay_take_dirty, METH_NOARGS,
     "The streams with token records since the last call, or None."},
    {"fileno", (PyCFunction)Relay_fileno, METH_NOARGS, "The epoll set's descriptor (readable: poll)."},
    {"close", (PyCFunction)Relay_close, METH_NOARGS, "Close the epoll set (no stream may run)."},
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
    .tp_doc = "An epoll set of relayed streams, polled from the event loop.",
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
