/* The per-connection INFO lines of `router.conn`, formatted in C into a buffer
 * (router/conn_lines.py installs it; its Python `ConnLines` is the reference, with the same text).
 *
 * A line is routerd's log format, `%(asctime)s %(levelname)s %(name)s: %(message)s`: the local time
 * to the second (cached per second, as `Formatter.formatTime` would print it) with its
 * milliseconds, `INFO router.conn: `, then the message. The two lines every proxied connection
 * writes (`outcome=OK` and `closed`) are formatted here from their fields, client-chosen values
 * through `shown` (router/logs.py's rule, ported: a fuzz test compares both); any other INFO line
 * comes as its message. Lines pile up in one growing buffer; each call answers whether it holds
 * `flush_bytes` or more, and the caller then takes them (`take`) and writes them with one write.
 *
 * Every method runs with the GIL held and never releases it, so calls from two threads never
 * interleave inside a line.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define MAX_SHOWN_CHARS 256 /* router/logs.py's MAX_SHOWN_CHARS (a test checks they agree) */
#define NULL_KEY "NULL"     /* keys.NULL_KEY */
#define LEVEL_NAME " INFO router.conn: "

typedef struct {
    PyObject_HEAD
    char *data;
    size_t len, cap;
    size_t flush_bytes;
    long long second; /* the second `stamp` shows; -1: none yet */
    char stamp[64];
    size_t stamp_len;
} Lines;

static int reserve(Lines *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    char *data = PyMem_Realloc(b->data, cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static int put(Lines *b, const char *s, size_t n) {
    if (reserve(b, n) != 0) return -1;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return 0;
}

static int put_c(Lines *b, const char *s) { return put(b, s, strlen(s)); }

/* A str as UTF-8 (a value the router or its configuration chose: names, an address, a reason);
 * one that cannot be (a lone surrogate) with backslash escapes, as stderr writes it. */
static int put_str(Lines *b, PyObject *s) {
    if (!PyUnicode_Check(s)) {
        PyErr_Format(PyExc_TypeError, "a line's field must be str, not %.100s", Py_TYPE(s)->tp_name);
        return -1;
    }
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(s, &n);
    if (utf8 != NULL) return put(b, utf8, (size_t)n);
    PyErr_Clear();
    PyObject *encoded = PyUnicode_AsEncodedString(s, "utf-8", "backslashreplace");
    if (encoded == NULL) return -1;
    int r = put(b, PyBytes_AS_STRING(encoded), (size_t)PyBytes_GET_SIZE(encoded));
    Py_DECREF(encoded);
    return r;
}

static int put_int(Lines *b, long long v) {
    char s[32];
    int n = snprintf(s, sizeof s, "%lld", v);
    return put(b, s, (size_t)n);
}

static inline int safe_char(Py_UCS4 c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '/' || c == '@' || c == '+' || c == '-';
}

/* One character as `str.encode("unicode_escape")` writes it, with `"` escaped too. */
static int put_escaped(Lines *b, Py_UCS4 c) {
    char s[12];
    int n;
    switch (c) {
    case '\\': return put(b, "\\\\", 2);
    case '"': return put(b, "\\\"", 2);
    case '\t': return put(b, "\\t", 2);
    case '\n': return put(b, "\\n", 2);
    case '\r': return put(b, "\\r", 2);
    default: break;
    }
    if (c >= 0x20 && c < 0x7f) {
        s[0] = (char)c;
        n = 1;
    } else if (c < 0x100) {
        n = snprintf(s, sizeof s, "\\x%02x", (unsigned)c);
    } else if (c < 0x10000) {
        n = snprintf(s, sizeof s, "\\u%04x", (unsigned)c);
    } else {
        n = snprintf(s, sizeof s, "\\U%08x", (unsigned)c);
    }
    return put(b, s, (size_t)n);
}

/* router/logs.py's `shown(value, cap)`: None as NULL; a value of only letters, digits and `._:/@+-`
 * of at most `cap` characters as itself; else its first `cap` characters quoted and escaped to
 * printable ASCII, then `...(len=N)` when it was longer. */
static int put_shown(Lines *b, PyObject *value, Py_ssize_t cap) {
    if (value == Py_None) return put_c(b, NULL_KEY);
    if (!PyUnicode_Check(value)) {
        PyErr_Format(PyExc_TypeError, "shown() takes str or None, not %.100s", Py_TYPE(value)->tp_name);
        return -1;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(value);
    int kind = PyUnicode_KIND(value);
    const void *data = PyUnicode_DATA(value);
    if (n > 0 && n <= cap) {
        Py_ssize_t i = 0;
        while (i < n && safe_char(PyUnicode_READ(kind, data, i))) i++;
        if (i == n) { /* all ASCII: the UTF-8 is the characters */
            if (reserve(b, (size_t)n) != 0) return -1;
            for (i = 0; i < n; i++) b->data[b->len++] = (char)PyUnicode_READ(kind, data, i);
            return 0;
        }
    }
    Py_ssize_t shown = n < cap ? n : cap;
    if (put(b, "\"", 1) != 0) return -1;
    for (Py_ssize_t i = 0; i < shown; i++)
        if (put_escaped(b, PyUnicode_READ(kind, data, i)) != 0) return -1;
    if (put(b, "\"", 1) != 0) return -1;
    if (n > cap) {
        char s[48];
        int m = snprintf(s, sizeof s, "...(len=%zd)", n);
        return put(b, s, (size_t)m);
    }
    return 0;
}

/* `host:port`, or `[host]:port` for an IPv6 literal (router/core/address.py's Address.__str__). */
static int put_peer(Lines *b, PyObject *host, long long port) {
    if (!PyUnicode_Check(host)) {
        PyErr_SetString(PyExc_TypeError, "a peer's host must be str");
        return -1;
    }
    int v6 = PyUnicode_FindChar(host, ':', 0, PyUnicode_GET_LENGTH(host), 1) >= 0;
    if (v6 && put(b, "[", 1) != 0) return -1;
    if (put_str(b, host) != 0) return -1;
    if (put_c(b, v6 ? "]:" : ":") != 0) return -1;
    return put_int(b, port);
}

/* The start of a line: its time (`now`, seconds since the epoch; a negative one: the clock now). */
static int start(Lines *b, double now) {
    if (now < 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        now = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9; /* as time.time() */
    }
    long long second = (long long)now;
    if (second != b->second) {
        time_t t = (time_t)second;
        struct tm tm;
        if (localtime_r(&t, &tm) == NULL) {
            PyErr_SetString(PyExc_OverflowError, "a line's time is out of range");
            return -1;
        }
        b->stamp_len = strftime(b->stamp, sizeof b->stamp, "%Y-%m-%d %H:%M:%S", &tm);
        b->second = second;
    }
    char ms[8];
    int n = snprintf(ms, sizeof ms, ",%03d", (int)((now - (double)second) * 1000));
    if (put(b, b->stamp, b->stamp_len) != 0 || put(b, ms, (size_t)n) != 0) return -1;
    return put_c(b, LEVEL_NAME);
}

/* The end of a line: whether the buffer is full now; on an error, the line is taken back. */
static PyObject *finish(Lines *b, size_t began, int failed) {
    if (failed) {
        b->len = began;
        return NULL;
    }
    if (put(b, "\n", 1) != 0) {
        b->len = began;
        return NULL;
    }
    return PyBool_FromLong(b->len >= b->flush_bytes);
}

static PyObject *Lines_info(Lines *b, PyObject *args) {
    PyObject *message;
    double now = -1;
    if (!PyArg_ParseTuple(args, "U|d", &message, &now)) return NULL;
    size_t began = b->len;
    return finish(b, began, start(b, now) != 0 || put_str(b, message) != 0);
}

static PyObject *Lines_connected(Lines *b, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 && nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "connected(host, port, router, key, node_id[, now])");
        return NULL;
    }
    long long port = PyLong_AsLongLong(args[1]);
    if (port == -1 && PyErr_Occurred()) return NULL;
    double now = nargs == 6 ? PyFloat_AsDouble(args[5]) : -1;
    if (now == -1 && PyErr_Occurred()) return NULL;
    size_t began = b->len;
    int failed = start(b, now) != 0 || put_c(b, "peer=") != 0 || put_peer(b, args[0], port) != 0 ||
                 put_c(b, " router=") != 0 || put_str(b, args[2]) != 0 || put_c(b, " key=") != 0 ||
                 put_shown(b, args[3], MAX_SHOWN_CHARS) != 0 || put_c(b, " target=") != 0 ||
                 put_str(b, args[4]) != 0 || put_c(b, " outcome=OK") != 0;
    return finish(b, began, failed);
}

static PyObject *Lines_closed(Lines *b, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 && nargs != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "closed(host, port, router, node_id, bytes_in, bytes_out, duration_s, reason, detail[, now])");
        return NULL;
    }
    long long port = PyLong_AsLongLong(args[1]);
    if (port == -1 && PyErr_Occurred()) return NULL;
    long long in = PyLong_AsLongLong(args[4]);
    if (in == -1 && PyErr_Occurred()) return NULL;
    long long out = PyLong_AsLongLong(args[5]);
    if (out == -1 && PyErr_Occurred()) return NULL;
    double duration = PyFloat_AsDouble(args[6]);
    if (duration == -1 && PyErr_Occurred()) return NULL;
    double now = nargs == 10 ? PyFloat_AsDouble(args[9]) : -1;
    if (now == -1 && PyErr_Occurred()) return NULL;
    PyObject *detail = args[8];
    if (!PyUnicode_Check(detail)) {
        PyErr_SetString(PyExc_TypeError, "a close's detail must be str");
        return NULL;
    }
    char *seconds = PyOS_double_to_string(duration, 'f', 3, 0, NULL); /* as "%.3f" % duration */
    if (seconds == NULL) return NULL;
    size_t began = b->len;
    int failed = start(b, now) != 0 || put_c(b, "peer=") != 0 || put_peer(b, args[0], port) != 0 ||
                 put_c(b, " router=") != 0 || put_str(b, args[2]) != 0 || put_c(b, " target=") != 0 ||
                 put_str(b, args[3]) != 0 || put_c(b, " closed bytes_in=") != 0 || put_int(b, in) != 0 ||
                 put_c(b, " bytes_out=") != 0 || put_int(b, out) != 0 || put_c(b, " duration_s=") != 0 ||
                 put_c(b, seconds) != 0 || put_c(b, " reason=") != 0 || put_str(b, args[7]) != 0;
    PyMem_Free(seconds);
    if (!failed && PyUnicode_GET_LENGTH(detail) > 0)
        failed = put_c(b, " (") != 0 || put_shown(b, detail, MAX_SHOWN_CHARS) != 0 || put_c(b, ")") != 0;
    return finish(b, began, failed);
}

/* The lines so far, as bytes (UTF-8), leaving the buffer empty. */
static PyObject *Lines_take(Lines *b, PyObject *unused) {
    PyObject *text = PyBytes_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)b->len);
    if (text == NULL) return NULL;
    b->len = 0;
    if (b->cap > 4 * b->flush_bytes) { /* a burst grew it: give the memory back */
        PyMem_Free(b->data);
        b->data = NULL;
        b->cap = 0;
    }
    return text;
}

static PyObject *Lines_get_size(Lines *b, void *unused) { return PyLong_FromSize_t(b->len); }

static int Lines_init(Lines *b, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"flush_bytes", NULL};
    Py_ssize_t flush = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n", names, &flush)) return -1;
    if (flush <= 0) {
        PyErr_SetString(PyExc_ValueError, "flush_bytes must be positive");
        return -1;
    }
    b->flush_bytes = (size_t)flush;
    b->second = -1;
    return 0;
}

static void Lines_dealloc(Lines *b) {
    PyMem_Free(b->data);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static PyMethodDef Lines_methods[] = {
    {"info", (PyCFunction)Lines_info, METH_VARARGS,
     "info(message[, now]) -> full: one INFO line of router.conn."},
    {"connected", (PyCFunction)(void (*)(void))Lines_connected, METH_FASTCALL,
     "connected(host, port, router, key, node_id[, now]) -> full: a proxied connection's outcome=OK line."},
    {"closed", (PyCFunction)(void (*)(void))Lines_closed, METH_FASTCALL,
     "closed(host, port, router, node_id, bytes_in, bytes_out, duration_s, reason, detail[, now]) -> full: "
     "its closed line."},
    {"take", (PyCFunction)Lines_take, METH_NOARGS, "take() -> bytes: the lines so far (the buffer empties)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Lines_getset[] = {
    {"size", (getter)Lines_get_size, NULL, "Bytes in the buffer.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject LinesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "router._conn_lines.Lines",
    .tp_basicsize = sizeof(Lines),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Lines(flush_bytes): router.conn's INFO lines formatted into a buffer (router/conn_lines.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Lines_init,
    .tp_dealloc = (destructor)Lines_dealloc,
    .tp_methods = Lines_methods,
    .tp_getset = Lines_getset,
};

/* shown(value, cap=MAX_SHOWN_CHARS) -> str: the C port of router/logs.py's `shown` (fuzzed against it). */
static PyObject *module_shown(PyObject *unused, PyObject *args) {
    PyObject *value;
    Py_ssize_t cap = MAX_SHOWN_CHARS;
    if (!PyArg_ParseTuple(args, "O|n", &value, &cap)) return NULL;
    if (cap < 0) {
        PyErr_SetString(PyExc_ValueError, "cap must not be negative");
        return NULL;
    }
    Lines b = {.second = -1};
    if (put_shown(&b, value, cap) != 0) {
        PyMem_Free(b.data);
        return NULL;
    }
    PyObject *text = PyUnicode_DecodeASCII(b.data ? b.data : "", (Py_ssize_t)b.len, "strict");
    PyMem_Free(b.data);
    return text;
}

static PyMethodDef module_methods[] = {
    {"shown", module_shown, METH_VARARGS, "shown(value, cap=256) -> str: router/logs.py's shown, in C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "router._conn_lines",
    "router.conn's per-connection INFO lines formatted in C (router/conn_lines.py).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__conn_lines(void) {
    if (PyType_Ready(&LinesType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Lines", (PyObject *)&LinesType) < 0 ||
        PyModule_AddIntConstant(m, "MAX_SHOWN_CHARS", MAX_SHOWN_CHARS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
