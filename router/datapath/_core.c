/* The native data path's C core (router/datapath/native_path.py drives it).
 *
 * One epoll loop carries the sockets of the connections the fast path serves: listeners, accept4,
 * the opening reads, non-blocking connects, the relay with backpressure and half-close, the phase
 * deadlines and the close. It decides nothing: at each step that needs a decision it calls its
 * handler (a Python object) with plain values and carries out the action the handler returns.
 *
 *   handler.accepted(listener_token, cid, fd, host, port)  -> action
 *   handler.read(token, bytes | None)                      -> action   (None: the read failed)
 *   handler.timed_out(token)                               -> action   (handshake deadline)
 *   handler.connected(token)                               -> None
 *   handler.upstream(token, bytes, first)                  -> None     (flags F_FIRST / F_FEED)
 *   handler.connect_failed(token, errno | reason, no_socket) -> action
 *   handler.closed(token, reason, bytes_in, bytes_out)     -> None
 *   handler.accept_wait(listener_token, errno)             -> float    (seconds to stop accepting)
 *   handler.resumed(listener_token)                        -> None
 *   handler.wake()                                         -> None     (the wake descriptor is ready)
 *
 * Actions: None (go on reading the opening), (ACT_WAIT, token|None, reply, read_size),
 * (ACT_CLOSE, answer), (ACT_PROXY, token, host, port, replay, flags), (ACT_HANDOVER,).
 *
 * A lean connection (ACT_PROXY with F_LEAN) is carried by the core alone once decided: its token
 * is a tuple (host, port, router, key, node_id, target index, router index, record) and the
 * handler hears nothing of its connect and its end. The core counts them per target index
 * (connections open, connect-time histogram, bytes of those ended: `lean_counts`), writes their
 * two INFO lines through the C line buffer (`set_lines`), tells the BROKER_CLOSED_EARLY rule
 * itself, and hands the tokens of those that ended to handler.released(list) once per turn of the
 * loop (their admission). The rest goes to the handler as for any connection: a failed connect,
 * a first answer (F_FIRST), and, when the router needs the connection as an object (its registry
 * is read, it closes it for a reason of its own, an MQTT broker refused the client),
 * handler.materialized(...) -> the token it is from then on, an ordinary connection's. A lean MQTT
 * connection (F_MQTT) has its broker's packets followed here (MqttFrames in router/core/framing.py,
 * ported), so that the object made of it knows where they end.
 *
 *   handler.materialized(token, cid, fd, connected, age_s, silent, why, frames) -> token
 *         why: M_READ (its registry is read: the caller registers it), M_CLOSING (the router closes
 *         it now), M_ANSWER (its first answer is a refusal: the handler registers it, the answer
 *         follows as an ordinary connection's); frames: (count, bytes left, header part, lost)
 *   handler.lean_failed(token, reason, bytes_in, bytes_out, duration_s) -> None (passive health)
 *   handler.released(tokens)                                 -> None
 * A handler's own exceptions are its business (it logs them and returns a safe action); one
 * that escapes is written as unraisable and costs its connection only.
 *
 * Sockets are registered once (edge-triggered, in, out and read-hangup) and closed without
 * EPOLL_CTL_DEL; readiness is kept per side (rd, wr) and the relay pumps until the kernel says
 * EAGAIN, a side's peer has unsent bytes (backpressure), or a fairness bound (then the connection
 * waits on the run queue for the next turn of the loop). Deadlines live on FIFO lists, one per
 * duration (every listener's handshake timeout, the connect timeout): each list is sorted by
 * construction, so arming and expiring are O(1). Connections live in chunks that are never moved,
 * found by a cid (slot index and generation) that stays unique while the slot is reused.
 *
 * Threads: every method runs with the GIL held; the loop holds it except while in epoll_wait.
 * Only the loop's thread changes the table (its callbacks and `wake` included); other threads
 * read counts and snapshots under the GIL.
 */
#define _GNU_SOURCE /* splice */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK_BITS 10
#define CHUNK (1u << CHUNK_BITS)
#define MAX_CHUNKS (1u << 20)
#define ACCEPT_BATCH 64
#define EVENTS 256
#define PUMP_ROUNDS 16
#define TICK_MS 250
#define NIL (-1)
#define SPLICE_AFTER (64 * 1024) /* bytes one way before that way goes through a pipe (HAProxy's splice-auto) */
#define SPLICE_MAX (1024 * 1024)
#define PIPE_POOL 64             /* empty pipes kept for the next bulk connection */

enum { ACT_WAIT = 0, ACT_CLOSE = 1, ACT_PROXY = 2, ACT_HANDOVER = 3 };
enum { F_FIRST = 1, F_FEED = 2, F_LEAN = 4, F_MQTT = 8 };
enum { S_FREE = 0, S_OPENING, S_DECIDING, S_CONNECTING, S_RELAY };
enum { K_SIDE0 = 0, K_SIDE1 = 1, K_LISTENER = 2, K_WAKE = 3 };
enum { R_CLOSED = 0, R_RESET = 1, R_EARLY = 2, R_COUNT = 3 };
enum {
    CB_ACCEPTED, CB_READ, CB_TIMED_OUT, CB_CONNECTED, CB_UPSTREAM, CB_CONNECT_FAILED, CB_CLOSED,
    CB_ACCEPT_WAIT, CB_RESUMED, CB_WAKE, CB_MATERIALIZED, CB_LEAN_FAILED, CB_RELEASED, CB_COUNT
};
static const char *const CALLBACKS[CB_COUNT] = {
    "accepted", "read", "timed_out", "connected", "upstream", "connect_failed", "closed",
    "accept_wait", "resumed", "wake", "materialized", "lean_failed", "released",
};
enum { L_HOST, L_PORT, L_ROUTER, L_KEY, L_NODE, L_TARGET, L_ROUTER_IX, L_SIZE }; /* a lean token */
enum { M_READ = 0, M_CLOSING = 1, M_ANSWER = 2 };
#define MQTT_HEADER_MAX 5 /* a type byte and a remaining length of 4 bytes at most */

typedef struct {
    int r, w;
    uint32_t len; /* bytes in the pipe: read from one side, not yet written to the other */
} Pipe;

typedef struct {
    uint32_t gen;
    uint8_t state, flags, registered, queued;
    uint8_t rd[2], wr[2], eof[2], hup[2]; /* hup: the peer's EOF or an error was signalled */
    int fd[2];
    int32_t listener;
    int32_t tnext, tprev, tlist; /* deadline list: -1 none, 0 connect, 1 + i listener i */
    int32_t rnext;               /* run queue */
    uint32_t read_size;
    double deadline;
    char *pend[2];               /* bytes read from side i that side 1 - i has not taken yet */
    uint32_t plen[2], poff[2];
    uint64_t count[2];
    Pipe *pipe[2];               /* side i's bytes go through a pipe once it sent SPLICE_AFTER */
    PyObject *token;
    double t_start, t_connected; /* lean: when the connect started, when it completed */
    int32_t target, router;      /* lean: its counters' index, its router's index */
    uint8_t silent;              /* lean: the broker ended without a byte after the client's */
    uint8_t held;                /* lean: the loop's thread is ending or materializing it (its calls to
                                  * the handler may let another thread run): others leave it */
    uint8_t mq_lost, mq_headlen; /* lean MQTT: the broker's packets (MqttFrames' state) */
    uint8_t mq_head[MQTT_HEADER_MAX];
    uint32_t mq_left;
    uint64_t mq_frames;
} Conn;

typedef struct {
    uint64_t opened, ended, moved; /* lean connections connected, ended, materialized while open */
    uint64_t bytes[2];             /* bytes each way of the lean connections that ended */
    uint64_t *hist;                /* connect times: one count per bucket, then +Inf */
    double sum;
} LeanTarget;

typedef struct {
    int32_t head, tail;
    double duration;
} TimerList;

typedef struct {
    int fd;
    uint8_t active, paused, sniffs, rated;
    double resume_at;
    TimerList handshake;
    PyObject *token;
} Listener;

typedef struct {
    PyObject_HEAD
    int ep;
    int wake_fd;
    int stopping;
    int running;
    Conn **chunks;
    uint32_t nchunks;
    int32_t free_head;
    uint32_t live, proxied;
    Listener *ls;
    int32_t nls, cap_ls;
    TimerList connect;
    int32_t runq_head, runq_tail;
    char *buf;
    size_t bufsize;
    Pipe *pipes[PIPE_POOL];
    int npipes;
    uint64_t spliced;
    PyObject *cb[CB_COUNT];
    PyObject *reasons[R_COUNT];
    PyObject *reason_names[R_COUNT];
    double early_close_s;
    PyObject *released;          /* lean tokens ended this turn (their admission goes back) */
    PyObject *empty;             /* "": a lean close's detail */
    PyObject *lines_connected, *lines_closed, *flush_lines;
    double *bounds;              /* the connect-time histogram's bucket bounds */
    int32_t nbounds;
    LeanTarget *targets;
    int32_t ntargets;
    uint32_t *lean_alive;        /* lean connections (connecting or relayed) by router index */
    int32_t nrouters;
} Core;

/* -- time -- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* -- the table -- */

static inline Conn *slot(Core *c, int32_t i) { return &c->chunks[i >> CHUNK_BITS][i & (CHUNK - 1)]; }

static inline int64_t cid_of(Core *c, int32_t i) { return ((int64_t)slot(c, i)->gen << 32) | (uint32_t)i; }

static int32_t find(Core *c, int64_t cid) {
    if (cid < 0) return NIL;
    uint32_t i = (uint32_t)(cid & 0xffffffff), gen = (uint32_t)(cid >> 32);
    if ((i >> CHUNK_BITS) >= c->nchunks) return NIL;
    Conn *k = slot(c, (int32_t)i);
    return (k->state != S_FREE && k->gen == gen) ? (int32_t)i : NIL;
}

static int32_t alloc_slot(Core *c) {
    if (c->free_head == NIL) {
        if (c->nchunks == MAX_CHUNKS) return NIL;
        Conn **chunks = PyMem_Realloc(c->chunks, sizeof(Conn *) * (c->nchunks + 1));
        if (chunks == NULL) return NIL;
        c->chunks = chunks;
        Conn *chunk = PyMem_Calloc(CHUNK, sizeof(Conn));
        if (chunk == NULL) return NIL;
        c->chunks[c->nchunks] = chunk;
        int32_t base = (int32_t)(c->nchunks << CHUNK_BITS);
        for (int32_t j = CHUNK - 1; j >= 0; j--) {
            chunk[j].tnext = c->free_head; /* the free list reuses tnext */
            c->free_head = base + j;
        }
        c->nchunks++;
    }
    int32_t i = c->free_head;
    Conn *k = slot(c, i);
    c->free_head = k->tnext;
    uint32_t gen = k->gen + 1;
    /* A slot freed while on the run queue stays on it (the queue is a list through the slots): its
     * new connection is pumped there once, harmlessly, and the rest of the list stays reachable. */
    uint8_t queued = k->queued;
    int32_t rnext = k->rnext;
    memset(k, 0, sizeof(*k));
    k->gen = gen ? gen : 1;
    k->fd[0] = k->fd[1] = -1;
    k->tnext = k->tprev = k->tlist = NIL;
    k->queued = queued;
    k->rnext = queued ? rnext : NIL;
    k->listener = NIL;
    c->live++;
    return i;
}

/* -- deadlines -- */

static TimerList *timer_list(Core *c, int32_t which) {
    return which == 0 ? &c->connect : &c->ls[which - 1].handshake;
}

static void timer_stop(Core *c, int32_t i) {
    Conn *k = slot(c, i);
    if (k->tlist == NIL) return;
    TimerList *l = timer_list(c, k->tlist);
    if (k->tprev != NIL) slot(c, k->tprev)->tnext = k->tnext; else l->head = k->tnext;
    if (k->tnext != NIL) slot(c, k->tnext)->tprev = k->tprev; else l->tail = k->tprev;
    k->tnext = k->tprev = k->tlist = NIL;
}

static void timer_start(Core *c, int32_t i, int32_t which) {
    TimerList *l = timer_list(c, which);
    if (l->duration <= 0) return;
    timer_stop(c, i);
    Conn *k = slot(c, i);
    k->deadline = now_s() + l->duration;
    k->tlist = which;
    k->tprev = l->tail;
    k->tnext = NIL;
    if (l->tail != NIL) slot(c, l->tail)->tnext = i; else l->head = i;
    l->tail = i;
}

/* -- releasing a slot -- */

static void free_pending(Conn *k) {
    for (int s = 0; s < 2; s++) {
        PyMem_Free(k->pend[s]);
        k->pend[s] = NULL;
        k->plen[s] = k->poff[s] = 0;
    }
}

static void close_pipe(Pipe *p) {
    close(p->r);
    close(p->w);
    PyMem_Free(p);
}

static void put_pipes(Core *c, Conn *k) {
    for (int s = 0; s < 2; s++) {
        Pipe *p = k->pipe[s];
        if (p == NULL) continue;
        k->pipe[s] = NULL;
        if (p->len == 0 && c->npipes < PIPE_POOL) c->pipes[c->npipes++] = p;
        else close_pipe(p);
    }
}

/* A pipe for side s's bytes (from the pool, else a new one); 0: none, relay through the buffer. */
static int take_pipe(Core *c, Conn *k, int s) {
    Pipe *p;
    if (c->npipes > 0) {
        p = c->pipes[--c->npipes];
    } else {
        int fds[2];
        if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) return 0;
        p = PyMem_Malloc(sizeof(Pipe));
        if (p == NULL) {
            close(fds[0]);
            close(fds[1]);
            return 0;
        }
        p->r = fds[0];
        p->w = fds[1];
        p->len = 0;
    }
    k->pipe[s] = p;
    return 1;
}

static void lean_gone(Core *c, Conn *k);

static void release(Core *c, int32_t i) {
    Conn *k = slot(c, i);
    lean_gone(c, k);
    timer_stop(c, i);
    free_pending(k);
    put_pipes(c, k);
    if (k->state == S_CONNECTING || k->state == S_RELAY) c->proxied--;
    k->state = S_FREE;
    PyObject *token = k->token;
    k->token = NULL;
    k->tnext = c->free_head; /* a slot on the run queue stays there: skipped while FREE (alloc_slot) */
    c->free_head = i;
    c->live--;
    Py_XDECREF(token);
}

static void close_fd(int *fd) {
    if (*fd >= 0) {
        close(*fd); /* never duplicated: closing takes it out of the epoll set */
        *fd = -1;
    }
}

static void drop(Core *c, int32_t i) {
    Conn *k = slot(c, i);
    close_fd(&k->fd[0]);
    close_fd(&k->fd[1]);
    release(c, i);
}

/* -- calling the handler -- */

static PyObject *call(Core *c, int cb, PyObject *const *args, size_t n) {
    if (c->cb[cb] == NULL) { /* disposed of */
        PyErr_SetString(PyExc_RuntimeError, "the core is disposed of");
        PyErr_WriteUnraisable(NULL);
        return NULL;
    }
    PyObject *result = PyObject_Vectorcall(c->cb[cb], args, n, NULL);
    if (result == NULL) PyErr_WriteUnraisable(c->cb[cb]);
    return result;
}

static void call_none(Core *c, int cb, PyObject *const *args, size_t n) {
    Py_XDECREF(call(c, cb, args, n));
}

static int set_pending(Conn *k, int side, const char *data, size_t n) {
    char *copy = PyMem_Malloc(n ? n : 1);
    if (copy == NULL) return -1;
    memcpy(copy, data, n);
    PyMem_Free(k->pend[side]);
    k->pend[side] = copy;
    k->plen[side] = (uint32_t)n;
    k->poff[side] = 0;
    return 0;
}

/* -- lean connections -- */

/* Follow the broker's MQTT packets (router/core/framing.py's MqttFrames._scan, without stop): a
 * type byte, a remaining length of 1 to 4 bytes, that many bytes. */
static void mqtt_follow(Conn *k, const unsigned char *d, size_t n) {
    if (k->mq_lost) return;
    size_t i = 0;
    uint32_t left = k->mq_left;
    for (;;) {
        if (left) {
            if (left > n - i) {
                k->mq_left = left - (uint32_t)(n - i);
                return;
            }
            i += left;
            left = 0;
            k->mq_frames++;
        }
        if (i >= n) {
            k->mq_left = 0;
            return;
        }
        if (!k->mq_headlen && i + 1 < n && d[i + 1] < 0x80) { /* most packets: a 1-byte length */
            left = d[i + 1];
            i += 2;
            if (!left) k->mq_frames++;
            continue;
        }
        unsigned char h[MQTT_HEADER_MAX];
        size_t kept = k->mq_headlen, more = MQTT_HEADER_MAX - kept;
        if (more > n - i) more = n - i;
        memcpy(h, k->mq_head, kept);
        memcpy(h + kept, d + i, more);
        size_t total = kept + more, used = 0;
        uint32_t length = 0, multiplier = 1;
        int complete = 0;
        for (used = 1; used < total; used++) {
            length += (uint32_t)(h[used] & 0x7f) * multiplier;
            multiplier <<= 7;
            if (!(h[used] & 0x80)) {
                complete = 1;
                break;
            }
        }
        if (!complete) {
            if (total >= MQTT_HEADER_MAX) { /* a fifth length byte: not MQTT */
                k->mq_lost = 1;
                return;
            }
            memcpy(k->mq_head, h, total); /* the header goes on in the next read */
            k->mq_headlen = (uint8_t)total;
            k->mq_left = 0;
            return;
        }
        i += used + 1 - kept;
        k->mq_headlen = 0;
        left = length;
        if (!left) k->mq_frames++;
    }
}

/* Whether a broker's first read refuses an MQTT client (keys/refusal.py: a CONNACK whose return or
 * reason code is not 0; anything else, or too short to tell, is no refusal). */
static int mqtt_refused(const unsigned char *d, size_t n) {
    if (n < 1 || d[0] != 0x20) return 0;
    uint32_t length = 0;
    size_t i = 1;
    for (;; i++) {
        if (i >= n || i >= MQTT_HEADER_MAX) return 0;
        length |= (uint32_t)(d[i] & 0x7f) << (7 * (i - 1));
        if (!(d[i] & 0x80)) break;
    }
    size_t body = i + 1;
    return length >= 2 && n >= body + 2 && d[body + 1] != 0;
}

/* The counters of target index ix, made on first use (NULL: out of memory or a wrong index). */
static LeanTarget *lean_target(Core *c, long ix) {
    if (ix < 0 || ix >= (1L << 20)) return NULL;
    if (ix >= c->ntargets) {
        int32_t n = c->ntargets ? c->ntargets : 8;
        while (n <= ix) n *= 2;
        LeanTarget *t = PyMem_Realloc(c->targets, sizeof(LeanTarget) * (size_t)n);
        if (t == NULL) return NULL;
        memset(t + c->ntargets, 0, sizeof(LeanTarget) * (size_t)(n - c->ntargets));
        c->targets = t;
        c->ntargets = n;
    }
    LeanTarget *t = &c->targets[ix];
    if (t->hist == NULL) t->hist = PyMem_Calloc((size_t)c->nbounds + 1, sizeof(uint64_t));
    return t->hist == NULL ? NULL : t;
}

/* The count of router ix's lean connections (NULL: out of memory or a wrong index). */
static uint32_t *lean_alive(Core *c, long ix) {
    if (ix < 0 || ix >= (1L << 20)) return NULL;
    if (ix >= c->nrouters) {
        int32_t n = c->nrouters ? c->nrouters : 8;
        while (n <= ix) n *= 2;
        uint32_t *alive = PyMem_Realloc(c->lean_alive, sizeof(uint32_t) * (size_t)n);
        if (alive == NULL) return NULL;
        memset(alive + c->nrouters, 0, sizeof(uint32_t) * (size_t)(n - c->nrouters));
        c->lean_alive = alive;
        c->nrouters = n;
    }
    return &c->lean_alive[ix];
}

/* Slot i stops being lean (materialized, or released while lean). */
static void lean_gone(Core *c, Conn *k) {
    if (k->flags & F_LEAN) {
        c->lean_alive[k->router]--;
        k->flags &= (uint8_t)~F_LEAN;
    }
}

/* One of the line buffer's methods (`set_lines`); when the buffer is full, the handler's flush. */
static void lean_line(Core *c, PyObject *method, PyObject *const *args, size_t n) {
    PyObject *full = PyObject_Vectorcall(method, args, n, NULL);
    if (full == NULL) {
        PyErr_WriteUnraisable(method);
        return;
    }
    int flush = full == Py_True;
    Py_DECREF(full);
    if (flush && c->flush_lines != NULL) {
        PyObject *r = PyObject_Vectorcall(c->flush_lines, NULL, 0, NULL);
        if (r == NULL) PyErr_WriteUnraisable(c->flush_lines);
        Py_XDECREF(r);
    }
}

#define LEAN_FIELD(k, f) PyTuple_GET_ITEM((k)->token, (f))

static void lean_connected(Core *c, int32_t i) {
    Conn *k = slot(c, i);
    double now = now_s(), took = now - k->t_start;
    k->t_connected = now;
    LeanTarget *t = &c->targets[k->target];
    t->opened++;
    int32_t b = 0;
    while (b < c->nbounds && c->bounds[b] < took) b++; /* the first bound >= took: `le` is inclusive */
    t->hist[b]++;
    t->sum += took;
    if (c->lines_connected != NULL) {
        PyObject *args[] = {LEAN_FIELD(k, L_HOST), LEAN_FIELD(k, L_PORT), LEAN_FIELD(k, L_ROUTER),
                            LEAN_FIELD(k, L_KEY), LEAN_FIELD(k, L_NODE)};
        lean_line(c, c->lines_connected, args, 5);
    }
}

/* A lean connection ended by itself (R_CLOSED, R_RESET): counted, its line written, its token to
 * `released`; a broker that ended it silently and early is passive health's (lean_failed). */
static void lean_close(Core *c, int32_t i, int r) {
    Conn *k = slot(c, i);
    k->held = 1; /* not materialized any more */
    double duration = now_s() - k->t_connected;
    if (k->silent && duration <= c->early_close_s) r = R_EARLY;
    LeanTarget *t = &c->targets[k->target];
    t->ended++;
    t->bytes[0] += k->count[0];
    t->bytes[1] += k->count[1];
    PyObject *token = Py_NewRef(k->token);
    PyObject *in = PyLong_FromUnsignedLongLong(k->count[0]), *out = PyLong_FromUnsignedLongLong(k->count[1]);
    PyObject *took = PyFloat_FromDouble(duration);
    if (in && out && took) {
        if (c->lines_closed != NULL) {
            PyObject *args[] = {PyTuple_GET_ITEM(token, L_HOST), PyTuple_GET_ITEM(token, L_PORT),
                                PyTuple_GET_ITEM(token, L_ROUTER), PyTuple_GET_ITEM(token, L_NODE), in, out, took,
                                c->reason_names[r], c->empty};
            lean_line(c, c->lines_closed, args, 9);
        }
        if (r == R_EARLY) {
            PyObject *args[] = {token, c->reasons[R_EARLY], in, out, took};
            call_none(c, CB_LEAN_FAILED, args, 5);
        }
    } else {
        PyErr_WriteUnraisable(NULL);
    }
    Py_XDECREF(in);
    Py_XDECREF(out);
    Py_XDECREF(took);
    if (PyList_Append(c->released, token) != 0) PyErr_WriteUnraisable(NULL);
    Py_DECREF(token);
    drop(c, i);
}

/* Hand the handler what ended lean this turn: their admission goes back. */
static void flush_released(Core *c) {
    if (c->released == NULL || PyList_GET_SIZE(c->released) == 0) return;
    PyObject *ended = c->released;
    c->released = PyList_New(0);
    if (c->released == NULL) { /* out of memory: keep the list for the next turn */
        PyErr_WriteUnraisable(NULL);
        c->released = ended;
        return;
    }
    PyObject *args[] = {ended};
    call_none(c, CB_RELEASED, args, 1);
    Py_DECREF(ended);
}

/* A lean MQTT connection's packet cursor for the handler: (frames, bytes left, header part, lost). */
static PyObject *mqtt_state(Conn *k) {
    return Py_BuildValue("(KIy#O)", (unsigned long long)k->mq_frames, (unsigned int)k->mq_left,
                         (const char *)k->mq_head, (Py_ssize_t)k->mq_headlen, k->mq_lost ? Py_True : Py_False);
}

/* Make lean connection i an ordinary one: the handler's `materialized` gives its token from now on
 * (NULL: it failed, or the connection ended meanwhile in another turn of the loop). `why`: M_READ
 * (from any thread), M_CLOSING or M_ANSWER (from the loop's thread, which holds the slot: `held`).
 * `*again`: its connect completed while the handler made the object (the handler's code
 * may let the loop's thread run when another thread materializes): the object is stale. */
static PyObject *materialize_once(Core *c, int32_t i, int why, int *again) {
    Conn *k = slot(c, i);
    uint32_t gen = k->gen;
    uint8_t state = k->state;
    int connected = state == S_RELAY;
    *again = 0;
    PyObject *cid = PyLong_FromLongLong(cid_of(c, i)), *fd = PyLong_FromLong(k->fd[0]);
    PyObject *age = PyFloat_FromDouble(connected ? now_s() - k->t_connected : 0.0);
    PyObject *reason = PyLong_FromLong(why);
    PyObject *frames = (k->flags & F_MQTT) ? mqtt_state(k) : Py_NewRef(Py_None);
    PyObject *token = NULL;
    if (cid && fd && age && reason && frames) {
        PyObject *args[] = {k->token, cid, fd, connected ? Py_True : Py_False, age,
                            k->silent ? Py_True : Py_False, reason, frames};
        token = call(c, CB_MATERIALIZED, args, 8);
    } else {
        PyErr_WriteUnraisable(NULL);
    }
    Py_XDECREF(cid);
    Py_XDECREF(fd);
    Py_XDECREF(age);
    Py_XDECREF(reason);
    Py_XDECREF(frames);
    if (token == NULL) return NULL;
    if (k->gen != gen || !(k->flags & F_LEAN) || (k->held && why == M_READ) ||
        (k->state != S_RELAY && k->state != S_CONNECTING)) {
        Py_DECREF(token); /* it ended (or changed) while the handler made the object */
        return NULL;
    }
    if (k->state != state) {
        Py_DECREF(token);
        *again = 1;
        return NULL;
    }
    if (k->state == S_RELAY) c->targets[k->target].moved++;
    /* An ordinary connection's: its first answer (if it has none yet), its packets followed. */
    uint8_t mqtt = k->flags & F_MQTT;
    lean_gone(c, k);
    k->flags = F_FIRST | (mqtt ? F_FEED : 0);
    Py_XSETREF(k->token, Py_NewRef(token));
    return token;
}

static PyObject *materialize_slot(Core *c, int32_t i, int why) {
    int again = 1;
    PyObject *token = NULL;
    for (int attempt = 0; again && attempt < 4; attempt++) token = materialize_once(c, i, why, &again);
    return token; /* (still changing after four attempts: left lean, the next read makes it) */
}

static int watch(Core *c, int32_t i, int side) {
    Conn *k = slot(c, i);
    struct epoll_event ev;
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.u64 = ((uint64_t)k->gen << 32) | ((uint64_t)(uint32_t)i << 2) | (uint64_t)side;
    return epoll_ctl(c->ep, EPOLL_CTL_ADD, k->fd[side], &ev);
}

static void run_later(Core *c, int32_t i) {
    Conn *k = slot(c, i);
    if (k->queued) return;
    k->queued = 1;
    k->rnext = NIL;
    if (c->runq_tail != NIL) slot(c, c->runq_tail)->rnext = i; else c->runq_head = i;
    c->runq_tail = i;
}

static void apply(Core *c, int32_t i, PyObject *action);
static void pump(Core *c, int32_t i);
static void close_relay(Core *c, int32_t i, PyObject *reason);

/* Send what the router says itself (a few bytes into an empty send buffer) and close the client. */
static void answer_and_close(Core *c, int32_t i, PyObject *answer) {
    Conn *k = slot(c, i);
    char *data;
    Py_ssize_t n;
    if (answer != NULL && PyBytes_AsStringAndSize(answer, &data, &n) == 0 && n > 0)
        (void)send(k->fd[0], data, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
    PyErr_Clear();
    drop(c, i);
}

static void start_connect(Core *c, int32_t i, PyObject *host, long port, PyObject *replay) {
    Conn *k = slot(c, i);
    const char *h = PyUnicode_AsUTF8(host);
    struct sockaddr_storage ss;
    socklen_t len;
    memset(&ss, 0, sizeof(ss));
    int family = (h != NULL && strchr(h, ':') != NULL) ? AF_INET6 : AF_INET;
    if (family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        len = sizeof(*a);
        if (inet_pton(AF_INET6, h, &a->sin6_addr) != 1) h = NULL;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        len = sizeof(*a);
        if (h == NULL || inet_pton(AF_INET, h, &a->sin_addr) != 1) h = NULL;
    }
    PyErr_Clear();
    char *data;
    Py_ssize_t n;
    if (h == NULL || PyBytes_AsStringAndSize(replay, &data, &n) != 0 || set_pending(k, 0, data, (size_t)n)) {
        PyErr_Clear();
        PyObject *args[] = {k->token, PyLong_FromLong(EINVAL), Py_True};
        PyObject *action = call(c, CB_CONNECT_FAILED, args, 3);
        Py_XDECREF(args[1]);
        apply(c, i, action);
        return;
    }
    k->state = S_CONNECTING;
    c->proxied++;
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int err = errno;
        k->state = S_DECIDING;
        c->proxied--;
        PyObject *args[] = {k->token, PyLong_FromLong(err), Py_True};
        PyObject *action = call(c, CB_CONNECT_FAILED, args, 3);
        Py_XDECREF(args[1]);
        apply(c, i, action);
        return;
    }
    k->fd[1] = fd;
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    int err = 0;
    if (connect(fd, (struct sockaddr *)&ss, len) != 0 && errno != EINPROGRESS) err = errno;
    if (!err && !k->registered) {
        if (watch(c, i, 0) != 0) err = errno;
        else k->registered = 1;
    }
    if (!err && watch(c, i, 1) != 0) err = errno;
    if (err) {
        close_fd(&k->fd[1]);
        k->state = S_DECIDING;
        c->proxied--;
        free_pending(k);
        PyObject *args[] = {k->token, PyLong_FromLong(err), Py_False};
        PyObject *action = call(c, CB_CONNECT_FAILED, args, 3);
        Py_XDECREF(args[1]);
        apply(c, i, action);
        return;
    }
    timer_start(c, i, 0); /* the EPOLLOUT of the connect's end stops it */
}

/* Carry out a handler's action for connection i (takes the action's reference). */
static void apply(Core *c, int32_t i, PyObject *action) {
    Conn *k = slot(c, i);
    if (action == NULL) { /* the handler failed (written as unraisable): this connection only */
        drop(c, i);
        return;
    }
    if (action == Py_None) {
        Py_DECREF(action);
        if (k->state != S_OPENING) drop(c, i);
        return;
    }
    long code = PyTuple_Check(action) && PyTuple_GET_SIZE(action) > 0
                    ? PyLong_AsLong(PyTuple_GET_ITEM(action, 0)) : -1;
    Py_ssize_t size = PyTuple_Check(action) ? PyTuple_GET_SIZE(action) : 0;
    switch (code) {
    case ACT_WAIT:
        if (size == 4) {
            PyObject *token = PyTuple_GET_ITEM(action, 1), *reply = PyTuple_GET_ITEM(action, 2);
            if (token != Py_None) {
                Py_INCREF(token);
                Py_XSETREF(k->token, token);
            }
            long read_size = PyLong_AsLong(PyTuple_GET_ITEM(action, 3));
            k->read_size = read_size > 0 ? (uint32_t)read_size : 1;
            char *data;
            Py_ssize_t n;
            if (PyBytes_AsStringAndSize(reply, &data, &n) == 0 && n > 0)
                (void)send(k->fd[0], data, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
            PyErr_Clear();
            Py_DECREF(action);
            if (k->state != S_OPENING) {
                k->state = S_OPENING;
                if (!k->registered) {
                    if (watch(c, i, 0) != 0) { /* out of memory: the handler drops it */
                        PyObject *a[] = {k->token, Py_None};
                        apply(c, i, call(c, CB_READ, a, 2));
                        if (slot(c, i)->state == S_OPENING) drop(c, i);
                        return;
                    }
                    k->registered = 1;
                }
                timer_start(c, i, 1 + k->listener);
            }
            return;
        }
        break;
    case ACT_CLOSE:
        if (size == 2) {
            answer_and_close(c, i, PyTuple_GET_ITEM(action, 1));
            Py_DECREF(action);
            return;
        }
        break;
    case ACT_PROXY:
        if (size == 6) {
            PyObject *token = PyTuple_GET_ITEM(action, 1);
            long flags = PyLong_AsLong(PyTuple_GET_ITEM(action, 5));
            if (flags & F_LEAN) {
                if (!PyTuple_Check(token) || PyTuple_GET_SIZE(token) < L_SIZE) break;
                long target = PyLong_AsLong(PyTuple_GET_ITEM(token, L_TARGET));
                long router = PyLong_AsLong(PyTuple_GET_ITEM(token, L_ROUTER_IX));
                uint32_t *alive = lean_alive(c, router);
                if (alive == NULL || lean_target(c, target) == NULL) break;
                lean_gone(c, k); /* (a slot is lean once: a redispatch is not) */
                (*alive)++;
                k->target = (int32_t)target;
                k->router = (int32_t)router;
                k->t_start = now_s();
            } else {
                lean_gone(c, k);
            }
            Py_INCREF(token);
            Py_XSETREF(k->token, token);
            k->flags = (uint8_t)flags;
            long port = PyLong_AsLong(PyTuple_GET_ITEM(action, 3));
            timer_stop(c, i);
            k->state = S_DECIDING;
            start_connect(c, i, PyTuple_GET_ITEM(action, 2), port, PyTuple_GET_ITEM(action, 4));
            Py_DECREF(action);
            return;
        }
        break;
    case ACT_HANDOVER: /* the handler owns the client's descriptor now */
        if (k->registered) epoll_ctl(c->ep, EPOLL_CTL_DEL, k->fd[0], NULL);
        k->fd[0] = -1;
        close_fd(&k->fd[1]);
        release(c, i);
        Py_DECREF(action);
        return;
    }
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "not a data-path action: %R", action);
    PyErr_WriteUnraisable(action);
    Py_DECREF(action);
    drop(c, i);
}

/* -- accept -- */

static void pause_listener(Core *c, Listener *l, double seconds) {
    if (!l->paused) epoll_ctl(c->ep, EPOLL_CTL_DEL, l->fd, NULL);
    l->paused = 1;
    l->resume_at = now_s() + seconds;
}

static int accept_waits(Core *c, Listener *l, int err) {
    PyObject *args[] = {l->token, PyLong_FromLong(err)};
    PyObject *r = call(c, CB_ACCEPT_WAIT, args, 2);
    Py_XDECREF(args[1]);
    double wait = r == NULL ? 1.0 : PyFloat_AsDouble(r);
    Py_XDECREF(r);
    PyErr_Clear();
    if (wait > 0) {
        pause_listener(c, l, wait);
        return 1;
    }
    return 0;
}

/* An IPv4 address as inet_ntop writes it (dotted quad, no leading zeros), without its sprintf:
 * a tenth of the instructions, on every connection. */
static size_t ipv4_text(const unsigned char *b, char *out) {
    char *p = out;
    for (int octet = 0; octet < 4; octet++) {
        unsigned v = b[octet];
        if (v >= 100) *p++ = (char)('0' + v / 100);
        if (v >= 10) *p++ = (char)('0' + v / 10 % 10);
        *p++ = (char)('0' + v % 10);
        if (octet < 3) *p++ = '.';
    }
    return (size_t)(p - out);
}

static PyObject *peer_host(const struct sockaddr_storage *ss, long *port) {
    char text[INET6_ADDRSTRLEN];
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
        *port = ntohs(a->sin6_port);
        return PyUnicode_FromString(text);
    }
    const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
    *port = ntohs(a->sin_port);
    size_t n = ipv4_text((const unsigned char *)&a->sin_addr, text);
    return PyUnicode_DecodeASCII(text, (Py_ssize_t)n, NULL);
}

static void on_listener(Core *c, int32_t li) {
    for (int n = 0; n < ACCEPT_BATCH; n++) {
        Listener *l = &c->ls[li]; /* a callback may add listeners (a realloc) */
        if (!l->active || l->paused) return;
        if (l->rated && accept_waits(c, l, 0)) return;
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        int fd = accept4(l->fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            if (errno == ECONNABORTED || errno == EINTR) continue;
            (void)accept_waits(c, l, errno); /* out of descriptors or memory: the handler says how long */
            return;
        }
        int32_t i = alloc_slot(c);
        if (i == NIL) {
            close(fd);
            (void)accept_waits(c, l, ENOMEM);
            return;
        }
        Conn *k = slot(c, i);
        k->fd[0] = fd;
        k->listener = li;
        k->state = S_DECIDING;
        long port;
        PyObject *host = peer_host(&ss, &port);
        PyObject *args[] = {l->token, PyLong_FromLongLong(cid_of(c, i)), PyLong_FromLong(fd), host,
                            PyLong_FromLong(port)};
        PyObject *action = (host && args[1] && args[2] && args[4]) ? call(c, CB_ACCEPTED, args, 5) : NULL;
        for (int j = 1; j < 5; j++) Py_XDECREF(args[j]);
        apply(c, i, action);
    }
}

/* -- the opening -- */

static void on_opening(Core *c, int32_t i) {
    Conn *k = slot(c, i);
    uint32_t gen = k->gen;
    while (k->state == S_OPENING && k->gen == gen && k->rd[0]) {
        size_t want = k->read_size < c->bufsize ? k->read_size : c->bufsize;
        ssize_t n = recv(k->fd[0], c->buf, want, 0);
        PyObject *data;
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                k->rd[0] = 0;
                return;
            }
            if (errno == EINTR) continue;
            data = Py_NewRef(Py_None);
        } else {
            /* A short read drained the socket (new bytes bring a new edge), unless its EOF was
             * signalled already: that edge is gone, and the EOF waits behind the bytes read. */
            if ((size_t)n < want && !k->hup[0]) k->rd[0] = 0;
            data = PyBytes_FromStringAndSize(c->buf, n);
        }
        if (n == 0) k->rd[0] = 1; /* EOF stays readable: the handler is told once */
        PyObject *args[] = {k->token, data};
        PyObject *action = data ? call(c, CB_READ, args, 2) : NULL;
        Py_XDECREF(data);
        apply(c, i, action);
        if (n <= 0) return;
    }
}

/* -- connect -- */

static void connect_failed(Core *c, int32_t i, PyObject *why) {
    Conn *k = slot(c, i);
    timer_stop(c, i);
    close_fd(&k->fd[1]);
    free_pending(k);
    k->state = S_DECIDING;
    c->proxied--;
    PyObject *args[] = {k->token, why, Py_False};
    apply(c, i, call(c, CB_CONNECT_FAILED, args, 3));
}

static void connect_errno(Core *c, int32_t i, int err) {
    PyObject *code = PyLong_FromLong(err);
    if (code == NULL) {
        PyErr_WriteUnraisable(NULL);
        drop(c, i);
        return;
    }
    connect_failed(c, i, code);
    Py_DECREF(code);
}

static void on_connected(Core *c, int32_t i) {
    Conn *k = slot(c, i);
    uint32_t gen = k->gen;
    timer_stop(c, i);
    k->state = S_RELAY;
    k->count[0] = k->plen[0]; /* the replayed opening, all pending: the client is not read yet */
    if (k->plen[0] == 0) {
        PyMem_Free(k->pend[0]);
        k->pend[0] = NULL;
    }
    if (k->flags & F_LEAN) {
        lean_connected(c, i);
    } else {
        PyObject *args[] = {k->token};
        call_none(c, CB_CONNECTED, args, 1);
    }
    if (k->gen == gen && k->state == S_RELAY) pump(c, i);
}

/* -- relay -- */

static int upstream(Core *c, int32_t i, const char *data, size_t n, int first) {
    Conn *k = slot(c, i);
    uint32_t gen = k->gen;
    PyObject *bytes = PyBytes_FromStringAndSize(data, (Py_ssize_t)n);
    if (bytes == NULL) {
        PyErr_WriteUnraisable(NULL);
        return 0;
    }
    PyObject *args[] = {k->token, bytes, first ? Py_True : Py_False};
    call_none(c, CB_UPSTREAM, args, 3);
    Py_DECREF(bytes);
    return k->gen == gen && k->state == S_RELAY; /* the handler may have closed it */
}

/* Side `side` ended or broke: when that is the broker's side and it sent nothing yet, passive
 * health hears of it (an empty first answer). */
static int side_ended(Core *c, int32_t i, int side) {
    Conn *k = slot(c, i);
    if (side != 1 || k->count[1] != 0) return 1;
    if (k->flags & F_LEAN) { /* LiveConnection.broker_ended_silently's rule, told at the close */
        if (k->count[0] > 0) k->silent = 1;
        return 1;
    }
    if (k->flags & (F_FIRST | F_FEED)) return upstream(c, i, "", 0, 1);
    return 1;
}

static void reset(Core *c, int32_t i, int side) {
    if (side_ended(c, i, side)) close_relay(c, i, c->reasons[R_RESET]);
}

/* Move side s's bytes to side 1 - s through its pipe (zero copy): -1 when the connection ended,
 * else whether anything moved. As with the buffer, side s is read only when its pipe is empty. */
static int splice_way(Core *c, int32_t i, int s) {
    Conn *k = slot(c, i);
    Pipe *p = k->pipe[s];
    int d = 1 - s, progress = 0;
    for (;;) {
        if (p->len) {
            if (!k->wr[d]) return progress;
            ssize_t w = splice(p->r, NULL, k->fd[d], NULL, p->len, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
            if (w < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK) { k->wr[d] = 0; return progress; }
                if (errno == EINTR) continue;
                reset(c, i, d);
                return -1;
            }
            p->len -= (uint32_t)w;
            progress = 1;
            if (p->len) { k->wr[d] = 0; return progress; }
        }
        if (k->eof[s] || !k->rd[s]) return progress;
        ssize_t n = splice(k->fd[s], NULL, p->w, NULL, SPLICE_MAX, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) { k->rd[s] = 0; return progress; }
            if (errno == EINTR) continue;
            reset(c, i, s);
            return -1;
        }
        if (n == 0) {
            k->eof[s] = 1;
            if (k->eof[d]) {
                close_relay(c, i, c->reasons[R_CLOSED]);
                return -1;
            }
            if (shutdown(k->fd[d], SHUT_WR) != 0) {
                close_relay(c, i, c->reasons[R_RESET]);
                return -1;
            }
            return 1;
        }
        k->count[s] += (uint64_t)n;
        c->spliced += (uint64_t)n;
        p->len = (uint32_t)n;
        progress = 1;
    }
}

static void pump(Core *c, int32_t i) {
    Conn *k = slot(c, i);
    for (int round = 0; round < PUMP_ROUNDS; round++) {
        int progress = 0;
        for (int s = 0; s < 2; s++) {
            int d = 1 - s;
            if (k->pipe[s] != NULL || (k->count[s] >= SPLICE_AFTER && k->plen[s] == 0 &&
                                       !(s == 1 && (k->flags & (F_FEED | F_MQTT))) && take_pipe(c, k, s))) {
                int r = splice_way(c, i, s);
                if (r < 0) return;
                progress |= r;
                continue;
            }
            if (k->plen[s]) {
                if (!k->wr[d]) continue;
                ssize_t w = send(k->fd[d], k->pend[s] + k->poff[s], k->plen[s], MSG_NOSIGNAL);
                if (w < 0) {
                    if (errno == EAGAIN || errno == EWOULDBLOCK) { k->wr[d] = 0; continue; }
                    reset(c, i, d);
                    return;
                }
                k->poff[s] += (uint32_t)w;
                k->plen[s] -= (uint32_t)w;
                progress = 1;
                if (k->plen[s]) { k->wr[d] = 0; continue; }
                PyMem_Free(k->pend[s]); /* (side s is not read while it has bytes pending: no EOF yet) */
                k->pend[s] = NULL;
                k->poff[s] = 0;
            }
            if (k->eof[s] || !k->rd[s]) continue;
            ssize_t n = recv(k->fd[s], c->buf, c->bufsize, 0);
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK) { k->rd[s] = 0; continue; }
                if (errno == EINTR) { progress = 1; continue; }
                reset(c, i, s);
                return;
            }
            progress = 1;
            if (n == 0) {
                if (!side_ended(c, i, s)) return;
                k->eof[s] = 1;
                if (k->eof[d]) { /* both ways done, nothing pending either way */
                    close_relay(c, i, c->reasons[R_CLOSED]);
                    return;
                }
                if (shutdown(k->fd[d], SHUT_WR) != 0) {
                    close_relay(c, i, c->reasons[R_RESET]);
                    return;
                }
                continue;
            }
            /* A short read drained the socket (as HAProxy takes it): its next bytes or its end
             * bring a new edge, so no recv just to hear EAGAIN. Not when its end was signalled
             * already: the next recv reads it. */
            if ((size_t)n < c->bufsize && !k->hup[s]) k->rd[s] = 0;
            if (s == 1 && (k->flags & F_LEAN) && (k->flags & F_MQTT)) {
                if (k->count[1] == 0 && mqtt_refused((const unsigned char *)c->buf, (size_t)n)) {
                    uint32_t gen = k->gen; /* a refusal: passive health and the line need the object */
                    k->held = 1;           /* (the handler registers it: no other thread makes one) */
                    Py_XDECREF(materialize_slot(c, i, M_ANSWER));
                    if (k->gen != gen || k->state != S_RELAY) return;
                    k->held = 0;
                }
                if (k->flags & F_LEAN) mqtt_follow(k, (const unsigned char *)c->buf, (size_t)n);
            }
            if (s == 1 && ((k->flags & F_FEED) || ((k->flags & F_FIRST) && k->count[1] == 0))) {
                if (!upstream(c, i, c->buf, (size_t)n, k->count[1] == 0)) return;
            }
            k->count[s] += (uint64_t)n;
            ssize_t w = send(k->fd[d], c->buf, (size_t)n, MSG_NOSIGNAL);
            if (w < 0) {
                if (errno != EAGAIN && errno != EWOULDBLOCK) {
                    reset(c, i, d);
                    return;
                }
                w = 0;
            }
            if (w < n) { /* the other side is slow: keep the rest, stop reading this side */
                k->wr[d] = 0;
                if (set_pending(k, s, c->buf + w, (size_t)(n - w)) != 0) {
                    close_relay(c, i, c->reasons[R_RESET]);
                    return;
                }
            }
        }
        if (!progress) return;
    }
    run_later(c, i); /* a busy connection yields to the others */
}

static void close_relay(Core *c, int32_t i, PyObject *reason) {
    Conn *k = slot(c, i);
    if (k->state != S_RELAY || (k->held && (k->flags & F_LEAN))) return;
    if (k->flags & F_LEAN) {
        if (reason == c->reasons[R_CLOSED] || reason == c->reasons[R_RESET]) {
            lean_close(c, i, reason == c->reasons[R_RESET] ? R_RESET : R_CLOSED);
            return;
        }
        k->held = 1; /* the router closes it for a reason of its own: as an ordinary connection */
        PyObject *token = materialize_slot(c, i, M_CLOSING);
        k->held = 0;
        if (token == NULL) {
            lean_close(c, i, R_RESET);
            return;
        }
        Py_DECREF(token);
    }
    PyObject *in = PyLong_FromUnsignedLongLong(k->count[0]), *out = PyLong_FromUnsignedLongLong(k->count[1]);
    PyObject *args[] = {k->token, reason, in, out};
    if (in && out) call_none(c, CB_CLOSED, args, 4); /* before the close: a client that sees it finds it reported */
    else PyErr_WriteUnraisable(NULL);
    Py_XDECREF(in);
    Py_XDECREF(out);
    drop(c, i);
}

static void on_side(Core *c, int32_t i, int side, uint32_t events) {
    Conn *k = slot(c, i);
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) k->rd[side] = 1;
    if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) k->hup[side] = 1;
    if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) k->wr[side] = 1;
    switch (k->state) {
    case S_OPENING:
        if (side == 0) on_opening(c, i);
        return;
    case S_CONNECTING:
        if (side == 1 && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
            if (events & (EPOLLERR | EPOLLHUP)) {
                int err = 0;
                socklen_t len = sizeof(err);
                if (getsockopt(k->fd[1], SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
                if (err) {
                    connect_errno(c, i, err);
                    return;
                }
            }
            on_connected(c, i);
        }
        return;
    case S_RELAY:
        if (k->eof[side] && (events & (EPOLLHUP | EPOLLERR))) { /* gone while we still write to it */
            close_relay(c, i, c->reasons[R_RESET]);
            return;
        }
        pump(c, i);
        return;
    }
}

/* -- deadlines and the run queue -- */

static void expire(Core *c) {
    double now = now_s();
    while (c->connect.head != NIL && slot(c, c->connect.head)->deadline <= now)
        connect_errno(c, c->connect.head, ETIMEDOUT);
    for (int32_t li = 0; li < c->nls; li++) {
        while (c->ls[li].handshake.head != NIL && slot(c, c->ls[li].handshake.head)->deadline <= now) {
            int32_t i = c->ls[li].handshake.head;
            timer_stop(c, i);
            PyObject *args[] = {slot(c, i)->token};
            apply(c, i, call(c, CB_TIMED_OUT, args, 1));
            if (slot(c, i)->state == S_OPENING && slot(c, i)->tlist == NIL) drop(c, i);
        }
        Listener *l = &c->ls[li];
        if (l->active && l->paused && l->resume_at <= now) {
            struct epoll_event ev = {.events = EPOLLIN, .data.u64 = ((uint64_t)li << 2) | K_LISTENER};
            if (epoll_ctl(c->ep, EPOLL_CTL_ADD, l->fd, &ev) == 0) {
                l->paused = 0;
                PyObject *args[] = {l->token};
                call_none(c, CB_RESUMED, args, 1);
            }
        }
    }
}

static int next_timeout_ms(Core *c) {
    if (c->runq_head != NIL) return 0;
    double soonest = now_s() + TICK_MS / 1000.0;
    if (c->connect.head != NIL && slot(c, c->connect.head)->deadline < soonest)
        soonest = slot(c, c->connect.head)->deadline;
    for (int32_t li = 0; li < c->nls; li++) {
        Listener *l = &c->ls[li];
        if (l->handshake.head != NIL && slot(c, l->handshake.head)->deadline < soonest)
            soonest = slot(c, l->handshake.head)->deadline;
        if (l->active && l->paused && l->resume_at < soonest) soonest = l->resume_at;
    }
    double ms = (soonest - now_s()) * 1000.0;
    return ms <= 0 ? 0 : (int)ms + 1;
}

static void run_queue(Core *c) {
    int32_t i = c->runq_head;
    c->runq_head = c->runq_tail = NIL; /* pumping may queue again, for the next turn */
    while (i != NIL) {
        Conn *k = slot(c, i);
        int32_t next = k->rnext;
        k->queued = 0;
        if (k->state == S_RELAY) pump(c, i);
        i = next;
    }
}

/* -- the Python type -- */

static int Core_init(Core *c, PyObject *args, PyObject *kwds) {
    static char *names[] = {"handler", "connect_timeout_s", "closed", "reset", "buffer_size",
                            "closed_early", "early_close_s", NULL};
    PyObject *handler, *closed, *reset_reason, *early = Py_None;
    double connect_timeout, early_close_s = 0.0;
    Py_ssize_t bufsize = 256 * 1024;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OdOO|nOd", names, &handler, &connect_timeout, &closed,
                                     &reset_reason, &bufsize, &early, &early_close_s))
        return -1;
    if (c->ep >= 0) {
        PyErr_SetString(PyExc_RuntimeError, "a Core is initialised once");
        return -1;
    }
    if (bufsize < 1024) {
        PyErr_Format(PyExc_ValueError, "buffer_size must be at least 1024, not %zd", bufsize);
        return -1;
    }
    for (int j = 0; j < CB_COUNT; j++) {
        c->cb[j] = PyObject_GetAttrString(handler, CALLBACKS[j]);
        if (c->cb[j] == NULL) return -1;
    }
    c->reasons[R_CLOSED] = Py_NewRef(closed);
    c->reasons[R_RESET] = Py_NewRef(reset_reason);
    c->reasons[R_EARLY] = Py_NewRef(early);
    for (int j = 0; j < R_COUNT; j++) { /* a lean close's line names its reason by its value */
        c->reason_names[j] = c->reasons[j] == Py_None ? PyUnicode_FromString("")
                                                      : PyObject_GetAttrString(c->reasons[j], "value");
        if (c->reason_names[j] == NULL) return -1;
        if (!PyUnicode_Check(c->reason_names[j])) {
            PyErr_SetString(PyExc_TypeError, "a close reason's value must be str");
            return -1;
        }
    }
    c->early_close_s = early_close_s;
    c->released = PyList_New(0);
    c->empty = PyUnicode_FromString("");
    if (c->released == NULL || c->empty == NULL) return -1;
    c->buf = PyMem_Malloc((size_t)bufsize);
    if (c->buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    c->bufsize = (size_t)bufsize;
    c->connect.duration = connect_timeout;
    c->ep = epoll_create1(EPOLL_CLOEXEC);
    if (c->ep < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

static PyObject *Core_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Core *c = (Core *)type->tp_alloc(type, 0);
    if (c == NULL) return NULL;
    c->ep = c->wake_fd = -1;
    c->free_head = c->runq_head = c->runq_tail = NIL;
    c->connect.head = c->connect.tail = NIL;
    return (PyObject *)c;
}

static int Core_traverse(Core *c, visitproc visit, void *arg) {
    for (int j = 0; j < CB_COUNT; j++) Py_VISIT(c->cb[j]);
    Py_VISIT(c->released);
    Py_VISIT(c->lines_connected);
    Py_VISIT(c->lines_closed);
    Py_VISIT(c->flush_lines);
    for (int32_t li = 0; li < c->nls; li++) Py_VISIT(c->ls[li].token);
    for (uint32_t ch = 0; ch < c->nchunks; ch++)
        for (uint32_t j = 0; j < CHUNK; j++) Py_VISIT(c->chunks[ch][j].token);
    return 0;
}

static int Core_clear(Core *c) {
    for (int j = 0; j < CB_COUNT; j++) Py_CLEAR(c->cb[j]);
    for (int j = 0; j < R_COUNT; j++) {
        Py_CLEAR(c->reasons[j]);
        Py_CLEAR(c->reason_names[j]);
    }
    Py_CLEAR(c->released);
    Py_CLEAR(c->empty);
    Py_CLEAR(c->lines_connected);
    Py_CLEAR(c->lines_closed);
    Py_CLEAR(c->flush_lines);
    for (int32_t li = 0; li < c->nls; li++) Py_CLEAR(c->ls[li].token);
    for (uint32_t ch = 0; ch < c->nchunks; ch++)
        for (uint32_t j = 0; j < CHUNK; j++) Py_CLEAR(c->chunks[ch][j].token);
    return 0;
}

static void Core_dealloc(Core *c) {
    PyObject_GC_UnTrack(c);
    Core_clear(c);
    for (uint32_t ch = 0; ch < c->nchunks; ch++) {
        for (uint32_t j = 0; j < CHUNK; j++) {
            Conn *k = &c->chunks[ch][j];
            if (k->state != S_FREE) {
                close_fd(&k->fd[0]);
                close_fd(&k->fd[1]);
            }
            free_pending(k);
            for (int s = 0; s < 2; s++)
                if (k->pipe[s] != NULL) close_pipe(k->pipe[s]);
        }
        PyMem_Free(c->chunks[ch]);
    }
    PyMem_Free(c->chunks);
    for (int j = 0; j < c->npipes; j++) close_pipe(c->pipes[j]);
    PyMem_Free(c->ls);
    PyMem_Free(c->buf);
    for (int32_t t = 0; t < c->ntargets; t++) PyMem_Free(c->targets[t].hist);
    PyMem_Free(c->targets);
    PyMem_Free(c->bounds);
    PyMem_Free(c->lean_alive);
    if (c->ep >= 0) close(c->ep);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *Core_watch_listener(Core *c, PyObject *args) {
    int fd, sniffs, rated;
    double handshake;
    PyObject *token;
    if (!PyArg_ParseTuple(args, "iOppd", &fd, &token, &sniffs, &rated, &handshake)) return NULL;
    int32_t li = NIL;
    for (int32_t j = 0; j < c->nls; j++)
        if (!c->ls[j].active && c->ls[j].handshake.head == NIL) { li = j; break; }
    if (li == NIL) {
        if (c->nls == c->cap_ls) {
            int32_t cap = c->cap_ls ? c->cap_ls * 2 : 8;
            Listener *ls = PyMem_Realloc(c->ls, sizeof(Listener) * (size_t)cap);
            if (ls == NULL) return PyErr_NoMemory();
            c->ls = ls;
            c->cap_ls = cap;
        }
        li = c->nls++;
    }
    Listener *l = &c->ls[li];
    memset(l, 0, sizeof(*l));
    l->fd = fd;
    l->sniffs = (uint8_t)sniffs;
    l->rated = (uint8_t)rated;
    l->handshake.head = l->handshake.tail = NIL;
    l->handshake.duration = handshake;
    l->token = Py_NewRef(token);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = ((uint64_t)li << 2) | K_LISTENER};
    if (epoll_ctl(c->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
        Py_CLEAR(l->token);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    l->active = 1;
    return PyLong_FromLong(li);
}

static int unwatch(Core *c, long li) {
    if (li < 0 || li >= c->nls || !c->ls[li].active) return 0;
    Listener *l = &c->ls[li];
    if (!l->paused) epoll_ctl(c->ep, EPOLL_CTL_DEL, l->fd, NULL);
    l->active = 0;
    l->paused = 0;
    Py_CLEAR(l->token);
    return 1;
}

static PyObject *Core_unwatch_listener(Core *c, PyObject *arg) {
    long li = PyLong_AsLong(arg);
    if (li == -1 && PyErr_Occurred()) return NULL;
    return PyBool_FromLong(unwatch(c, li));
}

static PyObject *Core_watch_wake(Core *c, PyObject *arg) {
    int fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred()) return NULL;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = K_WAKE};
    if (epoll_ctl(c->ep, EPOLL_CTL_ADD, fd, &ev) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    c->wake_fd = fd;
    Py_RETURN_NONE;
}

static PyObject *Core_pause_listener(Core *c, PyObject *args) {
    long li;
    double seconds;
    if (!PyArg_ParseTuple(args, "ld", &li, &seconds)) return NULL;
    if (li >= 0 && li < c->nls && c->ls[li].active) pause_listener(c, &c->ls[li], seconds);
    Py_RETURN_NONE;
}

static int32_t find_arg(Core *c, PyObject *arg) {
    long long cid = PyLong_AsLongLong(arg);
    if (cid == -1 && PyErr_Occurred()) return -2;
    return find(c, cid);
}

/* End connection cid as the router asks: an opening is dropped (the handler hears a failed read), a
 * connect in progress fails with `reason`, a relay is closed with it. False: it had ended. */
static PyObject *Core_close(Core *c, PyObject *args) {
    PyObject *cid, *reason;
    if (!PyArg_ParseTuple(args, "OO", &cid, &reason)) return NULL;
    int32_t i = find_arg(c, cid);
    if (i == -2) return NULL;
    if (i == NIL) Py_RETURN_FALSE;
    Conn *k = slot(c, i);
    switch (k->state) {
    case S_OPENING: {
        timer_stop(c, i);
        PyObject *a[] = {k->token, Py_None};
        apply(c, i, call(c, CB_READ, a, 2));
        if (k->state == S_OPENING) drop(c, i); /* (k is the slot: freed, its state is FREE) */
        break;
    }
    case S_CONNECTING:
        connect_failed(c, i, reason);
        break;
    case S_RELAY:
        close_relay(c, i, reason);
        break;
    default:
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* Hand a relayed connection's descriptors to the caller: (client fd, target fd, the target's bytes
 * not yet written to the client), or None when it is not relaying. */
static PyObject *Core_detach(Core *c, PyObject *arg) {
    int32_t i = find_arg(c, arg);
    if (i == -2) return NULL;
    if (i == NIL || slot(c, i)->state != S_RELAY) Py_RETURN_NONE;
    Conn *k = slot(c, i);
    PyObject *pending;
    if (k->pipe[1] != NULL && k->pipe[1]->len) { /* (spliced: nothing is in the buffer's pending) */
        pending = PyBytes_FromStringAndSize(NULL, k->pipe[1]->len);
        if (pending == NULL) return NULL;
        ssize_t n = read(k->pipe[1]->r, PyBytes_AS_STRING(pending), k->pipe[1]->len);
        if (n < 0) n = 0;
        k->pipe[1]->len -= (uint32_t)n;
        if (_PyBytes_Resize(&pending, n) != 0) return NULL;
    } else {
        pending = PyBytes_FromStringAndSize(k->pend[1] ? k->pend[1] + k->poff[1] : "", k->plen[1]);
        if (pending == NULL) return NULL;
    }
    PyObject *result = Py_BuildValue("iiN", k->fd[0], k->fd[1], pending);
    if (result == NULL) return NULL;
    epoll_ctl(c->ep, EPOLL_CTL_DEL, k->fd[0], NULL);
    epoll_ctl(c->ep, EPOLL_CTL_DEL, k->fd[1], NULL);
    k->fd[0] = k->fd[1] = -1;
    release(c, i);
    return result;
}

static PyObject *Core_counts(Core *c, PyObject *arg) {
    int32_t i = find_arg(c, arg);
    if (i == -2) return NULL;
    if (i == NIL) return Py_BuildValue("(ii)", 0, 0);
    Conn *k = slot(c, i);
    return Py_BuildValue("(KK)", (unsigned long long)k->count[0], (unsigned long long)k->count[1]);
}

static PyObject *Core_stop_accepting(Core *c, PyObject *unused) {
    for (int32_t li = 0; li < c->nls; li++) unwatch(c, li);
    c->stopping = 1;
    Py_RETURN_NONE;
}

/* Close every connection (the end of a graceful shutdown): relays and connects with `reason`. */
static PyObject *Core_close_all(Core *c, PyObject *reason) {
    for (uint32_t ch = 0; ch < c->nchunks; ch++) {
        for (uint32_t j = 0; j < CHUNK; j++) {
            int32_t i = (int32_t)((ch << CHUNK_BITS) | j);
            Conn *k = slot(c, i);
            if (k->state == S_FREE) continue;
            PyObject *cid = PyLong_FromLongLong(cid_of(c, i));
            PyObject *args = cid ? PyTuple_Pack(2, cid, reason) : NULL;
            Py_XDECREF(cid);
            uint32_t gen = k->gen;
            /* A connect that fails with `reason` is not sent elsewhere; a second close ends
             * whatever the handler did instead. */
            for (int tries = 0; tries < 2 && args && k->state != S_FREE && k->gen == gen; tries++) {
                PyObject *r = Core_close(c, args);
                if (r == NULL) {
                    Py_DECREF(args);
                    return NULL;
                }
                Py_DECREF(r);
            }
            Py_XDECREF(args);
            if (args == NULL) return NULL;
            if (k->state != S_FREE && k->gen == gen) drop(c, i);
        }
    }
    Py_RETURN_NONE;
}

static PyObject *Core_openings(Core *c, PyObject *unused) {
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    for (uint32_t ch = 0; ch < c->nchunks; ch++)
        for (uint32_t j = 0; j < CHUNK; j++) {
            Conn *k = &c->chunks[ch][j];
            if (k->state == S_OPENING && k->token && PyList_Append(list, k->token) != 0) {
                Py_DECREF(list);
                return NULL;
            }
        }
    return list;
}

static PyObject *Core_run(Core *c, PyObject *unused) {
    if (c->running || c->ep < 0) {
        PyErr_SetString(PyExc_RuntimeError, c->running ? "the core runs already" : "the core is disposed of");
        return NULL;
    }
    c->running = 1;
    struct epoll_event events[EVENTS];
    while (!(c->stopping && c->live == 0)) {
        int timeout = next_timeout_ms(c);
        int n;
        Py_BEGIN_ALLOW_THREADS
        n = epoll_wait(c->ep, events, EVENTS, timeout);
        Py_END_ALLOW_THREADS
        if (n < 0 && errno != EINTR) {
            c->running = 0;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        for (int e = 0; e < n; e++) {
            uint64_t data = events[e].data.u64;
            int kind = (int)(data & 3);
            uint32_t index = (uint32_t)((data & 0xffffffff) >> 2);
            if (kind == K_WAKE) {
                call_none(c, CB_WAKE, NULL, 0);
            } else if (kind == K_LISTENER) {
                flush_released(c); /* admission counts the connections that ended first */
                if ((int32_t)index < c->nls) on_listener(c, (int32_t)index);
            } else {
                int32_t i = (int32_t)index;
                if ((index >> CHUNK_BITS) >= c->nchunks) continue;
                Conn *k = slot(c, i);
                if (k->state == S_FREE || k->gen != (uint32_t)(data >> 32)) continue; /* ended meanwhile */
                on_side(c, i, kind, events[e].events);
            }
        }
        if (c->runq_head != NIL) run_queue(c);
        expire(c);
        flush_released(c);
    }
    c->running = 0;
    Py_RETURN_NONE;
}

/* Close the epoll set and drop the handler (which refers to the core: a cycle); every connection
 * left is closed without a word. The loop must not be running. */
static PyObject *Core_dispose(Core *c, PyObject *unused) {
    if (c->running) {
        PyErr_SetString(PyExc_RuntimeError, "the core is running");
        return NULL;
    }
    for (uint32_t ch = 0; ch < c->nchunks; ch++)
        for (uint32_t j = 0; j < CHUNK; j++)
            if (c->chunks[ch][j].state != S_FREE) drop(c, (int32_t)((ch << CHUNK_BITS) | j));
    for (int32_t li = 0; li < c->nls; li++) unwatch(c, li);
    Core_clear(c);
    if (c->ep >= 0) {
        close(c->ep);
        c->ep = -2; /* not -1: initialised once */
    }
    c->stopping = 1;
    Py_RETURN_NONE;
}

/* Make router `router`'s lean connections (connecting or relayed) ordinary ones: the tokens the
 * handler's `materialized` gave, for the caller to register. */
static PyObject *Core_materialize(Core *c, PyObject *arg) {
    long router = PyLong_AsLong(arg);
    if (router == -1 && PyErr_Occurred()) return NULL;
    PyObject *made = PyList_New(0);
    if (made == NULL) return NULL;
    if (router < 0 || router >= c->nrouters || c->lean_alive[router] == 0) return made;
    for (uint32_t ch = 0; ch < c->nchunks; ch++) {
        for (uint32_t j = 0; j < CHUNK; j++) {
            int32_t i = (int32_t)((ch << CHUNK_BITS) | j);
            Conn *k = slot(c, i);
            if (!(k->flags & F_LEAN) || k->held || k->router != router ||
                (k->state != S_RELAY && k->state != S_CONNECTING))
                continue;
            PyObject *token = materialize_slot(c, i, M_READ);
            if (token == NULL) {
                PyErr_Clear();
                continue;
            }
            int failed = PyList_Append(made, token);
            Py_DECREF(token);
            if (failed) {
                Py_DECREF(made);
                return NULL;
            }
        }
    }
    return made;
}

/* Per target index: (open, (count of each bucket..., +Inf), sum of connect times, bytes in, bytes
 * out) of its lean connections so far (open: connected, not ended or materialized). */
static PyObject *Core_lean_counts(Core *c, PyObject *unused) {
    PyObject *list = PyList_New(c->ntargets);
    if (list == NULL) return NULL;
    for (int32_t ix = 0; ix < c->ntargets; ix++) {
        LeanTarget *t = &c->targets[ix];
        PyObject *hist = PyTuple_New(c->nbounds + 1);
        if (hist == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        for (int32_t b = 0; b <= c->nbounds; b++) {
            PyObject *n = PyLong_FromUnsignedLongLong(t->hist ? t->hist[b] : 0);
            if (n == NULL) {
                Py_DECREF(hist);
                Py_DECREF(list);
                return NULL;
            }
            PyTuple_SET_ITEM(hist, b, n);
        }
        PyObject *row = Py_BuildValue("(KNdKK)", (unsigned long long)(t->opened - t->ended - t->moved), hist,
                                      t->sum, (unsigned long long)t->bytes[0], (unsigned long long)t->bytes[1]);
        if (row == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, ix, row);
    }
    return list;
}

/* The line buffer's `connected` and `closed` methods (router/_conn_lines.c) and the handler's
 * flush for when it is full; None: lean connections write no lines. */
static PyObject *Core_set_lines(Core *c, PyObject *args) {
    PyObject *connected, *closed, *flush;
    if (!PyArg_ParseTuple(args, "OOO", &connected, &closed, &flush)) return NULL;
    Py_XSETREF(c->lines_connected, connected == Py_None ? NULL : Py_NewRef(connected));
    Py_XSETREF(c->lines_closed, closed == Py_None ? NULL : Py_NewRef(closed));
    Py_XSETREF(c->flush_lines, flush == Py_None ? NULL : Py_NewRef(flush));
    Py_RETURN_NONE;
}

/* The connect-time histogram's bucket bounds (increasing), once, before any lean connection. */
static PyObject *Core_set_buckets(Core *c, PyObject *arg) {
    if (c->ntargets > 0 || c->bounds != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the buckets are set once, before any lean connection");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(arg, "buckets must be a sequence of floats");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    double *bounds = PyMem_Malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (bounds == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t b = 0; b < n; b++) {
        bounds[b] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, b));
        if ((bounds[b] == -1 && PyErr_Occurred()) || (b > 0 && bounds[b] <= bounds[b - 1])) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bucket bounds must increase");
            PyMem_Free(bounds);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    c->bounds = bounds;
    c->nbounds = (int32_t)n;
    Py_RETURN_NONE;
}

static PyObject *Core_get_live(Core *c, void *unused) { return PyLong_FromUnsignedLong(c->live); }
static PyObject *Core_get_proxied(Core *c, void *unused) { return PyLong_FromUnsignedLong(c->proxied); }
static PyObject *Core_get_spliced(Core *c, void *unused) { return PyLong_FromUnsignedLongLong(c->spliced); }

static PyMethodDef Core_methods[] = {
    {"watch_listener", (PyCFunction)Core_watch_listener, METH_VARARGS,
     "watch_listener(fd, token, sniffs, rated, handshake_s) -> listener id: accept from it."},
    {"unwatch_listener", (PyCFunction)Core_unwatch_listener, METH_O,
     "unwatch_listener(id) -> bool: stop accepting from it (the caller closes it afterwards)."},
    {"pause_listener", (PyCFunction)Core_pause_listener, METH_VARARGS,
     "pause_listener(id, seconds): stop accepting from it for a while."},
    {"watch_wake", (PyCFunction)Core_watch_wake, METH_O,
     "watch_wake(fd): call handler.wake() whenever fd is readable."},
    {"close", (PyCFunction)Core_close, METH_VARARGS, "close(cid, reason) -> bool: end a connection."},
    {"detach", (PyCFunction)Core_detach, METH_O,
     "detach(cid) -> (client fd, target fd, pending) | None: hand a relayed connection over."},
    {"counts", (PyCFunction)Core_counts, METH_O, "counts(cid) -> (bytes in, bytes out)."},
    {"stop_accepting", (PyCFunction)Core_stop_accepting, METH_NOARGS,
     "Stop watching every listener; run() returns once no connection is left."},
    {"close_all", (PyCFunction)Core_close_all, METH_O, "close_all(reason): end every connection."},
    {"openings", (PyCFunction)Core_openings, METH_NOARGS, "The tokens of connections reading their opening."},
    {"run", (PyCFunction)Core_run, METH_NOARGS, "Run the loop (in its own thread)."},
    {"materialize", (PyCFunction)Core_materialize, METH_O,
     "materialize(router index) -> [token]: that router's lean connections made ordinary ones."},
    {"lean_counts", (PyCFunction)Core_lean_counts, METH_NOARGS,
     "[(open, bucket counts, connect time sum, bytes in, bytes out)] of lean connections, by target index."},
    {"set_lines", (PyCFunction)Core_set_lines, METH_VARARGS,
     "set_lines(connected, closed, flush): how lean connections write their lines (None: none)."},
    {"set_buckets", (PyCFunction)Core_set_buckets, METH_O,
     "set_buckets(bounds): the connect-time histogram of lean connections (once, first)."},
    {"dispose", (PyCFunction)Core_dispose, METH_NOARGS,
     "Close the epoll set and drop the handler (after the loop ended)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Core_getset[] = {
    {"live", (getter)Core_get_live, NULL, "Connections in the table (any phase).", NULL},
    {"proxied", (getter)Core_get_proxied, NULL, "Connections connecting or relayed.", NULL},
    {"spliced", (getter)Core_get_spliced, NULL, "Bytes relayed through pipes (splice) so far.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "router.datapath._core.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The native data path's epoll loop (router/datapath/native_path.py drives it).",
    .tp_new = Core_new,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_traverse = (traverseproc)Core_traverse,
    .tp_clear = (inquiry)Core_clear,
    .tp_methods = Core_methods,
    .tp_getset = Core_getset,
};

/* mqtt_frames(data, ...) -> (frames, bytes left, header part, lost): the lean MQTT follower after
 * each of the reads given, for the tests against MqttFrames. */
static PyObject *module_mqtt_frames(PyObject *unused, PyObject *reads) {
    Conn k;
    memset(&k, 0, sizeof(k));
    Py_ssize_t n = PyTuple_GET_SIZE(reads);
    for (Py_ssize_t r = 0; r < n; r++) {
        char *data;
        Py_ssize_t len;
        if (PyBytes_AsStringAndSize(PyTuple_GET_ITEM(reads, r), &data, &len) != 0) return NULL;
        mqtt_follow(&k, (const unsigned char *)data, (size_t)len);
    }
    return mqtt_state(&k);
}

/* ipv4_text(4 bytes) -> str: the core's IPv4 text, for the tests against inet_ntop. */
static PyObject *module_ipv4_text(PyObject *unused, PyObject *arg) {
    char *data;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(arg, &data, &len) != 0) return NULL;
    if (len != 4) {
        PyErr_SetString(PyExc_ValueError, "an IPv4 address is 4 bytes");
        return NULL;
    }
    char text[16];
    size_t n = ipv4_text((const unsigned char *)data, text);
    return PyUnicode_DecodeASCII(text, (Py_ssize_t)n, NULL);
}

/* mqtt_refused(data) -> bool: the core's reading of a broker's first answer, for the tests. */
static PyObject *module_mqtt_refused(PyObject *unused, PyObject *arg) {
    char *data;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(arg, &data, &len) != 0) return NULL;
    return PyBool_FromLong(mqtt_refused((const unsigned char *)data, (size_t)len));
}

static PyMethodDef module_methods[] = {
    {"mqtt_frames", module_mqtt_frames, METH_VARARGS,
     "mqtt_frames(*reads) -> (frames, left, head, lost): the lean MQTT follower after the reads."},
    {"ipv4_text", module_ipv4_text, METH_O, "ipv4_text(4 bytes) -> str: an IPv4 address as inet_ntop writes it."},
    {"mqtt_refused", module_mqtt_refused, METH_O,
     "mqtt_refused(first answer) -> bool: whether it is an MQTT CONNACK that refuses the client."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "router.datapath._core",
    "The native data path's C core (router/datapath/native_path.py).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__core(void) {
    if (PyType_Ready(&CoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Core", (PyObject *)&CoreType) < 0 ||
        PyModule_AddIntConstant(m, "ACT_WAIT", ACT_WAIT) < 0 ||
        PyModule_AddIntConstant(m, "ACT_CLOSE", ACT_CLOSE) < 0 ||
        PyModule_AddIntConstant(m, "ACT_PROXY", ACT_PROXY) < 0 ||
        PyModule_AddIntConstant(m, "ACT_HANDOVER", ACT_HANDOVER) < 0 ||
        PyModule_AddIntConstant(m, "F_FIRST", F_FIRST) < 0 ||
        PyModule_AddIntConstant(m, "F_FEED", F_FEED) < 0 ||
        PyModule_AddIntConstant(m, "F_LEAN", F_LEAN) < 0 ||
        PyModule_AddIntConstant(m, "F_MQTT", F_MQTT) < 0 ||
        PyModule_AddIntConstant(m, "M_READ", M_READ) < 0 ||
        PyModule_AddIntConstant(m, "M_CLOSING", M_CLOSING) < 0 ||
        PyModule_AddIntConstant(m, "M_ANSWER", M_ANSWER) < 0 ||
        PyModule_AddIntConstant(m, "LEAN_FIELDS", L_SIZE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
