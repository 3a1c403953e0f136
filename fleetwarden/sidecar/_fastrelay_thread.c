/*
 * The C relay's thread and its hand-over lists (`_fastrelay.c` says what the relay is and why).
 *
 * The relay thread waits on the epoll set, then handles the ready sockets of one batch with the
 * relay's mutex held. It never holds the GIL: what Python must see (streams that ended, usage
 * events to parse, streams with token records) goes into C lists, and the event loop is woken
 * through `notify_fd` once per change from nothing to something.
 */
#include "_fastrelay.h"

#include <sys/resource.h>
#include <sys/syscall.h>

/* Room for `cap` streams at least (doubling, so that pushes stay O(1) amortised). */
int fr_list_reserve(StreamList *list, size_t cap) {
    if (cap <= list->cap) return 0;
    size_t grown = list->cap ? list->cap * 2 : 16;
    if (grown < cap) grown = cap;
    StreamObject **items = realloc(list->items, grown * sizeof(*items));
    if (items == NULL) return -1;
    list->items = items;
    list->cap = grown;
    return 0;
}

int fr_list_push(StreamList *list, StreamObject *s) {
    if (fr_list_reserve(list, list->len + 1) < 0) return -1;
    list->items[list->len++] = s;
    return 0;
}

/* A list whose streams know their index, in the field at offset `at` (RUNNING_AT, OWNED_AT):
   O(1) both ways, the order meaning nothing. */
#define INDEX_IN(s, at) (*(size_t *)((char *)(s) + (at)))

int fr_indexed_add(StreamList *list, StreamObject *s, size_t at) {
    INDEX_IN(s, at) = list->len;
    return fr_list_push(list, s);
}

void fr_indexed_remove(StreamList *list, StreamObject *s, size_t at) {
    StreamObject *last = list->items[--list->len];
    list->items[INDEX_IN(s, at)] = last;
    INDEX_IN(last, at) = INDEX_IN(s, at);
}

void fr_list_remove(StreamList *list, StreamObject *s) {
    for (size_t i = 0; i < list->len; i++) {
        if (list->items[i] == s) {
            memmove(list->items + i, list->items + i + 1, (list->len - i - 1) * sizeof(*list->items));
            list->len--;
            return;
        }
    }
}

void fr_list_free(StreamList *list) {
    free(list->items);
    list->items = NULL;
    list->len = list->cap = 0;
}

static void write_eventfd(int fd) {
    uint64_t one = 1;
    while (write(fd, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
}

/* Wakes the event loop (it calls poll()): once until poll() has taken what there was. */
void fr_signal_loop(RelayObject *relay) {
    if (relay->notified || relay->notify_fd < 0) return;
    relay->notified = 1;
    write_eventfd(relay->notify_fd);
}

/* Wakes the relay thread for a batch: answers to apply, references to release, or stop. */
void fr_wake_relay(RelayObject *relay) {
    if (relay->wake_fd >= 0) write_eventfd(relay->wake_fd);
}

static void drain_eventfd(int fd) {
    uint64_t count;
    while (read(fd, &count, sizeof(count)) < 0 && errno == EINTR) {
    }
}

/* One batch: every ready socket, then the answers Python gave, then the batch boundary. The
   mutex is let go between sockets, not held per batch: on a shared core the loop's thread, woken
   when it is let go, preempts this one (niceness 19) and waits for one socket's work at most.
   On another core it may find the mutex taken again (glibc's mutex is not fair) and wait for
   the batch, at most MAX_EVENTS sockets' work, which does not stall the core it runs on. */
static void handle_batch(RelayObject *relay, struct epoll_event *events, int n) {
    for (int i = 0; i < n; i++) {
        if (i > 0) {
            pthread_mutex_unlock(&relay->mu);
            pthread_mutex_lock(&relay->mu);
            if (relay->stopping) return; /* its wake-up may be drained below: fr_relay_main */
        }
        uint64_t data = events[i].data.u64;
        if (data == WAKE_TAG) {
            drain_eventfd(relay->wake_fd);
            continue;
        }
        StreamObject *s = (StreamObject *)(uintptr_t)(data & ~(uint64_t)1);
        /* Ended (by an earlier event of this batch, or by the loop's thread since epoll_wait
           returned): its memory is still ours, since its reference is in the graveyard. */
        if (s->outcome != RUNNING) continue;
        if (data & 1)
            fr_on_client_ready(s, events[i].events);
        else if (s->engine_watched)
            fr_on_engine_ready(relay, s);
    }
    while (relay->answered.len > 0) {
        StreamObject *s = relay->answered.items[0];
        fr_list_remove(&relay->answered, s);
        fr_apply_answer(s);
    }
    /* The batch boundary: no event fetched from now on can name a stream that ended before
       it, so the references of those streams may go (poll() drops them, with the GIL). */
    for (size_t i = 0; i < relay->graveyard.len; i++) {
        if (fr_list_push(&relay->released, relay->graveyard.items[i]) < 0) {
            /* out of memory: keep the rest for the next boundary */
            memmove(relay->graveyard.items, relay->graveyard.items + i,
                    (relay->graveyard.len - i) * sizeof(*relay->graveyard.items));
            relay->graveyard.len -= i;
            goto signal;
        }
    }
    relay->graveyard.len = 0;
signal:
    if (relay->finished.len > 0 || relay->released.len > 0 || relay->asking.len > 0)
        fr_signal_loop(relay);
}

void *fr_relay_main(void *arg) {
    RelayObject *relay = arg;
    /* Niceness is per thread on Linux: this one yields the core to the event loop's thread,
       whose admission work a new request waits for, while it runs (docs/performance.md). Raising
       one's own niceness needs no privilege; failing to is harmless. */
    if (relay->nice > 0) setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), relay->nice);
    struct epoll_event events[MAX_EVENTS];
    for (;;) {
        int n = epoll_wait(relay->epfd, events, MAX_EVENTS, -1);
        int failed = n < 0 && errno != EINTR; /* not on a valid set: never spin on it */
        pthread_mutex_lock(&relay->mu);
        if (relay->stopping) {
            pthread_mutex_unlock(&relay->mu);
            return NULL;
        }
        if (n > 0) handle_batch(relay, events, n);
        /* Asked to stop while the batch let go of the mutex: the stop's wake-up may be the one
           a wake event of this batch drained, so nothing would wake epoll_wait for it. */
        int stop = relay->stopping;
        pthread_mutex_unlock(&relay->mu);
        if (stop) return NULL;
        if (failed) usleep(1000);
    }
}
