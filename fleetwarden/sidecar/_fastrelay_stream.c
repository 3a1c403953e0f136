/*
 * The C relay's Stream type: one streamed response, made by `Relay.start` (`_fastrelay.c` says
 * what the relay is and why; `_fastrelay.h` says which thread touches what).
 */
#include "_fastrelay.h"

static void Stream_dealloc(StreamObject *s) {
    /* Not running (the relay holds a reference while it does): no other thread touches it. */
    PyObject_GC_UnTrack(s);
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

/* The garbage collector sees a stream's references: its relay and on_usage (usually a bound
   method of the object holding the stream, which is how cycles through Python form). Neither
   changes on the relay thread. Clearing drops on_usage only: the relay's mutex must outlive the
   stream, and the relay's own clear breaks the cycle through it. */
static int Stream_traverse(StreamObject *s, visitproc visit, void *arg) {
    Py_VISIT((PyObject *)s->owner);
    Py_VISIT(s->on_usage);
    return 0;
}

static int Stream_clear(StreamObject *s) {
    Py_CLEAR(s->on_usage);
    return 0;
}

static PyObject *Stream_take(StreamObject *s, PyObject *Py_UNUSED(ignored)) {
    fr_lock(s->owner);
    size_t n = s->n_records;
    Record *records = NULL;
    if (n > 0) {
        records = malloc(n * sizeof(Record));
        if (records != NULL) {
            memcpy(records, s->records, n * sizeof(Record));
            s->n_records = 0;
        }
    }
    fr_unlock(s->owner);
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

static PyObject *Stream_cancel(StreamObject *s, PyObject *Py_UNUSED(ignored)) {
    RelayObject *relay = s->owner;
    fr_lock(relay);
    int was_running = s->outcome == RUNNING;
    fr_finish(s, CANCELLED, NULL, 0);
    fr_list_remove(&relay->asking, s);
    int pending = s->usage_event.len > 0; /* ended: the relay thread leaves it alone now */
    fr_unlock(relay);
    if (was_running) fr_wake_relay(relay); /* a batch boundary releases the relay's reference */
    /* A usage event it was parked on was read: its counts still settle the request. */
    if (pending) fr_answer_usage(relay, s);
    /* on_usage is usually a bound method of the object that holds this stream: the cycle is
       broken here rather than left to the garbage collector. */
    Py_CLEAR(s->on_usage);
    Py_RETURN_NONE;
}

static PyObject *Stream_take_unsent(StreamObject *s, PyObject *Py_UNUSED(ignored)) {
    fr_lock(s->owner);
    if (s->outcome == RUNNING) {
        fr_unlock(s->owner);
        PyErr_SetString(PyExc_RuntimeError, "the stream is still being relayed");
        return NULL;
    }
    fr_unlock(s->owner); /* ended: the relay thread no longer writes it */
    PyObject *bytes = PyBytes_FromStringAndSize(s->out.data, (Py_ssize_t)s->out.len);
    if (bytes != NULL) s->out.len = 0;
    return bytes;
}

static PyObject *Stream_get_error(StreamObject *s, void *c) {
    fr_lock(s->owner);
    const char *error = s->error;
    fr_unlock(s->owner);
    if (error == NULL) Py_RETURN_NONE;
    return PyUnicode_FromString(error);
}

static PyObject *Stream_get_int(StreamObject *s, void *which) {
    long long value = 0;
    double last_rx;
    fr_lock(s->owner);
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
    fr_unlock(s->owner);
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

PyTypeObject FrStreamType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fleetwarden.sidecar._fastrelay.Stream",
    .tp_basicsize = sizeof(StreamObject),
    .tp_dealloc = (destructor)Stream_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Stream_traverse,
    .tp_clear = (inquiry)Stream_clear,
    .tp_free = PyObject_GC_Del,
    .tp_doc = "One streamed response relayed in C; made by Relay.start.",
    .tp_methods = Stream_methods,
    .tp_getset = Stream_getset,
};

/* Calls on_usage on the stream's parked usage event (once: the event is consumed); 1 (usage
   chunk), 0, or -1 when on_usage raised (reported as unraisable). With `busy` set. Parked or
   ended, the relay thread leaves usage_event alone, so it is read without the mutex. */
int fr_answer_usage(RelayObject *relay, StreamObject *s) {
    if (s->usage_event.len == 0) return 1;
    int only = 1;
    PyObject *on_usage = s->on_usage != NULL ? Py_NewRef(s->on_usage) : NULL;
    PyObject *event = NULL;
    if (on_usage != NULL) {
        event = PyBytes_FromStringAndSize(s->usage_event.data, (Py_ssize_t)s->usage_event.len);
        only = event == NULL ? -1 : 1;
    }
    s->usage_event.len = 0; /* consumed before the call: on_usage may cancel its own stream */
    if (event != NULL) {
        int was_busy = relay->busy;
        relay->busy = 1;
        PyObject *answer = PyObject_CallOneArg(on_usage, event);
        relay->busy = was_busy;
        only = answer == NULL ? -1 : PyObject_IsTrue(answer);
        Py_XDECREF(answer);
        Py_DECREF(event);
    }
    Py_XDECREF(on_usage);
    if (only < 0) PyErr_WriteUnraisable((PyObject *)s);
    return only;
}
