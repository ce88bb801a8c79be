/* The workers' shared zone: state that must be one for all worker processes, in one shared memory
 * region (router/features/workers/zone.py wraps it). As nginx's zones: the sticky cache (every
 * worker sends a key to the same broker), the ROUND_ROBIN positions, and the node ids the cache
 * refers to by number.
 *
 * It also carries a board: bytes one process publishes (the supervisor: its targets' readiness and
 * administrative states) and the others read when they change (a sequence lock).
 *
 * The region is a memfd (`Zone(...)` creates it, `Zone.attach(fd)` maps it in another process, a
 * forked child inherits the mapping). Layout: a header, an index of 2^k slots (open addressing,
 * linear probing, deletion by backward shift: no tombstones), then the entries, handed out from the
 * front (a free list first) so that only the pages of entries ever used are touched.
 *
 * The cache's rules are cache/cache.py's `TargetCache` (the reference its tests compare against):
 * expire-after-access (`timeout`), at most `max_entries` entries (the least recently used goes, in
 * exact LRU order: a doubly linked list), pins that are neither refreshed, expired by the timeout,
 * nor evicted to make room (at most `max_pins`, an error beyond). Times are the caller's clock,
 * the same for every process sharing the zone (the wrapper uses the system's monotonic clock).
 *
 * Keys: an entry holds a key's length, its keyed 128-bit hash (SipHash-2-4 twice, with a random
 * key drawn when the zone is made, so that clients cannot aim at a slot) and its first KEY_INLINE
 * bytes. Two keys are the same when all three are: exact for keys up to KEY_INLINE bytes, and for
 * longer ones a collision needs two keys of one length, prefix and 128-bit keyed hash. A longer
 * key reads back as its first KEY_INLINE bytes (`items` says which were cut).
 *
 * Concurrency: one process-shared robust mutex guards the cache (a critical section is a lookup and
 * a few links, without a system call or an allocation). A worker killed inside one leaves the
 * mutex to the next taker, which marks it consistent and goes on: at worst one entry's links are
 * half-changed, which costs that entry (walks are bounded by the capacity), never a crash.
 * The ROUND_ROBIN positions are lock-free (compare-and-swap).
 */
#define _GNU_SOURCE /* memfd_create */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define ZONE_MAGIC 0x31656e6f7a727472ULL /* "rtrzone1" */
#define ZONE_VERSION 1u
#define KEY_INLINE 200u
#define NODES_MAX 1024u
#define NODE_LEN 255u
#define ROUTERS_MAX 256u
#define NIL UINT32_MAX
#define PINS_DEFAULT 10000u
#define ENTRIES_MAX (1u << 26)
#define BOARD_MAX 65536u

typedef struct {
    uint64_t magic;
    uint32_t version;
    uint32_t max_entries; /* the LRU bound on entries that are not pins */
    uint32_t max_pins;
    uint32_t capacity; /* max_entries + max_pins: entries never run out */
    uint32_t mask;     /* index slots - 1 */
    uint32_t routers;
    uint64_t total;   /* bytes mapped */
    uint64_t sip[4];  /* the hash keys */
    double timeout_s; /* 0: never */
    pthread_mutex_t lock;
    /* under the lock: */
    uint32_t size; /* entries that are not pins */
    uint32_t pins;
    uint32_t high;      /* entries handed out from the front so far */
    uint32_t free_head; /* freed entries, linked by `next` */
    uint32_t lru_head;  /* least recently used */
    uint32_t lru_tail;
    uint32_t nodes;
    uint32_t _pad;
    uint64_t hits, misses, evictions;
    _Atomic int64_t rr[ROUTERS_MAX];
    uint8_t node_ids[NODES_MAX][NODE_LEN + 1]; /* [0] = length */
    /* The board: bytes one process (the supervisor) publishes and the others read, under a
     * sequence lock (odd while being written). */
    _Atomic uint64_t board_seq;
    uint32_t board_len;
    uint8_t board[BOARD_MAX];
} zone_header;

typedef struct {
    uint64_t h0, h1; /* the key's keyed hash */
    double access;   /* last read or write */
    double until;    /* a pin's end (inf: none); NAN: not a pin */
    uint32_t prev, next;
    uint32_t key_len;
    uint16_t node;
    uint16_t live;
    char key[KEY_INLINE];
} zone_entry;

static size_t index_offset(void) { return (sizeof(zone_header) + 63) & ~(size_t)63; }
static size_t entries_offset(uint32_t mask) {
    return (index_offset() + ((size_t)mask + 1) * sizeof(uint32_t) + 63) & ~(size_t)63;
}

/* -- SipHash-2-4 (the reference algorithm by Aumasson and Bernstein, written for this file) -- */

static inline uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

#define SIPROUND                                                                                    \
    do {                                                                                            \
        v0 += v1; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32);                                   \
        v2 += v3; v3 = rotl(v3, 16); v3 ^= v2;                                                      \
        v0 += v3; v3 = rotl(v3, 21); v3 ^= v0;                                                      \
        v2 += v1; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32);                                   \
    } while (0)

static uint64_t siphash(const uint8_t *in, size_t len, uint64_t k0, uint64_t k1) {
    uint64_t v0 = 0x736f6d6570736575ULL ^ k0, v1 = 0x646f72616e646f6dULL ^ k1;
    uint64_t v2 = 0x6c7967656e657261ULL ^ k0, v3 = 0x7465646279746573ULL ^ k1;
    const uint8_t *end = in + (len & ~(size_t)7);
    for (; in != end; in += 8) {
        uint64_t m;
        memcpy(&m, in, 8); /* little-endian machines only: the zone never leaves its host */
        v3 ^= m;
        SIPROUND;
        SIPROUND;
        v0 ^= m;
    }
    uint64_t b = ((uint64_t)len) << 56;
    switch (len & 7) {
    case 7: b |= ((uint64_t)in[6]) << 48; /* fall through */
    case 6: b |= ((uint64_t)in[5]) << 40; /* fall through */
    case 5: b |= ((uint64_t)in[4]) << 32; /* fall through */
    case 4: b |= ((uint64_t)in[3]) << 24; /* fall through */
    case 3: b |= ((uint64_t)in[2]) << 16; /* fall through */
    case 2: b |= ((uint64_t)in[1]) << 8;  /* fall through */
    case 1: b |= ((uint64_t)in[0]); break;
    default: break;
    }
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* -- the region -- */

typedef struct {
    zone_header *h;
    uint32_t *index;
    zone_entry *entries;
} zone;

static void zone_view(zone *z, void *base) {
    z->h = base;
    z->index = (uint32_t *)((char *)base + index_offset());
    z->entries = (zone_entry *)((char *)base + entries_offset(z->h->mask));
}

static int zone_lock(zone *z) {
    int rc = pthread_mutex_lock(&z->h->lock);
    if (rc == EOWNERDEAD) rc = pthread_mutex_consistent(&z->h->lock);
    return rc;
}

static void zone_unlock(zone *z) { pthread_mutex_unlock(&z->h->lock); }

typedef struct {
    const uint8_t *bytes;
    uint32_t len;
    uint64_t h0, h1;
} zone_key;

static void key_of(const zone *z, const uint8_t *bytes, size_t len, zone_key *k) {
    k->bytes = bytes;
    k->len = (uint32_t)len;
    k->h0 = siphash(bytes, len, z->h->sip[0], z->h->sip[1]);
    k->h1 = siphash(bytes, len, z->h->sip[2], z->h->sip[3]);
}

static int same_key(const zone_entry *e, const zone_key *k) {
    uint32_t n = k->len < KEY_INLINE ? k->len : KEY_INLINE;
    return e->h0 == k->h0 && e->h1 == k->h1 && e->key_len == k->len && memcmp(e->key, k->bytes, n) == 0;
}

/* The slot holding a key's entry, or the empty slot where it would go (then *found = 0). */
static uint32_t find_slot(const zone *z, const zone_key *k, int *found) {
    uint32_t mask = z->h->mask, i = (uint32_t)k->h0 & mask;
    for (;;) {
        uint32_t v = z->index[i];
        if (v == 0) {
            *found = 0;
            return i;
        }
        if (same_key(&z->entries[v - 1], k)) {
            *found = 1;
            return i;
        }
        i = (i + 1) & mask;
    }
}

static void unlink_lru(zone *z, uint32_t e) {
    zone_entry *x = &z->entries[e];
    if (x->prev == NIL) z->h->lru_head = x->next;
    else z->entries[x->prev].next = x->next;
    if (x->next == NIL) z->h->lru_tail = x->prev;
    else z->entries[x->next].prev = x->prev;
    x->prev = x->next = NIL;
}

static void append_lru(zone *z, uint32_t e) {
    zone_entry *x = &z->entries[e];
    x->prev = z->h->lru_tail;
    x->next = NIL;
    if (x->prev == NIL) z->h->lru_head = e;
    else z->entries[x->prev].next = e;
    z->h->lru_tail = e;
}

/* Remove the entry in index slot `i` (backward-shift deletion keeps every probe chain whole). */
static void remove_slot(zone *z, uint32_t i) {
    uint32_t e = z->index[i] - 1, mask = z->h->mask;
    zone_entry *x = &z->entries[e];
    if (isnan(x->until)) {
        unlink_lru(z, e);
        z->h->size--;
    } else {
        z->h->pins--;
    }
    x->live = 0;
    x->next = z->h->free_head;
    z->h->free_head = e;
    z->index[i] = 0;
    for (uint32_t j = (i + 1) & mask;; j = (j + 1) & mask) {
        uint32_t v = z->index[j];
        if (v == 0) return;
        uint32_t home = (uint32_t)z->entries[v - 1].h0 & mask;
        /* The entry at j may move to the hole at i unless its home lies cyclically in (i, j]. */
        int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            z->index[i] = v;
            z->index[j] = 0;
            i = j;
        }
    }
}

static uint32_t slot_of_entry(const zone *z, uint32_t e) {
    zone_key k = {(const uint8_t *)z->entries[e].key, z->entries[e].key_len, z->entries[e].h0, z->entries[e].h1};
    int found;
    uint32_t i = find_slot(z, &k, &found);
    return found ? i : NIL;
}

/* A new entry in the empty index slot `i` (the caller made room). */
static uint32_t insert_at(zone *z, uint32_t i, const zone_key *k, uint16_t node, double access, double until) {
    uint32_t e;
    if (z->h->free_head != NIL) {
        e = z->h->free_head;
        z->h->free_head = z->entries[e].next;
    } else {
        e = z->h->high++;
    }
    zone_entry *x = &z->entries[e];
    x->h0 = k->h0;
    x->h1 = k->h1;
    x->key_len = k->len;
    memcpy(x->key, k->bytes, k->len < KEY_INLINE ? k->len : KEY_INLINE);
    x->node = node;
    x->access = access;
    x->until = until;
    x->prev = x->next = NIL;
    x->live = 1;
    if (isnan(until)) {
        append_lru(z, e);
        z->h->size++;
    } else {
        z->h->pins++;
    }
    z->index[i] = e + 1;
    return e;
}

static int expired(const zone *z, const zone_entry *x, double now) {
    return z->h->timeout_s > 0 && now - x->access >= z->h->timeout_s;
}

/* -- the Python type -- */

typedef struct {
    PyObject_HEAD
    zone z;
    void *base;
    size_t size;
    int fd;
} Zone;

static PyObject *ZoneError; /* set at module init */

static int zone_new_region(Zone *self, uint32_t max_entries, uint32_t max_pins, double timeout_s, uint32_t routers) {
    uint32_t capacity = max_entries + max_pins, slots = 16;
    while (slots < 2 * (uint64_t)capacity) slots <<= 1;
    size_t total = entries_offset(slots - 1) + (size_t)capacity * sizeof(zone_entry);
    int fd = memfd_create("routerd-zone", MFD_CLOEXEC);
    if (fd < 0) return -1;
    if (ftruncate(fd, (off_t)total) < 0) {
        close(fd);
        return -1;
    }
    void *base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        close(fd);
        return -1;
    }
    zone_header *h = base;
    h->version = ZONE_VERSION;
    h->max_entries = max_entries;
    h->max_pins = max_pins;
    h->capacity = capacity;
    h->mask = slots - 1;
    h->routers = routers;
    h->total = total;
    h->timeout_s = timeout_s;
    h->free_head = h->lru_head = h->lru_tail = NIL;
    if (getrandom(h->sip, sizeof h->sip, 0) != (ssize_t)sizeof h->sip) {
        munmap(base, total);
        close(fd);
        if (errno == 0) errno = EIO;
        return -1;
    }
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&h->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    atomic_thread_fence(memory_order_release);
    h->magic = ZONE_MAGIC;
    self->base = base;
    self->size = total;
    self->fd = fd;
    zone_view(&self->z, base);
    return 0;
}

static int Zone_init(Zone *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"max_entries", "timeout_s", "max_pins", "routers", NULL};
    unsigned int max_entries, max_pins = PINS_DEFAULT, routers = 1;
    double timeout_s = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "I|d$II", kw, &max_entries, &timeout_s, &max_pins, &routers))
        return -1;
    if (self->base != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a zone is made once");
        return -1;
    }
    if (max_entries < 1 || max_entries > ENTRIES_MAX || max_pins > ENTRIES_MAX) {
        PyErr_Format(PyExc_ValueError, "max_entries must be 1..%u and max_pins at most %u, got %u and %u",
                     ENTRIES_MAX, ENTRIES_MAX, max_entries, max_pins);
        return -1;
    }
    if (!(timeout_s >= 0) || isinf(timeout_s)) {
        PyErr_Format(PyExc_ValueError, "timeout_s must be a finite number >= 0, got %g", timeout_s);
        return -1;
    }
    if (routers < 1 || routers > ROUTERS_MAX) {
        PyErr_Format(PyExc_ValueError, "routers must be 1..%u, got %u", ROUTERS_MAX, routers);
        return -1;
    }
    if (zone_new_region(self, max_entries, max_pins, timeout_s, routers) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

static PyObject *Zone_attach(PyTypeObject *type, PyObject *arg) {
    int fd = PyObject_AsFileDescriptor(arg);
    if (fd < 0) return NULL;
    struct stat st;
    if (fstat(fd, &st) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    if ((size_t)st.st_size < sizeof(zone_header)) {
        PyErr_Format(ZoneError, "descriptor %d is not a zone (%lld bytes)", fd, (long long)st.st_size);
        return NULL;
    }
    void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return PyErr_SetFromErrno(PyExc_OSError);
    zone_header *h = base;
    if (h->magic != ZONE_MAGIC || h->version != ZONE_VERSION || h->total != (uint64_t)st.st_size) {
        munmap(base, (size_t)st.st_size);
        PyErr_Format(ZoneError, "descriptor %d is not a zone of this version", fd);
        return NULL;
    }
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0) {
        munmap(base, (size_t)st.st_size);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Zone *self = (Zone *)type->tp_alloc(type, 0);
    if (self == NULL) {
        munmap(base, (size_t)st.st_size);
        close(own);
        return NULL;
    }
    self->base = base;
    self->size = (size_t)st.st_size;
    self->fd = own;
    zone_view(&self->z, base);
    return (PyObject *)self;
}

static void Zone_dealloc(Zone *self) {
    if (self->base != NULL) munmap(self->base, self->size);
    if (self->fd >= 0) close(self->fd);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Zone_tp_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Zone *self = (Zone *)type->tp_alloc(type, 0);
    if (self != NULL) self->fd = -1;
    return (PyObject *)self;
}

static int ready(Zone *self) {
    if (self->base == NULL) {
        PyErr_SetString(ZoneError, "the zone is not made");
        return 0;
    }
    return 1;
}

static int lock_or_raise(Zone *self) {
    int rc = zone_lock(&self->z);
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

static PyObject *node_text(const zone *z, uint16_t node) {
    const uint8_t *n = z->h->node_ids[node];
    return PyUnicode_DecodeUTF8((const char *)n + 1, n[0], "strict");
}

/* The node number of a node id, added when new (under the lock). -1 with an exception when full. */
static int node_number(zone *z, const char *text, Py_ssize_t len) {
    if (len > (Py_ssize_t)NODE_LEN) {
        PyErr_Format(PyExc_ValueError, "a node id is at most %u bytes, got %zd", NODE_LEN, len);
        return -1;
    }
    for (uint32_t i = 0; i < z->h->nodes; i++) {
        const uint8_t *n = z->h->node_ids[i];
        if (n[0] == len && memcmp(n + 1, text, (size_t)len) == 0) return (int)i;
    }
    if (z->h->nodes == NODES_MAX) {
        PyErr_Format(ZoneError, "the zone knows %u node ids at most", NODES_MAX);
        return -1;
    }
    uint8_t *n = z->h->node_ids[z->h->nodes];
    n[0] = (uint8_t)len;
    memcpy(n + 1, text, (size_t)len);
    return (int)z->h->nodes++;
}

/* A time argument (a float, inf for a pin without end); -1 with an exception. */
static int as_time(PyObject *arg, double *out) {
    *out = PyFloat_AsDouble(arg);
    if (*out == -1.0 && PyErr_Occurred()) return -1;
    if (isnan(*out)) {
        PyErr_SetString(PyExc_ValueError, "a time is a number, got nan");
        return -1;
    }
    return 0;
}

static int parse_key(Zone *self, PyObject *key, zone_key *k) {
    Py_ssize_t len;
    const char *bytes = PyUnicode_AsUTF8AndSize(key, &len);
    if (bytes == NULL) return -1;
    key_of(&self->z, (const uint8_t *)bytes, (size_t)len, k);
    return 0;
}

/* The (key, now) of get, fresh and touch, checked and parsed, then the lock taken: 0, or -1 with an
 * exception (`usage` says the call's signature). */
static int locked_key_at(Zone *self, PyObject *const *args, Py_ssize_t nargs, const char *usage, zone_key *k,
                         double *now) {
    if (nargs != 2 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    if (!ready(self) || as_time(args[1], now) < 0 || parse_key(self, args[0], k) < 0) return -1;
    return lock_or_raise(self);
}

/* get(key, now) -> node id | None: TargetCache.get. */
static PyObject *Zone_get(Zone *self, PyObject *const *args, Py_ssize_t nargs) {
    double now;
    zone_key k;
    if (locked_key_at(self, args, nargs, "get(key: str, now: float)", &k, &now) < 0) return NULL;
    zone *z = &self->z;
    int found;
    uint32_t i = find_slot(z, &k, &found);
    int node = -1;
    if (found) {
        uint32_t e = z->index[i] - 1;
        zone_entry *x = &z->entries[e];
        if (!isnan(x->until)) {
            if (x->until <= now) remove_slot(z, i);
            else node = x->node;
        } else if (expired(z, x, now)) {
            remove_slot(z, i);
        } else {
            node = x->node;
            x->access = now;
            unlink_lru(z, e);
            append_lru(z, e);
        }
    }
    if (node < 0) z->h->misses++;
    else z->h->hits++;
    zone_unlock(z);
    if (node < 0) Py_RETURN_NONE;
    return node_text(z, (uint16_t)node);
}

/* fresh(key, now) -> node id | None: TargetCache.fresh (nothing changed). */
static PyObject *Zone_fresh(Zone *self, PyObject *const *args, Py_ssize_t nargs) {
    double now;
    zone_key k;
    if (locked_key_at(self, args, nargs, "fresh(key: str, now: float)", &k, &now) < 0) return NULL;
    zone *z = &self->z;
    int found;
    uint32_t i = find_slot(z, &k, &found);
    int node = -1;
    if (found) {
        zone_entry *x = &z->entries[z->index[i] - 1];
        if (isnan(x->until) && !expired(z, x, now)) node = x->node;
    }
    zone_unlock(z);
    if (node < 0) Py_RETURN_NONE;
    return node_text(z, (uint16_t)node);
}

/* peek(key) -> (node id, last access, pinned until | None) | None: an entry as it is (expired or not,
 * nothing changed). */
static PyObject *Zone_peek(Zone *self, PyObject *key) {
    zone_key k;
    if (!PyUnicode_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "peek(key: str)");
        return NULL;
    }
    if (!ready(self) || parse_key(self, key, &k) < 0 || lock_or_raise(self) < 0) return NULL;
    zone *z = &self->z;
    int found;
    uint32_t i = find_slot(z, &k, &found);
    double access = 0, until = NAN;
    uint16_t node = 0;
    if (found) {
        const zone_entry *x = &z->entries[z->index[i] - 1];
        access = x->access;
        until = x->until;
        node = x->node;
    }
    zone_unlock(z);
    if (!found) Py_RETURN_NONE;
    if (isnan(until)) return Py_BuildValue("(NdO)", node_text(z, node), access, Py_None);
    return Py_BuildValue("(Ndd)", node_text(z, node), access, until);
}

/* touch(key, now): TargetCache.touch's hit (refreshed, counted) of an entry that is there. */
static PyObject *Zone_touch(Zone *self, PyObject *const *args, Py_ssize_t nargs) {
    double now;
    zone_key k;
    if (locked_key_at(self, args, nargs, "touch(key: str, now: float)", &k, &now) < 0) return NULL;
    zone *z = &self->z;
    int found;
    uint32_t i = find_slot(z, &k, &found);
    if (found) {
        uint32_t e = z->index[i] - 1;
        zone_entry *x = &z->entries[e];
        if (isnan(x->until)) {
            x->access = now;
            unlink_lru(z, e);
            append_lru(z, e);
        }
    }
    z->h->hits++;
    zone_unlock(z);
    Py_RETURN_NONE;
}

/* Under the lock: `put`'s change. When an entry is evicted to make room, its key's first bytes are
 * copied to `evicted` (KEY_INLINE bytes at most) and their length returned; else -1. */
static int put_locked(zone *z, const zone_key *k, uint16_t node, double now, char *evicted) {
    int found, cut = -1;
    uint32_t i = find_slot(z, k, &found);
    if (found) {
        uint32_t e = z->index[i] - 1;
        zone_entry *x = &z->entries[e];
        if (isnan(x->until)) { /* a pin keeps its node */
            x->node = node;
            x->access = now;
            unlink_lru(z, e);
            append_lru(z, e);
        }
        return -1;
    }
    if (z->h->size >= z->h->max_entries) {
        uint32_t oldest = z->h->lru_head;
        zone_entry *o = &z->entries[oldest];
        cut = (int)(o->key_len < KEY_INLINE ? o->key_len : KEY_INLINE);
        memcpy(evicted, o->key, (size_t)cut);
        remove_slot(z, slot_of_entry(z, oldest));
        z->h->evictions++;
        i = find_slot(z, k, &found); /* the shift may have moved the hole */
    }
    insert_at(z, i, k, node, now, NAN);
    return cut;
}

/* Whether the key's entry is what a caller read: `expected` its node id (len `elen`), or NULL for
 * no entry that is fresh and not a pin. Under the lock. */
static int entry_is(const zone *z, const zone_key *k, double now, const char *expected, Py_ssize_t elen) {
    int found;
    uint32_t i = find_slot(z, k, &found);
    const zone_entry *x = found ? &z->entries[z->index[i] - 1] : NULL;
    if (x == NULL || !isnan(x->until) || expired(z, x, now)) return expected == NULL;
    const uint8_t *n = z->h->node_ids[x->node];
    return expected != NULL && n[0] == elen && memcmp(n + 1, expected, (size_t)elen) == 0;
}

/* put(key, node_id, now) -> evicted key | None: TargetCache.put; the key evicted to make room.
 * put(key, node_id, now, expected) -> bool: the same only while the key's entry is still what the
 * caller read (`expected`: its node id, or None for no entry that is fresh and not a pin); False,
 * with nothing changed, when another process wrote it meanwhile. */
static PyObject *Zone_put(Zone *self, PyObject *const *args, Py_ssize_t nargs) {
    double now;
    zone_key k;
    int conditional = nargs == 4;
    if ((nargs != 3 && nargs != 4) || !PyUnicode_Check(args[0]) || !PyUnicode_Check(args[1]) ||
        (conditional && args[3] != Py_None && !PyUnicode_Check(args[3]))) {
        PyErr_SetString(PyExc_TypeError, "put(key: str, node_id: str, now: float[, expected: str | None])");
        return NULL;
    }
    if (!ready(self) || as_time(args[2], &now) < 0) return NULL;
    Py_ssize_t nlen, elen = 0;
    const char *ntext = PyUnicode_AsUTF8AndSize(args[1], &nlen);
    if (ntext == NULL) return NULL;
    const char *etext = NULL;
    if (conditional && args[3] != Py_None && (etext = PyUnicode_AsUTF8AndSize(args[3], &elen)) == NULL) return NULL;
    if (parse_key(self, args[0], &k) < 0 || lock_or_raise(self) < 0) return NULL;
    zone *z = &self->z;
    int node = node_number(z, ntext, nlen);
    if (node < 0) {
        zone_unlock(z);
        return NULL;
    }
    if (conditional && !entry_is(z, &k, now, etext, elen)) {
        zone_unlock(z);
        Py_RETURN_FALSE;
    }
    char evicted[KEY_INLINE];
    int cut = put_locked(z, &k, (uint16_t)node, now, evicted);
    zone_unlock(z);
    if (conditional) Py_RETURN_TRUE;
    if (cut < 0) Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(evicted, cut, "replace");
}

/* evict(key) -> bool: TargetCache.evict. */
static PyObject *Zone_evict(Zone *self, PyObject *key) {
    zone_key k;
    if (!PyUnicode_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "evict(key: str)");
        return NULL;
    }
    if (!ready(self) || parse_key(self, key, &k) < 0 || lock_or_raise(self) < 0) return NULL;
    int found;
    uint32_t i = find_slot(&self->z, &k, &found);
    if (found) remove_slot(&self->z, i);
    zone_unlock(&self->z);
    return PyBool_FromLong(found);
}

/* pin(key, node_id, now, until): TargetCache.pin (ZoneError beyond max_pins). */
static PyObject *Zone_pin(Zone *self, PyObject *const *args, Py_ssize_t nargs) {
    double now, until;
    zone_key k;
    if (nargs != 4 || !PyUnicode_Check(args[0]) || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "pin(key: str, node_id: str, now: float, until: float)");
        return NULL;
    }
    if (!ready(self) || as_time(args[2], &now) < 0) return NULL;
    if (as_time(args[3], &until) < 0) return NULL;
    if (!(until > now)) {
        PyErr_Format(PyExc_ValueError, "a pin must end after now, got %g s from now", until - now);
        return NULL;
    }
    Py_ssize_t nlen;
    const char *ntext = PyUnicode_AsUTF8AndSize(args[1], &nlen);
    if (ntext == NULL || parse_key(self, args[0], &k) < 0 || lock_or_raise(self) < 0) return NULL;
    zone *z = &self->z;
    int node = node_number(z, ntext, nlen), found;
    if (node >= 0) {
        uint32_t i = find_slot(z, &k, &found);
        int was_pin = found && !isnan(z->entries[z->index[i] - 1].until);
        if (z->h->pins >= z->h->max_pins && !was_pin) {
            PyErr_Format(ZoneError, "the zone holds %u pins at most", z->h->max_pins);
            node = -1;
        } else {
            if (found) {
                remove_slot(z, i);
                i = find_slot(z, &k, &found);
            }
            insert_at(z, i, &k, (uint16_t)node, now, until);
        }
    }
    zone_unlock(z);
    if (node < 0) return NULL;
    Py_RETURN_NONE;
}

/* The live entries that `keep` selects are removed; their keys (inline bytes) in a list. */
typedef int (*entry_test)(const zone *, const zone_entry *, const void *);

static PyObject *remove_where(Zone *self, entry_test keep, const void *arg, int keys) {
    if (!ready(self)) return NULL;
    PyObject *out = keys ? PyList_New(0) : NULL;
    if (keys && out == NULL) return NULL;
    if (lock_or_raise(self) < 0) {
        Py_XDECREF(out);
        return NULL;
    }
    zone *z = &self->z;
    Py_ssize_t count = 0;
    int failed = 0;
    for (uint32_t e = 0; e < z->h->high; e++) {
        zone_entry *x = &z->entries[e];
        if (!x->live || !keep(z, x, arg)) continue;
        if (keys && !failed) {
            PyObject *key = PyUnicode_DecodeUTF8(x->key, x->key_len < KEY_INLINE ? x->key_len : KEY_INLINE, "replace");
            if (key == NULL || PyList_Append(out, key) < 0) failed = 1;
            Py_XDECREF(key);
        }
        remove_slot(z, slot_of_entry(z, e));
        count++;
    }
    zone_unlock(z);
    if (failed) {
        Py_DECREF(out);
        return NULL;
    }
    return keys ? out : PyLong_FromSsize_t(count);
}

static int of_node(const zone *z, const zone_entry *x, const void *arg) {
    return x->node == *(const int *)arg;
}

static int any_entry(const zone *z, const zone_entry *x, const void *arg) { return 1; }

static int ended(const zone *z, const zone_entry *x, const void *arg) {
    double now = *(const double *)arg;
    return isnan(x->until) ? expired(z, x, now) : x->until <= now;
}

/* evict_node(node_id) -> [key]: TargetCache.evict_target. */
static PyObject *Zone_evict_node(Zone *self, PyObject *node_id) {
    Py_ssize_t nlen;
    const char *ntext = PyUnicode_Check(node_id) ? PyUnicode_AsUTF8AndSize(node_id, &nlen) : NULL;
    if (ntext == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "evict_node(node_id: str)");
        return NULL;
    }
    if (!ready(self)) return NULL;
    int node = -1;
    for (uint32_t i = 0; i < self->z.h->nodes; i++) { /* node ids are only ever added */
        const uint8_t *n = self->z.h->node_ids[i];
        if (n[0] == nlen && memcmp(n + 1, ntext, (size_t)nlen) == 0) node = (int)i;
    }
    if (node < 0) return PyList_New(0);
    return remove_where(self, of_node, &node, 1);
}

static PyObject *Zone_clear(Zone *self, PyObject *unused) { return remove_where(self, any_entry, NULL, 1); }

/* purge_expired(now) -> int: TargetCache.purge_expired. */
static PyObject *Zone_purge_expired(Zone *self, PyObject *arg) {
    double now;
    if (as_time(arg, &now) < 0) return NULL;
    return remove_where(self, ended, &now, 0);
}

/* items() -> [(key, node_id, last access, pinned until | None, whole)]: a snapshot of every entry,
 * expired or not, least recently used first, then the pins; `whole` False for a key cut to its
 * first KEY_INLINE bytes. */
static PyObject *Zone_items(Zone *self, PyObject *unused) {
    if (!ready(self)) return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL || lock_or_raise(self) < 0) {
        Py_XDECREF(out);
        return NULL;
    }
    zone *z = &self->z;
    int failed = 0;
    uint32_t walked = 0;
    for (uint32_t e = z->h->lru_head; e != NIL && !failed && walked <= z->h->capacity; e = z->entries[e].next, walked++) {
        zone_entry *x = &z->entries[e];
        PyObject *row = Py_BuildValue("(s#NdOO)", x->key, (Py_ssize_t)(x->key_len < KEY_INLINE ? x->key_len : KEY_INLINE),
                                      node_text(z, x->node), x->access, Py_None, x->key_len <= KEY_INLINE ? Py_True : Py_False);
        failed = row == NULL || PyList_Append(out, row) < 0;
        Py_XDECREF(row);
    }
    for (uint32_t e = 0; e < z->h->high && !failed; e++) {
        zone_entry *x = &z->entries[e];
        if (!x->live || isnan(x->until)) continue;
        PyObject *row = Py_BuildValue("(s#NddO)", x->key, (Py_ssize_t)(x->key_len < KEY_INLINE ? x->key_len : KEY_INLINE),
                                      node_text(z, x->node), x->access, x->until, x->key_len <= KEY_INLINE ? Py_True : Py_False);
        failed = row == NULL || PyList_Append(out, row) < 0;
        Py_XDECREF(row);
    }
    zone_unlock(z);
    if (failed) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* counts() -> (entries, pins, hits, misses, evictions). */
static PyObject *Zone_counts(Zone *self, PyObject *unused) {
    if (!ready(self) || lock_or_raise(self) < 0) return NULL;
    zone_header *h = self->z.h;
    PyObject *out = Py_BuildValue("(IIKKK)", h->size, h->pins, (unsigned long long)h->hits,
                                  (unsigned long long)h->misses, (unsigned long long)h->evictions);
    zone_unlock(&self->z);
    return out;
}

static int router_index(Zone *self, PyObject *arg, unsigned int *router) {
    long r = PyLong_AsLong(arg);
    if (r == -1 && PyErr_Occurred()) return -1;
    if (r < 0 || (unsigned long)r >= self->z.h->routers) {
        PyErr_Format(PyExc_IndexError, "router index %ld is not in 0..%u", r, self->z.h->routers - 1);
        return -1;
    }
    *router = (unsigned int)r;
    return 0;
}

/* round_robin(router, n) -> index: Artemis's `pos %= n; pick pos; pos += 1` on the router's shared
 * position, whoever calls. */
static PyObject *Zone_round_robin(Zone *self, PyObject *const *args, Py_ssize_t nargs) {
    unsigned int router;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "round_robin(router: int, n: int)");
        return NULL;
    }
    if (!ready(self) || router_index(self, args[0], &router) < 0) return NULL;
    long n = PyLong_AsLong(args[1]);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1) {
        PyErr_Format(PyExc_ValueError, "n must be > 0, got %ld", n);
        return NULL;
    }
    _Atomic int64_t *pos = &self->z.h->rr[router];
    int64_t old = atomic_load(pos), pick;
    do {
        pick = old % n;
    } while (!atomic_compare_exchange_weak(pos, &old, pick + 1));
    return PyLong_FromLongLong(pick);
}

/* set_position(router, position): a router's ROUND_ROBIN position (its random start). */
static PyObject *Zone_set_position(Zone *self, PyObject *const *args, Py_ssize_t nargs) {
    unsigned int router;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_position(router: int, position: int)");
        return NULL;
    }
    if (!ready(self) || router_index(self, args[0], &router) < 0) return NULL;
    long long p = PyLong_AsLongLong(args[1]);
    if (p == -1 && PyErr_Occurred()) return NULL;
    if (p < 0) {
        PyErr_Format(PyExc_ValueError, "a position is >= 0, got %lld", p);
        return NULL;
    }
    atomic_store(&self->z.h->rr[router], (int64_t)p);
    Py_RETURN_NONE;
}

static PyObject *Zone_position(Zone *self, PyObject *arg) {
    unsigned int router;
    if (!ready(self) || router_index(self, arg, &router) < 0) return NULL;
    return PyLong_FromLongLong(atomic_load(&self->z.h->rr[router]));
}

/* publish(bytes) -> sequence: the board's new contents (one writer at a time: the supervisor). */
static PyObject *Zone_publish(Zone *self, PyObject *arg) {
    Py_buffer view;
    if (!ready(self) || PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    if ((size_t)view.len > BOARD_MAX) {
        PyErr_Format(ZoneError, "the board holds %u bytes at most, got %zd", BOARD_MAX, view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    zone_header *h = self->z.h;
    uint64_t seq = atomic_load(&h->board_seq);
    atomic_store(&h->board_seq, seq + 1); /* odd: being written */
    atomic_thread_fence(memory_order_seq_cst);
    memcpy(h->board, view.buf, (size_t)view.len);
    h->board_len = (uint32_t)view.len;
    atomic_thread_fence(memory_order_seq_cst);
    atomic_store(&h->board_seq, seq + 2);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(seq + 2);
}

/* board(after=0) -> (sequence, bytes) | None: the board's contents when its sequence is not
 * `after` (None: unchanged since the caller read it). */
static PyObject *Zone_board(Zone *self, PyObject *const *args, Py_ssize_t nargs) {
    unsigned long long after = 0;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "board(after: int = 0)");
        return NULL;
    }
    if (nargs == 1 && (after = PyLong_AsUnsignedLongLong(args[0])) == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (!ready(self)) return NULL;
    zone_header *h = self->z.h;
    static uint8_t copy[BOARD_MAX]; /* under the GIL */
    for (;;) {
        uint64_t seq = atomic_load(&h->board_seq);
        if (seq == after) Py_RETURN_NONE;
        if (seq & 1) {
            sched_yield();
            continue;
        }
        atomic_thread_fence(memory_order_seq_cst);
        uint32_t len = h->board_len;
        if (len > BOARD_MAX) len = BOARD_MAX;
        memcpy(copy, h->board, len);
        atomic_thread_fence(memory_order_seq_cst);
        if (atomic_load(&h->board_seq) == seq)
            return Py_BuildValue("(Ky#)", (unsigned long long)seq, (const char *)copy, (Py_ssize_t)len);
    }
}

/* hold(): take the cache's lock and keep it (tests: a process that dies holding it). */
static PyObject *Zone_hold(Zone *self, PyObject *unused) {
    if (!ready(self) || lock_or_raise(self) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Zone_fileno(Zone *self, PyObject *unused) {
    if (!ready(self)) return NULL;
    return PyLong_FromLong(self->fd);
}

static PyObject *Zone_settings(Zone *self, PyObject *unused) {
    if (!ready(self)) return NULL;
    zone_header *h = self->z.h;
    return Py_BuildValue("{s:I,s:d,s:I,s:I,s:K}", "max_entries", h->max_entries, "timeout_s", h->timeout_s,
                         "max_pins", h->max_pins, "routers", h->routers, "bytes", (unsigned long long)h->total);
}

static PyMethodDef Zone_methods[] = {
    {"attach", (PyCFunction)Zone_attach, METH_O | METH_CLASS, "attach(fd) -> Zone: map a zone another process made"},
    {"get", (PyCFunction)(void (*)(void))Zone_get, METH_FASTCALL, "get(key, now) -> node id | None"},
    {"fresh", (PyCFunction)(void (*)(void))Zone_fresh, METH_FASTCALL, "fresh(key, now) -> node id | None"},
    {"peek", (PyCFunction)Zone_peek, METH_O, "peek(key) -> (node id, access, until | None) | None"},
    {"touch", (PyCFunction)(void (*)(void))Zone_touch, METH_FASTCALL, "touch(key, now)"},
    {"put", (PyCFunction)(void (*)(void))Zone_put, METH_FASTCALL,
     "put(key, node_id, now) -> evicted key | None; put(key, node_id, now, expected) -> bool"},
    {"pin", (PyCFunction)(void (*)(void))Zone_pin, METH_FASTCALL, "pin(key, node_id, now, until)"},
    {"evict", (PyCFunction)Zone_evict, METH_O, "evict(key) -> bool"},
    {"evict_node", (PyCFunction)Zone_evict_node, METH_O, "evict_node(node_id) -> [key]"},
    {"clear", (PyCFunction)Zone_clear, METH_NOARGS, "clear() -> [key]"},
    {"purge_expired", (PyCFunction)Zone_purge_expired, METH_O, "purge_expired(now) -> int"},
    {"items", (PyCFunction)Zone_items, METH_NOARGS, "items() -> [(key, node_id, access, until, whole)]"},
    {"counts", (PyCFunction)Zone_counts, METH_NOARGS, "counts() -> (entries, pins, hits, misses, evictions)"},
    {"round_robin", (PyCFunction)(void (*)(void))Zone_round_robin, METH_FASTCALL, "round_robin(router, n) -> index"},
    {"set_position", (PyCFunction)(void (*)(void))Zone_set_position, METH_FASTCALL, "set_position(router, position)"},
    {"position", (PyCFunction)Zone_position, METH_O, "position(router) -> int"},
    {"publish", (PyCFunction)Zone_publish, METH_O, "publish(bytes) -> sequence"},
    {"board", (PyCFunction)(void (*)(void))Zone_board, METH_FASTCALL, "board(after=0) -> (sequence, bytes) | None"},
    {"hold", (PyCFunction)Zone_hold, METH_NOARGS, "take the lock and keep it (tests)"},
    {"fileno", (PyCFunction)Zone_fileno, METH_NOARGS, "the zone's memfd"},
    {"settings", (PyCFunction)Zone_settings, METH_NOARGS, "the zone's sizes"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ZoneType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "router.features.workers._zone.Zone",
    .tp_basicsize = sizeof(Zone),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Zone(max_entries, timeout_s=0, *, max_pins=10000, routers=1): a shared zone",
    .tp_new = Zone_tp_new,
    .tp_init = (initproc)Zone_init,
    .tp_dealloc = (destructor)Zone_dealloc,
    .tp_methods = Zone_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "router.features.workers._zone",
    "The workers' shared zone (router/features/workers/zone.py wraps it).", -1, NULL,
};

PyMODINIT_FUNC PyInit__zone(void) {
    if (PyType_Ready(&ZoneType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    ZoneError = PyErr_NewException("router.features.workers._zone.ZoneError", PyExc_RuntimeError, NULL);
    if (ZoneError == NULL || PyModule_AddObjectRef(m, "Zone", (PyObject *)&ZoneType) < 0 ||
        PyModule_AddObjectRef(m, "ZoneError", ZoneError) < 0 ||
        PyModule_AddIntConstant(m, "KEY_INLINE", KEY_INLINE) < 0 ||
        PyModule_AddIntConstant(m, "NODES_MAX", NODES_MAX) < 0 ||
        PyModule_AddIntConstant(m, "ROUTERS_MAX", ROUTERS_MAX) < 0 ||
        PyModule_AddIntConstant(m, "BOARD_MAX", BOARD_MAX) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
