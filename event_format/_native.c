/* The event log's native recorder and its decoder: `event_format._native`.
 *
 * routerd's reporting threads record each decision and close into a ring of encoded records,
 * reading the event's slots directly (no tuple, no marshal; router/features/event_log/recorder.py);
 * the writer process decodes them into Arrow's column layout (or into the values tuples of
 * `event_values`, for JSON lines; event_format/frames.py). What a record holds, field by field, is
 * the program in _native_program.h, generated ahead of time by `python -m tools.generate` from
 * routerd's one field table (router/features/event_log/sources.py), as the Python recorder's code
 * is; this file knows no field by name.
 *
 * A record, little-endian:
 *     u32 length (the whole record) | u8 kind | f64 epoch time | i64 connection number | fields
 * and each field a tag byte and its value:
 *     0 null | 1 string: u32 length, UTF-8 bytes (a lone surrogate as "surrogatepass" writes it) |
 *     2 int: i64 | 3 float: f64 | 4 false | 5 true
 *
 * Threads: every function runs under the interpreter lock and the ring's state changes only where
 * no Python code can run (a `record` first gathers the event's values, which may call Python code
 * such as the raw key's getter, then writes them in one step), so each call is atomic to the
 * reporting threads and the sender thread that share a recorder.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the record format is little-endian; this build writes it by memcpy"
#endif

enum { TAG_NULL = 0, TAG_STR = 1, TAG_INT = 2, TAG_FLOAT = 3, TAG_FALSE = 4, TAG_TRUE = 5 };
#define HEAD_BYTES (4 + 1 + 8 + 8)
#define MAX_FIELDS 32
#define MAX_KINDS 8
#define MAX_CACHED 64
#define MIN_CAPACITY (64 * 1024)
#define RECORD_MAX ((Py_ssize_t)16 << 20) /* well within a frame (frames.FRAME_MAX, 64 MiB) */

/* -- the program ---------------------------------------------------------------------------- */

enum Op {
    OP_STR, OP_OPT_STR, OP_INT, OP_FLOAT, OP_BOOL, OP_ENUM, OP_OPT_ENUM, OP_IS, OP_ADDRESS_HOST,
    OP_KEY_TYPE, OP_RAW_KEY, OP_RAW_KEY_LENGTH, OP_COUNT
};
static const char *const OP_NAMES[OP_COUNT] = {
    "str", "opt_str", "int", "float", "bool", "enum", "opt_enum", "is", "address_host",
    "key_type", "raw_key", "raw_key_length",
};

/* The program as generated (_native_program.h): slots by name, for the types routerd gives. */
typedef struct {
    int op;
    int on_ref;            /* the slot is the connection reference's, not the event's */
    const char *slot;      /* NULL: none (the key type, the raw key's length) */
    const char *slot2;     /* OP_ADDRESS_HOST: the reference's slot used when the event's is None */
    int identity;          /* OP_IS: the index of the object compared with in the identities, else -1 */
} StepSpec;

typedef struct {
    const char *event;     /* the event type's name */
    int kind;
    const char *conn;      /* the event's slot of its connection reference */
    int n;
    const StepSpec *steps;
} ProgramSpec;

#include "_native_program.h"

_Static_assert(PROGRAM_COUNT <= MAX_KINDS, "more event kinds than a recorder holds");

/* The program as the recorder runs it: slots found in the types given. */
typedef struct {
    int op;
    int on_ref;            /* the slot is the connection reference's, not the event's */
    Py_ssize_t offset;     /* the slot */
    Py_ssize_t offset2;    /* OP_ADDRESS_HOST: the reference's slot used when the event's is None */
    PyObject *arg;         /* OP_IS: the object compared with */
} Step;

typedef struct {
    PyTypeObject *type;
    int kind;
    Py_ssize_t conn;       /* the event's slot of its connection reference */
    int raw;               /* the slot of the facts the raw key comes from: index of a step, or -1 */
    int needs_key_type;    /* a step takes the key type or the raw key (the router's key type) */
    int n;
    Step steps[MAX_FIELDS];
} Program;

/* One field's value, gathered before it is written. */
typedef struct {
    int tag;
    const char *text;
    Py_ssize_t size;       /* TAG_STR: bytes */
    long long integer;
    double number;
    PyObject *held;        /* a new reference keeping `text` alive, or NULL */
} Value;

typedef struct {
    PyObject_HEAD
    Program programs[MAX_KINDS];
    int n_programs;
    PyTypeObject *ref_type;
    Py_ssize_t ref_id, ref_router;
    PyObject *key_types;        /* dict: router name -> key type (shared with the event log) */
    PyObject *default_key_type;
    PyObject *raw_of;           /* dict: key type -> the raw key's getter (facts -> str | None) */
    PyObject *clock;            /* () -> epoch seconds */
    Py_ssize_t raw_cap;
    PyObject *enum_members[MAX_CACHED], *enum_values[MAX_CACHED];
    int n_enums;
    PyObject *key_type_members[MAX_CACHED], *key_type_getters[MAX_CACHED], *key_type_values[MAX_CACHED];
    int n_key_types;
    /* the ring: `count` records back to back in buf[start:end] */
    char *buf;
    Py_ssize_t capacity, start, end, count, size;
    long long puts, dropped;
} Recorder;

static PyObject *s_value_;

static int slot_offset(PyTypeObject *type, PyObject *name, Py_ssize_t *out) {
    PyObject *descr = PyDict_GetItemWithError(type->tp_dict, name);
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)
        || ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "%s.%S is not a slot", type->tp_name, name);
        return -1;
    }
    *out = ((PyMemberDescrObject *)descr)->d_member->offset;
    return 0;
}

static int slot_offset_named(PyTypeObject *type, const char *name, Py_ssize_t *out) {
    PyObject *key = PyUnicode_FromString(name);
    if (key == NULL)
        return -1;
    int result = slot_offset(type, key, out);
    Py_DECREF(key);
    return result;
}

static PyObject *read_slot(PyObject *object, Py_ssize_t offset) { /* borrowed */
    PyObject *value = *(PyObject **)((char *)object + offset);
    if (value == NULL)
        PyErr_SetString(PyExc_AttributeError, "an event's slot is not set");
    return value;
}

/* -- gathering an event's values (may run Python code; touches no ring state) ----------------- */

static int cached_enum_value(Recorder *self, PyObject *member, PyObject **out) { /* borrowed */
    for (int i = 0; i < self->n_enums; i++)
        if (self->enum_members[i] == member) {
            *out = self->enum_values[i];
            return 0;
        }
    PyObject *value = PyObject_GetAttr(member, s_value_);
    if (value == NULL)
        return -1;
    for (int i = 0; i < self->n_enums; i++) /* another thread may have cached it meanwhile */
        if (self->enum_members[i] == member) {
            Py_DECREF(value);
            *out = self->enum_values[i];
            return 0;
        }
    if (self->n_enums == MAX_CACHED) {
        PyErr_SetString(PyExc_ValueError, "more enum members than the recorder caches");
        Py_DECREF(value);
        return -1;
    }
    Py_INCREF(member);
    self->enum_members[self->n_enums] = member;
    self->enum_values[self->n_enums] = value;
    self->n_enums++;
    *out = value;
    return 0;
}

static int key_type_of(Recorder *self, PyObject *key_type, PyObject **getter, PyObject **value) {
    for (int i = 0; i < self->n_key_types; i++)
        if (self->key_type_members[i] == key_type) {
            *getter = self->key_type_getters[i];
            *value = self->key_type_values[i];
            return 0;
        }
    PyObject *found = PyObject_GetItem(self->raw_of, key_type);
    if (found == NULL)
        return -1;
    PyObject *name = PyObject_GetAttr(key_type, s_value_);
    if (name == NULL) {
        Py_DECREF(found);
        return -1;
    }
    for (int i = 0; i < self->n_key_types; i++)
        if (self->key_type_members[i] == key_type) {
            Py_DECREF(found);
            Py_DECREF(name);
            *getter = self->key_type_getters[i];
            *value = self->key_type_values[i];
            return 0;
        }
    if (self->n_key_types == MAX_CACHED) {
        PyErr_SetString(PyExc_ValueError, "more key types than the recorder caches");
        Py_DECREF(found);
        Py_DECREF(name);
        return -1;
    }
    Py_INCREF(key_type);
    self->key_type_members[self->n_key_types] = key_type;
    self->key_type_getters[self->n_key_types] = found;
    self->key_type_values[self->n_key_types] = name;
    self->n_key_types++;
    *getter = found;
    *value = name;
    return 0;
}

static int text_value(PyObject *object, int nullable, const char *what, Value *out) {
    if (object == Py_None && nullable) {
        out->tag = TAG_NULL;
        return 0;
    }
    if (!PyUnicode_Check(object)) {
        PyErr_Format(PyExc_TypeError, "%s: a string%s, got %.100s", what, nullable ? " or None" : "",
                     Py_TYPE(object)->tp_name);
        return -1;
    }
    out->tag = TAG_STR;
    out->text = PyUnicode_AsUTF8AndSize(object, &out->size);
    if (out->text != NULL)
        return 0;
    if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
        return -1;
    PyErr_Clear(); /* a lone surrogate: kept as "surrogatepass" writes it (the decoder reads it back) */
    out->held = PyUnicode_AsEncodedString(object, "utf-8", "surrogatepass");
    if (out->held == NULL)
        return -1;
    out->text = PyBytes_AS_STRING(out->held);
    out->size = PyBytes_GET_SIZE(out->held);
    return 0;
}

static int integer_value(PyObject *object, const char *what, Value *out) {
    if (!PyLong_CheckExact(object)) {
        PyErr_Format(PyExc_TypeError, "%s: an int, got %.100s", what, Py_TYPE(object)->tp_name);
        return -1;
    }
    out->tag = TAG_INT;
    out->integer = PyLong_AsLongLong(object);
    return out->integer == -1 && PyErr_Occurred() ? -1 : 0;
}

static const char *const OP_WHAT[OP_COUNT] = {
    "a string field", "a string field", "an int field", "a float field", "a bool field",
    "an enum field", "an enum field", "an identity field", "an address", "the key type",
    "the raw key", "the raw key's length",
};

static int gather(Recorder *self, PyObject *event, Program *program, PyObject *ref, Value *values) {
    PyObject *getter = NULL, *key_type_name = NULL, *raw = NULL;
    if (program->needs_key_type) {
        PyObject *router = read_slot(ref, self->ref_router);
        if (router == NULL)
            return -1;
        if (!PyUnicode_CheckExact(router)) {
            PyErr_SetString(PyExc_TypeError, "a connection's router name is not a string");
            return -1;
        }
        PyObject *key_type = PyDict_GetItemWithError(self->key_types, router);
        if (key_type == NULL) {
            if (PyErr_Occurred())
                return -1;
            key_type = self->default_key_type;
        }
        Py_INCREF(key_type); /* the lookup runs Python code, and a reload may replace the dict's entry */
        int failed = key_type_of(self, key_type, &getter, &key_type_name);
        Py_DECREF(key_type);
        if (failed < 0)
            return -1;
    }
    if (program->raw >= 0) {
        PyObject *facts = read_slot(event, program->steps[program->raw].offset);
        if (facts == NULL)
            return -1;
        raw = facts == Py_None ? Py_NewRef(Py_None) : PyObject_CallOneArg(getter, facts);
        if (raw == NULL)
            return -1;
        if (raw != Py_None && !PyUnicode_Check(raw)) {
            PyErr_Format(PyExc_TypeError, "the raw key: a string or None, got %.100s", Py_TYPE(raw)->tp_name);
            Py_DECREF(raw);
            return -1;
        }
    }
    int failed = 0;
    for (int i = 0; i < program->n && !failed; i++) {
        Step *step = &program->steps[i];
        Value *value = &values[i];
        const char *what = OP_WHAT[step->op];
        PyObject *object = NULL;
        if (step->op != OP_KEY_TYPE && step->op != OP_RAW_KEY && step->op != OP_RAW_KEY_LENGTH) {
            object = read_slot(step->on_ref ? ref : event, step->offset);
            if (object == NULL) {
                failed = 1;
                break;
            }
        }
        switch (step->op) {
        case OP_STR:
        case OP_OPT_STR:
            failed = text_value(object, step->op == OP_OPT_STR, what, value) < 0;
            break;
        case OP_INT:
            failed = integer_value(object, what, value) < 0;
            break;
        case OP_FLOAT:
            if (PyFloat_CheckExact(object) || PyLong_CheckExact(object)) {
                value->tag = TAG_FLOAT;
                value->number = PyFloat_AsDouble(object);
                failed = value->number == -1.0 && PyErr_Occurred();
            } else {
                PyErr_Format(PyExc_TypeError, "%s: a float, got %.100s", what, Py_TYPE(object)->tp_name);
                failed = 1;
            }
            break;
        case OP_BOOL:
            if (object == Py_True || object == Py_False)
                value->tag = object == Py_True ? TAG_TRUE : TAG_FALSE;
            else {
                PyErr_Format(PyExc_TypeError, "%s: a bool, got %.100s", what, Py_TYPE(object)->tp_name);
                failed = 1;
            }
            break;
        case OP_ENUM:
        case OP_OPT_ENUM:
            if (object == Py_None && step->op == OP_OPT_ENUM)
                value->tag = TAG_NULL;
            else {
                PyObject *name;
                failed = cached_enum_value(self, object, &name) < 0 || text_value(name, 0, what, value) < 0;
            }
            break;
        case OP_IS:
            value->tag = object == step->arg ? TAG_TRUE : TAG_FALSE;
            break;
        case OP_ADDRESS_HOST:
            if (object == Py_None) {
                object = read_slot(ref, step->offset2);
                if (object == NULL) {
                    failed = 1;
                    break;
                }
            }
            if (!PyTuple_Check(object) || PyTuple_GET_SIZE(object) < 1) {
                PyErr_Format(PyExc_TypeError, "%s: a (host, port) tuple, got %.100s", what, Py_TYPE(object)->tp_name);
                failed = 1;
            } else
                failed = text_value(PyTuple_GET_ITEM(object, 0), 0, what, value) < 0;
            break;
        case OP_KEY_TYPE:
            failed = text_value(key_type_name, 0, what, value) < 0;
            break;
        case OP_RAW_KEY:
            if (raw == Py_None)
                value->tag = TAG_NULL;
            else if (PyUnicode_GET_LENGTH(raw) <= self->raw_cap)
                failed = text_value(raw, 0, what, value) < 0;
            else {
                PyObject *cut = PyUnicode_Substring(raw, 0, self->raw_cap);
                if (cut == NULL) {
                    failed = 1;
                    break;
                }
                failed = text_value(cut, 0, what, value) < 0;
                if (value->held == NULL && !failed)
                    value->held = cut; /* keeps the UTF-8 it caches alive */
                else
                    Py_DECREF(cut);
            }
            break;
        case OP_RAW_KEY_LENGTH:
            value->tag = TAG_INT;
            value->integer = raw == Py_None ? 0 : (long long)PyUnicode_GET_LENGTH(raw);
            break;
        }
    }
    if (raw != NULL && !failed) {
        /* a raw key's UTF-8 is cached in the string: the string must outlive the write */
        for (int i = 0; i < program->n; i++)
            if (program->steps[i].op == OP_RAW_KEY && values[i].tag == TAG_STR && values[i].held == NULL) {
                values[i].held = raw;
                raw = NULL;
                break;
            }
    }
    Py_XDECREF(raw);
    return failed ? -1 : 0;
}

/* -- the ring (no Python code runs here) ----------------------------------------------------- */

static int reserve(Recorder *self, Py_ssize_t need) {
    if (self->end + need <= self->capacity)
        return 0;
    Py_ssize_t live = self->end - self->start;
    if (self->start >= live && live + need <= self->capacity) { /* moving frees more than it moves */
        memmove(self->buf, self->buf + self->start, live);
        self->start = 0;
        self->end = live;
        return 0;
    }
    Py_ssize_t capacity = self->capacity < MIN_CAPACITY ? MIN_CAPACITY : self->capacity;
    while (capacity < live + need)
        capacity *= 2;
    char *buf = PyMem_RawMalloc(capacity);
    if (buf == NULL)
        return -1;
    if (live)
        memcpy(buf, self->buf + self->start, live);
    PyMem_RawFree(self->buf);
    self->buf = buf;
    self->capacity = capacity;
    self->start = 0;
    self->end = live;
    return 0;
}

static uint32_t length_at(const char *p) {
    uint32_t n;
    memcpy(&n, p, 4);
    return n;
}

static void drop_oldest(Recorder *self) {
    self->start += length_at(self->buf + self->start);
    self->count--;
    self->dropped++;
}

static void emptied(Recorder *self) {
    if (self->count == 0) {
        self->start = self->end = 0;
        if (self->capacity > 16 * MIN_CAPACITY) { /* a burst is over: give the memory back */
            PyMem_RawFree(self->buf);
            self->buf = NULL;
            self->capacity = 0;
        }
    }
}

static int write_record(Recorder *self, int kind, double when, long long conn, const Value *values, int n) {
    Py_ssize_t size = HEAD_BYTES;
    for (int i = 0; i < n; i++)
        size += 1 + (values[i].tag == TAG_STR ? 4 + values[i].size
                     : values[i].tag == TAG_INT || values[i].tag == TAG_FLOAT ? 8 : 0);
    if (size > RECORD_MAX) {
        PyErr_Format(PyExc_ValueError, "an event of %zd bytes (at most %zd)", size, RECORD_MAX);
        return -1;
    }
    if (reserve(self, size) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    char *p = self->buf + self->end;
    uint32_t length = (uint32_t)size;
    uint8_t k = (uint8_t)kind;
    memcpy(p, &length, 4);
    memcpy(p + 4, &k, 1);
    memcpy(p + 5, &when, 8);
    memcpy(p + 13, &conn, 8);
    p += HEAD_BYTES;
    for (int i = 0; i < n; i++) {
        const Value *v = &values[i];
        *p++ = (char)v->tag;
        if (v->tag == TAG_STR) {
            uint32_t bytes = (uint32_t)v->size;
            memcpy(p, &bytes, 4);
            memcpy(p + 4, v->text, v->size);
            p += 4 + v->size;
        } else if (v->tag == TAG_INT) {
            memcpy(p, &v->integer, 8);
            p += 8;
        } else if (v->tag == TAG_FLOAT) {
            memcpy(p, &v->number, 8);
            p += 8;
        }
    }
    self->end += size;
    self->count++;
    self->puts++;
    if (self->count - 1 >= self->size) /* full (or over a smaller size): the oldest goes */
        drop_oldest(self);
    return 0;
}

/* -- the Recorder type ---------------------------------------------------------------------- */

static PyObject *Recorder_record(Recorder *self, PyObject *event) {
    Program *program = NULL;
    for (int i = 0; i < self->n_programs; i++)
        if (Py_TYPE(event) == self->programs[i].type) {
            program = &self->programs[i];
            break;
        }
    if (program == NULL)
        return PyLong_FromLong(-1);
    PyObject *ref = read_slot(event, program->conn);
    if (ref == NULL)
        return NULL;
    if (Py_TYPE(ref) != self->ref_type) {
        PyErr_Format(PyExc_TypeError, "an event's connection: a %s, got %.100s", self->ref_type->tp_name,
                     Py_TYPE(ref)->tp_name);
        return NULL;
    }
    Py_INCREF(event); /* the clock and the raw key's getter are Python code */
    Py_INCREF(ref);
    Value values[MAX_FIELDS];
    memset(values, 0, sizeof(values));
    PyObject *result = NULL;
    Value conn = {0};
    PyObject *now = PyObject_CallNoArgs(self->clock);
    double when = 0.0;
    if (now != NULL) {
        when = PyFloat_AsDouble(now);
        Py_DECREF(now);
    }
    if (now != NULL && !(when == -1.0 && PyErr_Occurred())) {
        PyObject *id = read_slot(ref, self->ref_id);
        if (id != NULL && integer_value(id, "a connection's number", &conn) == 0
            && gather(self, event, program, ref, values) == 0
            && write_record(self, program->kind, when, conn.integer, values, program->n) == 0)
            result = PyLong_FromSsize_t(self->count);
    }
    for (int i = 0; i < program->n; i++)
        Py_XDECREF(values[i].held);
    Py_DECREF(ref);
    Py_DECREF(event);
    return result;
}

static PyObject *Recorder_take(Recorder *self, PyObject *args) {
    Py_ssize_t most, max_bytes;
    if (!PyArg_ParseTuple(args, "nn", &most, &max_bytes))
        return NULL;
    Py_ssize_t limit = most < self->count ? (most < 0 ? 0 : most) : self->count, n = 0;
    long long first = self->puts - self->count;
    Py_ssize_t span = 0;
    for (; n < limit; n++) { /* at least one record: none is longer than RECORD_MAX */
        uint32_t length = length_at(self->buf + self->start + span);
        if (n > 0 && span + length > max_bytes)
            break;
        span += length;
    }
    PyObject *data = PyBytes_FromStringAndSize(n ? self->buf + self->start : "", span);
    if (data == NULL)
        return NULL;
    self->start += span;
    self->count -= n;
    emptied(self);
    return Py_BuildValue("(LnN)", first, n, data);
}

static PyObject *Recorder_resize(Recorder *self, PyObject *arg) {
    Py_ssize_t size = PyLong_AsSsize_t(arg);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (size < 1) {
        PyErr_Format(PyExc_ValueError, "a ring size is at least 1, got %zd", size);
        return NULL;
    }
    self->size = size;
    Py_RETURN_NONE;
}

static Py_ssize_t Recorder_len(Recorder *self) { return self->count; }

static int setup_program(Recorder *self, Program *program, const ProgramSpec *spec, PyObject *type,
                         PyObject *identities) {
    if (!PyType_Check(type)) {
        PyErr_Format(PyExc_TypeError, "event_types: types, got %.100s", Py_TYPE(type)->tp_name);
        return -1;
    }
    if (strcmp(((PyTypeObject *)type)->tp_name, spec->event) != 0) {
        PyErr_Format(PyExc_ValueError, "the recorder's program %d is for %s events, got %s", spec->kind, spec->event,
                     ((PyTypeObject *)type)->tp_name);
        return -1;
    }
    program->type = (PyTypeObject *)Py_NewRef(type);
    program->kind = spec->kind;
    program->raw = -1;
    if (spec->kind < 0 || spec->kind > 255 || spec->n > MAX_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "a kind is 0-255 and has at most 32 fields");
        return -1;
    }
    if (slot_offset_named(program->type, spec->conn, &program->conn) < 0)
        return -1;
    program->n = spec->n;
    for (int i = 0; i < program->n; i++) {
        Step *step = &program->steps[i];
        const StepSpec *s = &spec->steps[i];
        const char *op = s->op >= 0 && s->op < OP_COUNT ? OP_NAMES[s->op] : "?";
        step->op = s->op;
        step->on_ref = s->on_ref;
        int slotless = step->op == OP_KEY_TYPE || step->op == OP_RAW_KEY_LENGTH;
        if (s->op < 0 || s->op >= OP_COUNT || (s->slot == NULL) != slotless
            || (s->slot2 == NULL) != (step->op != OP_ADDRESS_HOST) || (s->identity >= 0) != (step->op == OP_IS)
            || s->identity >= IDENTITY_COUNT || (step->op == OP_RAW_KEY && (step->on_ref || program->raw >= 0))) {
            PyErr_Format(PyExc_ValueError, "recorder step %d (%s): a slot for every step but key_type and "
                         "raw_key_length, a second for address_host, an identity for is, one raw_key of the event",
                         i, op);
            return -1;
        }
        PyTypeObject *holder = step->on_ref ? self->ref_type : program->type;
        if (!slotless && slot_offset_named(holder, s->slot, &step->offset) < 0)
            return -1;
        if (s->slot2 != NULL && slot_offset_named(self->ref_type, s->slot2, &step->offset2) < 0)
            return -1;
        if (s->identity >= 0)
            step->arg = Py_NewRef(PyTuple_GET_ITEM(identities, s->identity));
        if (step->op == OP_RAW_KEY)
            program->raw = i;
        program->needs_key_type |= slotless || step->op == OP_RAW_KEY;
    }
    for (int i = 0; i < program->n; i++)
        if (program->steps[i].op == OP_RAW_KEY_LENGTH && program->raw < 0) {
            PyErr_SetString(PyExc_ValueError, "a raw_key_length step needs a raw_key step");
            return -1;
        }
    return 0;
}

static int Recorder_init(Recorder *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"size", "event_types", "identities", "ref_type", "key_types", "default_key_type",
                            "raw_of", "clock", NULL};
    Py_ssize_t size;
    PyObject *event_types, *identities, *ref_type, *key_types, *default_key_type, *raw_of, *clock;
    if (self->ref_type != NULL) {
        PyErr_SetString(PyExc_TypeError, "a recorder is set up once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nO!O!O!O!OOO", names, &size, &PyTuple_Type, &event_types,
                                     &PyTuple_Type, &identities, &PyType_Type, &ref_type, &PyDict_Type, &key_types,
                                     &default_key_type, &raw_of, &clock))
        return -1;
    if (size < 1) {
        PyErr_Format(PyExc_ValueError, "a ring size is at least 1, got %zd", size);
        return -1;
    }
    if (PyTuple_GET_SIZE(event_types) != PROGRAM_COUNT) {
        PyErr_Format(PyExc_ValueError, "the recorder's program is for %d event types, got %zd", PROGRAM_COUNT,
                     PyTuple_GET_SIZE(event_types));
        return -1;
    }
    if (PyTuple_GET_SIZE(identities) != IDENTITY_COUNT) {
        PyErr_Format(PyExc_ValueError, "the recorder's program compares with %d identities, got %zd",
                     IDENTITY_COUNT, PyTuple_GET_SIZE(identities));
        return -1;
    }
    for (Py_ssize_t i = 0; i < IDENTITY_COUNT; i++)
        if (strcmp(Py_TYPE(PyTuple_GET_ITEM(identities, i))->tp_name, IDENTITY_TYPES[i]) != 0) {
            PyErr_Format(PyExc_ValueError, "identity %zd: a %s, got %.100s", i, IDENTITY_TYPES[i],
                         Py_TYPE(PyTuple_GET_ITEM(identities, i))->tp_name);
            return -1;
        }
    self->size = size;
    self->raw_cap = RAW_KEY_CAP;
    self->ref_type = (PyTypeObject *)Py_NewRef(ref_type);
    self->key_types = Py_NewRef(key_types);
    self->default_key_type = Py_NewRef(default_key_type);
    self->raw_of = Py_NewRef(raw_of);
    self->clock = Py_NewRef(clock);
    if (slot_offset_named(self->ref_type, REF_ID_SLOT, &self->ref_id) < 0
        || slot_offset_named(self->ref_type, REF_ROUTER_SLOT, &self->ref_router) < 0)
        return -1;
    for (int i = 0; i < PROGRAM_COUNT; i++) {
        self->n_programs = i + 1; /* so that dealloc releases what this one holds */
        if (setup_program(self, &self->programs[i], &PROGRAM_SPECS[i], PyTuple_GET_ITEM(event_types, i), identities)
            < 0)
            return -1;
    }
    return 0;
}

static void Recorder_dealloc(Recorder *self) {
    for (int i = 0; i < self->n_programs; i++) {
        Py_XDECREF(self->programs[i].type);
        for (int s = 0; s < self->programs[i].n; s++)
            Py_XDECREF(self->programs[i].steps[s].arg);
    }
    Py_XDECREF(self->ref_type);
    Py_XDECREF(self->key_types);
    Py_XDECREF(self->default_key_type);
    Py_XDECREF(self->raw_of);
    Py_XDECREF(self->clock);
    for (int i = 0; i < self->n_enums; i++) {
        Py_DECREF(self->enum_members[i]);
        Py_DECREF(self->enum_values[i]);
    }
    for (int i = 0; i < self->n_key_types; i++) {
        Py_DECREF(self->key_type_members[i]);
        Py_DECREF(self->key_type_getters[i]);
        Py_DECREF(self->key_type_values[i]);
    }
    PyMem_RawFree(self->buf);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Recorder_get_size(Recorder *self, void *closure) { return PyLong_FromSsize_t(self->size); }
static PyObject *Recorder_get_puts(Recorder *self, void *closure) { return PyLong_FromLongLong(self->puts); }
static PyObject *Recorder_get_dropped(Recorder *self, void *closure) { return PyLong_FromLongLong(self->dropped); }
static PyObject *Recorder_get_held_bytes(Recorder *self, void *closure) {
    return PyLong_FromSsize_t(self->capacity);
}

static PyMethodDef Recorder_methods[] = {
    {"record", (PyCFunction)Recorder_record, METH_O,
     "record(event) -> int: put a logged event's record into the ring (the oldest goes when full): how many the "
     "ring holds; -1 for an event that is not logged. Raises TypeError/ValueError for a value of the wrong type "
     "(nothing is put)."},
    {"take", (PyCFunction)Recorder_take, METH_VARARGS,
     "take(most, max_bytes) -> (first number, count, records): up to `most` of the oldest records, removed, "
     "in at most `max_bytes` (at least one record)."},
    {"resize", (PyCFunction)Recorder_resize, METH_O, "resize(size): the ring size (>= 1), as Ring.resize."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Recorder_getset[] = {
    {"size", (getter)Recorder_get_size, NULL, "The ring size in force.", NULL},
    {"puts", (getter)Recorder_get_puts, NULL, "Events recorded, dropped ones included.", NULL},
    {"dropped", (getter)Recorder_get_dropped, NULL, "Events dropped by a full ring.", NULL},
    {"held_bytes", (getter)Recorder_get_held_bytes, NULL, "The ring's buffer, in bytes.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Recorder_sequence = {.sq_length = (lenfunc)Recorder_len};

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "event_format._native.Recorder",
    .tp_basicsize = sizeof(Recorder),
    .tp_dealloc = (destructor)Recorder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A ring of encoded event records (see router/features/event_log/recorder.py).",
    .tp_methods = Recorder_methods,
    .tp_getset = Recorder_getset,
    .tp_as_sequence = &Recorder_sequence,
    .tp_init = (initproc)Recorder_init,
    .tp_new = PyType_GenericNew,
};

/* -- decoding (the writer process) ---------------------------------------------------------- */

typedef struct {
    const char *data;
    Py_ssize_t size, pos;
    Py_ssize_t record;   /* the index of the record read, for messages */
} Reader;

static int broken(Reader *r, const char *why) {
    PyErr_Format(PyExc_ValueError, "event record %zd (byte %zd): %s", r->record, r->pos, why);
    return -1;
}

typedef struct {
    int kind;
    double when;
    long long conn;
    Py_ssize_t end;
} Head;

static int read_head(Reader *r, int kinds, Head *head) {
    if (r->size - r->pos < HEAD_BYTES)
        return broken(r, "cut short");
    uint32_t length = length_at(r->data + r->pos);
    if (length < HEAD_BYTES || length > r->size - r->pos)
        return broken(r, "a record length out of range");
    head->end = r->pos + length;
    head->kind = (uint8_t)r->data[r->pos + 4];
    if (head->kind >= kinds)
        return broken(r, "no such kind");
    memcpy(&head->when, r->data + r->pos + 5, 8);
    memcpy(&head->conn, r->data + r->pos + 13, 8);
    r->pos += HEAD_BYTES;
    return 0;
}

/* One field: its tag, and where its value is. */
static int read_field(Reader *r, Py_ssize_t end, int *tag, const char **text, Py_ssize_t *size) {
    if (r->pos >= end)
        return broken(r, "fewer fields than the kind has");
    *tag = (uint8_t)r->data[r->pos++];
    *text = r->data + r->pos;
    switch (*tag) {
    case TAG_NULL:
    case TAG_FALSE:
    case TAG_TRUE:
        *size = 0;
        return 0;
    case TAG_INT:
    case TAG_FLOAT:
        *size = 8;
        break;
    case TAG_STR:
        if (end - r->pos < 4)
            return broken(r, "a string's length cut short");
        *size = length_at(r->data + r->pos);
        r->pos += 4;
        *text = r->data + r->pos;
        break;
    default:
        return broken(r, "no such field tag");
    }
    if (end - r->pos < *size)
        return broken(r, "a field runs past its record");
    r->pos += *size;
    return 0;
}

static int parse_types(PyObject *types, const char **codes, Py_ssize_t *counts) {
    if (!PyTuple_Check(types) || PyTuple_GET_SIZE(types) < 1 || PyTuple_GET_SIZE(types) > MAX_KINDS) {
        PyErr_SetString(PyExc_TypeError, "types: a tuple of 1-8 bytes, one per kind");
        return -1;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(types); k++) {
        PyObject *code = PyTuple_GET_ITEM(types, k);
        if (!PyBytes_Check(code) || PyBytes_GET_SIZE(code) > MAX_FIELDS) {
            PyErr_SetString(PyExc_TypeError, "types: bytes of at most 32 column codes per kind");
            return -1;
        }
        codes[k] = PyBytes_AS_STRING(code);
        counts[k] = PyBytes_GET_SIZE(code);
        for (Py_ssize_t f = 0; f < counts[k]; f++)
            if (!strchr("sqdb", codes[k][f]) || codes[k][f] == 0) {
                PyErr_SetString(PyExc_ValueError, "types: column codes are s, q, d, b");
                return -1;
            }
    }
    return 0;
}

static PyObject *field_object(int tag, const char *text, Py_ssize_t size) {
    long long integer;
    double number;
    switch (tag) {
    case TAG_NULL:
        Py_RETURN_NONE;
    case TAG_FALSE:
        Py_RETURN_FALSE;
    case TAG_TRUE:
        Py_RETURN_TRUE;
    case TAG_INT:
        memcpy(&integer, text, 8);
        return PyLong_FromLongLong(integer);
    case TAG_FLOAT:
        memcpy(&number, text, 8);
        return PyFloat_FromDouble(number);
    default:
        return PyUnicode_DecodeUTF8(text, size, "surrogatepass");
    }
}

static int tag_fits(int tag, char code) {
    switch (code) {
    case 's':
        return tag == TAG_STR || tag == TAG_NULL;
    case 'q':
        return tag == TAG_INT || tag == TAG_NULL;
    case 'd':
        return tag == TAG_FLOAT || tag == TAG_NULL;
    default:
        return tag == TAG_TRUE || tag == TAG_FALSE || tag == TAG_NULL;
    }
}

/* A frame's numbers: `count` events from `first`, all of them an int64 >= 0. */
static int check_numbers(long long first, Py_ssize_t count) {
    if (first < 0 || count < 0 || first > LLONG_MAX - count) {
        PyErr_Format(PyExc_ValueError, "a frame of %zd events from number %lld", count, first);
        return -1;
    }
    return 0;
}

static PyObject *decode_rows(PyObject *module, PyObject *args) {
    long long first;
    Py_ssize_t count;
    Py_buffer data;
    PyObject *types;
    const char *codes[MAX_KINDS];
    Py_ssize_t counts[MAX_KINDS];
    if (!PyArg_ParseTuple(args, "Lny*O", &first, &count, &data, &types))
        return NULL;
    PyObject *rows = NULL;
    if (parse_types(types, codes, counts) < 0 || check_numbers(first, count) < 0 || (rows = PyList_New(0)) == NULL)
        goto done;
    Reader r = {data.buf, data.len, 0, 0};
    for (; r.pos < r.size; r.record++) {
        Head head;
        if (read_head(&r, (int)PyTuple_GET_SIZE(types), &head) < 0)
            goto fail;
        Py_ssize_t n = counts[head.kind];
        PyObject *values = PyTuple_New(3 + n);
        if (values == NULL)
            goto fail;
        PyObject *kind = PyLong_FromLong(head.kind), *when = PyFloat_FromDouble(head.when),
                 *conn = PyLong_FromLongLong(head.conn);
        PyTuple_SET_ITEM(values, 0, kind);
        PyTuple_SET_ITEM(values, 1, when);
        PyTuple_SET_ITEM(values, 2, conn);
        if (kind == NULL || when == NULL || conn == NULL) {
            Py_DECREF(values);
            goto fail;
        }
        for (Py_ssize_t f = 0; f < n; f++) {
            int tag;
            const char *text;
            Py_ssize_t size;
            PyObject *value;
            if (read_field(&r, head.end, &tag, &text, &size) < 0
                || (!tag_fits(tag, codes[head.kind][f]) && broken(&r, "a field of another type") < 0)
                || (value = field_object(tag, text, size)) == NULL) {
                Py_DECREF(values);
                goto fail;
            }
            PyTuple_SET_ITEM(values, 3 + f, value);
        }
        if (r.pos != head.end) {
            Py_DECREF(values);
            broken(&r, "more fields than the kind has");
            goto fail;
        }
        PyObject *row = Py_BuildValue("(LN)", first + (long long)r.record, values);
        if (row == NULL || PyList_Append(rows, row) < 0) {
            Py_XDECREF(row);
            goto fail;
        }
        Py_DECREF(row);
    }
    if (r.record != count) {
        PyErr_Format(PyExc_ValueError, "a frame of %zd event records says it has %zd", r.record, count);
        goto fail;
    }
    goto done;
fail:
    Py_CLEAR(rows);
done:
    PyBuffer_Release(&data);
    return rows;
}

/* Columns are decoded in two walks over the records: the first checks every record and counts
 * the rows and string bytes of each column, the second writes the values into bytes objects of
 * exactly that size (no buffer grows, nothing is copied again). */

typedef struct {
    PyObject *validity, *offsets, *values;
    Py_ssize_t text;   /* string bytes: counted by the first walk, written so far by the second */
    Py_ssize_t nulls;
} Column;

typedef struct {
    Py_ssize_t rows, row;
    PyObject *numbers, *whens, *conns;
    Column columns[MAX_FIELDS];
} KindColumns;

static char *at(PyObject *bytes) { return PyBytes_AS_STRING(bytes); }

static PyObject *zeroed(Py_ssize_t size) {
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, size);
    if (bytes != NULL)
        memset(PyBytes_AS_STRING(bytes), 0, size);
    return bytes;
}

static void set_bit(PyObject *bits, Py_ssize_t index) { at(bits)[index / 8] |= (char)(1 << (index % 8)); }

static int fill_field(Column *c, char code, Py_ssize_t row, int tag, const char *text, Py_ssize_t size) {
    if (!tag_fits(tag, code) || (tag == TAG_STR && c->text + size > PyBytes_GET_SIZE(c->values))) {
        PyErr_SetString(PyExc_ValueError, "event records changed while they were decoded");
        return -1;
    }
    if (tag == TAG_NULL)
        c->nulls++;
    else
        set_bit(c->validity, row);
    if (code == 's') {
        if (tag == TAG_STR) {
            memcpy(at(c->values) + c->text, text, size);
            c->text += size;
        }
        int32_t offset = (int32_t)c->text;
        memcpy(at(c->offsets) + 4 * (row + 1), &offset, 4);
    } else if (code == 'b') {
        if (tag == TAG_TRUE)
            set_bit(c->values, row);
    } else if (tag == TAG_NULL)
        memset(at(c->values) + 8 * row, 0, 8);
    else
        memcpy(at(c->values) + 8 * row, text, 8);
    return 0;
}

/* One walk over every record of every frame: checking and counting (`fill` 0), or writing. */
typedef struct {
    long long first;
    Py_ssize_t count;
    Py_buffer data;
} Frame;

static int walk(const Frame *frames, Py_ssize_t n, int kinds, const char **codes, const Py_ssize_t *counts,
                KindColumns *all, int fill) {
    for (Py_ssize_t i = 0; i < n; i++) {
        long long first = frames[i].first;
        Py_ssize_t count = frames[i].count;
        Reader r = {frames[i].data.buf, frames[i].data.len, 0, 0};
        int failed = 0;
        for (; r.pos < r.size && !failed; r.record++) {
            Head head;
            if (read_head(&r, kinds, &head) < 0) {
                failed = 1;
                break;
            }
            KindColumns *kc = &all[head.kind];
            Py_ssize_t row = kc->row++;
            if (fill && row >= kc->rows) {
                PyErr_SetString(PyExc_ValueError, "event records changed while they were decoded");
                failed = 1;
                break;
            }
            if (fill) {
                long long number = first + (long long)r.record;
                memcpy(at(kc->numbers) + 8 * row, &number, 8);
                memcpy(at(kc->whens) + 8 * row, &head.when, 8);
                memcpy(at(kc->conns) + 8 * row, &head.conn, 8);
            }
            for (Py_ssize_t f = 0; f < counts[head.kind] && !failed; f++) {
                int tag;
                const char *text;
                Py_ssize_t size;
                Column *c = &kc->columns[f];
                if (read_field(&r, head.end, &tag, &text, &size) < 0)
                    failed = 1;
                else if (fill)
                    failed = fill_field(c, codes[head.kind][f], row, tag, text, size) < 0;
                else if (!tag_fits(tag, codes[head.kind][f]))
                    failed = broken(&r, "a field of another type") < 0;
                else if ((c->text += size * (tag == TAG_STR)) > INT32_MAX) {
                    PyErr_SetString(PyExc_ValueError, "more than 2 GB of strings in one column");
                    failed = 1;
                }
            }
            if (!failed && r.pos != head.end)
                failed = broken(&r, "more fields than the kind has") < 0;
        }
        if (!failed && r.record != count) {
            PyErr_Format(PyExc_ValueError, "a frame of %zd event records says it has %zd", r.record, count);
            failed = 1;
        }
        if (failed)
            return -1;
    }
    return 0;
}

/* The bytes objects of one kind's columns, sized by the first walk. */
static int allocate(KindColumns *kc, const char *codes, Py_ssize_t n) {
    Py_ssize_t rows = kc->rows, bits = (rows + 7) / 8;
    if ((kc->numbers = PyBytes_FromStringAndSize(NULL, 8 * rows)) == NULL
        || (kc->whens = PyBytes_FromStringAndSize(NULL, 8 * rows)) == NULL
        || (kc->conns = PyBytes_FromStringAndSize(NULL, 8 * rows)) == NULL)
        return -1;
    for (Py_ssize_t f = 0; f < n; f++) {
        Column *c = &kc->columns[f];
        if ((c->validity = zeroed(bits)) == NULL)
            return -1;
        if (codes[f] == 's') {
            c->values = PyBytes_FromStringAndSize(NULL, c->text);
            c->offsets = zeroed(4 * (rows + 1)); /* offsets[0] = 0 */
            if (c->offsets == NULL)
                return -1;
        } else
            c->values = codes[f] == 'b' ? zeroed(bits) : PyBytes_FromStringAndSize(NULL, 8 * rows);
        if (c->values == NULL)
            return -1;
        c->text = 0;
    }
    return 0;
}

static PyObject *kind_result(KindColumns *kc, const char *codes, Py_ssize_t n) {
    PyObject *fields = PyList_New(n);
    if (fields == NULL)
        return NULL;
    for (Py_ssize_t f = 0; f < n; f++) {
        Column *c = &kc->columns[f];
        PyObject *field = PyTuple_Pack(3, c->nulls ? c->validity : Py_None, c->offsets ? c->offsets : Py_None,
                                       c->values);
        if (field == NULL) {
            Py_DECREF(fields);
            return NULL;
        }
        PyList_SET_ITEM(fields, f, field);
    }
    return Py_BuildValue("(nOOON)", kc->rows, kc->numbers, kc->whens, kc->conns, fields);
}

static PyObject *decode_columns(PyObject *module, PyObject *args) {
    PyObject *frames, *types;
    const char *codes[MAX_KINDS];
    Py_ssize_t counts[MAX_KINDS];
    if (!PyArg_ParseTuple(args, "O!O", &PyList_Type, &frames, &types) || parse_types(types, codes, counts) < 0)
        return NULL;
    /* Every frame parsed once, from a tuple of them that holds each one, before anything is read:
     * the walks run no Python code, so nothing can change what they read between them. */
    PyObject *held = PySequence_Tuple(frames);
    if (held == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(held), parsed = 0;
    int kinds = (int)PyTuple_GET_SIZE(types);
    KindColumns *all = PyMem_RawCalloc(kinds, sizeof(KindColumns));
    Frame *parts = PyMem_RawCalloc(n ? n : 1, sizeof(Frame));
    PyObject *result = NULL;
    if (all == NULL || parts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; parsed < n; parsed++) {
        Frame *f = &parts[parsed];
        PyObject *item = PyTuple_GET_ITEM(held, parsed);
        if (!PyTuple_Check(item)) { /* else getargs says SystemError */
            PyErr_Format(PyExc_TypeError, "columns: frame %zd must be a (first, count, records) tuple, got %.100s",
                         parsed, Py_TYPE(item)->tp_name);
            goto done;
        }
        if (!PyArg_ParseTuple(item, "Lny*", &f->first, &f->count, &f->data))
            goto done;
        if (check_numbers(f->first, f->count) < 0) {
            parsed++; /* its buffer is held: released below */
            goto done;
        }
    }
    if (walk(parts, n, kinds, codes, counts, all, 0) < 0)
        goto done;
    for (int k = 0; k < kinds; k++) {
        all[k].rows = all[k].row;
        all[k].row = 0;
        if (all[k].rows && allocate(&all[k], codes[k], counts[k]) < 0)
            goto done;
    }
    if (walk(parts, n, kinds, codes, counts, all, 1) < 0)
        goto done;
    for (int k = 0; k < kinds; k++) /* the second walk wrote every row and byte the first counted */
        for (Py_ssize_t f = 0; f < counts[k] && all[k].rows; f++)
            if (all[k].row != all[k].rows
                || (codes[k][f] == 's' && all[k].columns[f].text != PyBytes_GET_SIZE(all[k].columns[f].values))) {
                PyErr_SetString(PyExc_ValueError, "event records changed while they were decoded");
                goto done;
            }
    if ((result = PyTuple_New(kinds)) == NULL)
        goto done;
    for (int k = 0; k < kinds; k++) {
        PyObject *one = all[k].rows ? kind_result(&all[k], codes[k], counts[k]) : Py_NewRef(Py_None);
        if (one == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyTuple_SET_ITEM(result, k, one);
    }
done:
    for (Py_ssize_t i = 0; i < parsed; i++)
        PyBuffer_Release(&parts[i].data);
    PyMem_RawFree(parts);
    Py_DECREF(held);
    for (int k = 0; all != NULL && k < kinds; k++) {
        Py_XDECREF(all[k].numbers);
        Py_XDECREF(all[k].whens);
        Py_XDECREF(all[k].conns);
        for (int f = 0; f < MAX_FIELDS; f++) {
            Py_XDECREF(all[k].columns[f].validity);
            Py_XDECREF(all[k].columns[f].offsets);
            Py_XDECREF(all[k].columns[f].values);
        }
    }
    PyMem_RawFree(all);
    return result;
}

static PyMethodDef module_methods[] = {
    {"rows", decode_rows, METH_VARARGS,
     "rows(first, count, records, types) -> [(number, values)]: the records as event_values tuples. "
     "Raises ValueError on a broken record."},
    {"columns", decode_columns, METH_VARARGS,
     "columns([(first, count, records)], types) -> per kind None or (rows, numbers, whens, conns, "
     "[(validity | None, offsets | None, values)]): Arrow buffers. Raises ValueError on a broken record."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "event_format._native",
    "The event log's native recorder and decoder (event_format/frames.py).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    s_value_ = PyUnicode_InternFromString("_value_");
    if (s_value_ == NULL || PyType_Ready(&RecorderType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "Recorder", (PyObject *)&RecorderType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
