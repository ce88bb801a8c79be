/* The MQTT and STOMP CONNECT parsers in C: `keys._native` (STYLE R14).
 *
 * Two functions for the hot path, each a pure function of the bytes a client has sent so far,
 * like the Python sniffers they mirror (keys/mqtt.py `MqttSniffer.sniff`, keys/stomp.py
 * `StompSniffer.sniff`), which stay the reference: the same input gives the same fields, the same
 * "need more" and the same refusal (tests/keys/test_native.py and `fuzz/run mqtt_native
 * stomp_native` check it). Each returns
 *
 *     None                      the bytes so far are a valid, incomplete prefix (NEED_MORE)
 *     a tuple                   the opening, as plain values (below)
 *     an int                    a refusal: one of the ERR_* codes (> 0), naming the rule broken,
 *                               or DEFER (0): an input this code does not decide; ask Python
 *
 * mqtt_connect(buf) -> (level, client_id, user_name, password, keepalive_s, consumed)
 *     level 3 (MQTT 3.1), 4 (3.1.1) or 5; client_id None for the empty id (the server assigns
 *     one); user_name None without the flag; password None without the flag or when it is not
 *     UTF-8 (Python keeps it only as text); consumed is the CONNECT's whole size.
 * stomp_connect(buf) -> (client_id, login, passcode, host, accept_version, consumed)
 *     the first value of each header, None when absent (accept_version too: Python's default
 *     "1.0" is the caller's); consumed ends after the frame's NUL.
 *
 * Strings are str: every header name and value, the MQTT client id and user name are checked as
 * Python's strict UTF-8 codec checks them before any is made. A refusal's message (and an MQTT
 * CONNACK to send first) comes from the Python sniffer, which the caller runs on the rare refused
 * input (keys/native.py). Nothing defers today (DEFER stays for a rule too costly to port).
 *
 * No state, no allocation but the returned objects, no I/O; reads stay inside the buffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { DEFER = 0 };

/* MQTT refusals, each the class of one or more SniffError reasons of keys/mqtt.py. */
enum {
    MQTT_ERR_NOT_CONNECT = 1,    /* first byte must be 0x10 */
    MQTT_ERR_VARINT = 2,         /* a variable byte integer exceeds 4 bytes */
    MQTT_ERR_OVERRUN = 3,        /* a field overruns the packet */
    MQTT_ERR_PROTOCOL_NAME = 4,  /* neither 'MQTT' nor 'MQIsdp' */
    MQTT_ERR_PROTOCOL_LEVEL = 5, /* level does not go with the name: CONNACK 0x01 first */
    MQTT_ERR_FLAGS = 6,          /* reserved flag, will QoS/retain, QoS 3, password alone */
    MQTT_ERR_UTF8 = 7,           /* client id or user name not UTF-8, or with U+0000 */
    MQTT_ERR_EXTRA = 8,          /* bytes after the payload, inside the packet */
};

/* STOMP refusals, each the class of one or more SniffError reasons of keys/stomp.py. */
enum {
    STOMP_ERR_COMMAND = 1,        /* first frame must be CONNECT or STOMP */
    STOMP_ERR_STRAY_CR = 2,       /* CR not followed by LF before the frame */
    STOMP_ERR_HEADER_SIZE = 3,    /* header section exceeds MAX_HEADER_BYTES */
    STOMP_ERR_NO_COLON = 4,       /* header line without a colon */
    STOMP_ERR_UTF8 = 5,           /* header name or value not UTF-8 */
    STOMP_ERR_CONTENT_LENGTH = 6, /* not a decimal number, or over MAX_BODY_BYTES */
    STOMP_ERR_BODY = 7,           /* no NUL within MAX_BODY_BYTES, or none after content-length */
};

/* keys/stomp.py MAX_HEADER_BYTES and MAX_BODY_BYTES (tests/keys/test_native.py checks they agree). */
#define STOMP_MAX_HEADER_BYTES (8 * 1024)
#define STOMP_MAX_BODY_BYTES (8 * 1024)

/* Strict UTF-8 as CPython's codec decodes it (Unicode 15 Table 3-7): no overlong forms, no
 * surrogates (U+D800-DFFF), nothing over U+10FFFF, no truncated sequence. `nul` is set when the
 * text holds U+0000. */
static int utf8_valid(const unsigned char *s, Py_ssize_t n, int *nul) {
    Py_ssize_t i = 0;
    *nul = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            if (c == 0) *nul = 1;
            i += 1;
            continue;
        }
        unsigned char lo = 0x80, hi = 0xBF;
        int len;
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return 0;
        }
        if (n - i < len) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (int k = 2; k < len; k++) {
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return 0;
        }
        i += len;
    }
    return 1;
}

/* A str of bytes known to be valid UTF-8, or None for NULL. */
static PyObject *text_or_none(const unsigned char *s, Py_ssize_t n) {
    if (s == NULL) Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8((const char *)s, n, "strict");
}

/* -- MQTT ----------------------------------------------------------------------------------- */

/* Outcomes of a read inside a packet (keys/mqtt.py `_PacketReader`). */
enum { P_OK = 0, P_MORE = -1, P_DEFER = -2 }; /* > 0: an MQTT_ERR_* or STOMP_ERR_* code */

typedef struct {
    const unsigned char *data;
    Py_ssize_t len; /* the bytes received */
    Py_ssize_t end; /* where the packet ends (may be past len) */
    Py_ssize_t pos;
} Reader;

/* `_PacketReader.take`: a field past the packet's end is a refusal, even when the bytes received
 * stop earlier; a field inside the packet but past the bytes received needs more. */
static int take(Reader *r, Py_ssize_t n, const unsigned char **out) {
    Py_ssize_t stop = r->pos + n;
    if (stop > r->end) return MQTT_ERR_OVERRUN;
    if (stop > r->len) return P_MORE;
    if (out != NULL) *out = r->data + r->pos;
    r->pos = stop;
    return P_OK;
}

static int u8(Reader *r, unsigned *v) {
    const unsigned char *p;
    int rc = take(r, 1, &p);
    if (rc == P_OK) *v = p[0];
    return rc;
}

static int u16(Reader *r, unsigned *v) {
    const unsigned char *p;
    int rc = take(r, 2, &p);
    if (rc == P_OK) *v = ((unsigned)p[0] << 8) | p[1];
    return rc;
}

/* A variable byte integer, at most 4 bytes, non-minimal forms accepted (MQTT 3.1.1 §2.2.3,
 * MQTT 5 §1.5.5): at most 2^28 - 1. */
static int varint(Reader *r, Py_ssize_t *v) {
    Py_ssize_t value = 0;
    for (int i = 0; i < 4; i++) {
        unsigned byte;
        int rc = u8(r, &byte);
        if (rc != P_OK) return rc;
        value |= (Py_ssize_t)(byte & 0x7F) << (7 * i);
        if (!(byte & 0x80)) {
            *v = value;
            return P_OK;
        }
    }
    return MQTT_ERR_VARINT;
}

/* A 2-byte length, then that many bytes (MQTT 3.1.1 §1.5.3). */
static int length_prefixed(Reader *r, const unsigned char **p, Py_ssize_t *n) {
    unsigned len;
    int rc = u16(r, &len);
    if (rc != P_OK) return rc;
    *n = len;
    return take(r, len, p);
}

/* A UTF-8 string: well-formed, without U+0000 (MQTT 3.1.1 §1.5.3, MQTT 5 §1.5.4). */
static int utf8_field(Reader *r, const unsigned char **p, Py_ssize_t *n) {
    int rc = length_prefixed(r, p, n);
    if (rc != P_OK) return rc;
    int nul;
    if (!utf8_valid(*p, *n, &nul) || nul) return MQTT_ERR_UTF8;
    return P_OK;
}

#define TRY(call)                  \
    do {                           \
        int rc_ = (call);          \
        if (rc_ != P_OK) return rc_; \
    } while (0)

typedef struct {
    int level;
    unsigned keepalive;
    const unsigned char *client_id, *user_name, *password; /* NULL: absent */
    Py_ssize_t client_id_len, user_name_len, password_len;
    Py_ssize_t consumed;
} MqttConnect;

/* keys/mqtt.py `_parse_connect`, step by step in the same order. */
static int parse_mqtt(const unsigned char *data, Py_ssize_t len, MqttConnect *out) {
    Reader header = {data, len, 5, 0}; /* type byte and at most 4 length bytes (§2.2.3) */
    unsigned first;
    TRY(u8(&header, &first));
    if (first != 0x10) return MQTT_ERR_NOT_CONNECT; /* CONNECT, reserved flags 0 (§2.2.2) */
    Py_ssize_t remaining;
    TRY(varint(&header, &remaining));
    Reader packet = {data, len, header.pos + remaining, header.pos};

    /* Variable header: MQTT 3.1.1 §3.1.2, MQTT 5 §3.1.2. */
    unsigned name_len;
    TRY(u16(&packet, &name_len));
    if (name_len != 4 && name_len != 6) return MQTT_ERR_PROTOCOL_NAME;
    const unsigned char *name;
    TRY(take(&packet, name_len, &name));
    int mqtt = name_len == 4 && memcmp(name, "MQTT", 4) == 0;
    int mqisdp = name_len == 6 && memcmp(name, "MQIsdp", 6) == 0;
    if (!mqtt && !mqisdp) return MQTT_ERR_PROTOCOL_NAME;
    unsigned level;
    TRY(u8(&packet, &level));
    /* The bridge bit (0x80) on levels 3 and 4: mosquitto's try_private, accepted as Python does. */
    unsigned effective = (level & 0x80) && ((level & 0x7F) == 3 || (level & 0x7F) == 4) ? level & 0x7F : level;
    if (mqisdp && effective == 3) {
        out->level = 3;
    } else if (mqtt && (effective == 4 || effective == 5)) {
        out->level = (int)effective;
    } else {
        return MQTT_ERR_PROTOCOL_LEVEL;
    }
    int v5 = out->level == 5;

    /* Connect flags (§3.1.2.3): reserved 0x01, will 0x04, will QoS 0x18, will retain 0x20,
     * password 0x40, user name 0x80. */
    unsigned flags;
    TRY(u8(&packet, &flags));
    if (flags & 0x01) return MQTT_ERR_FLAGS;
    int will = (flags & 0x04) != 0;
    if (!will && (flags & (0x18 | 0x20))) return MQTT_ERR_FLAGS;
    if (((flags & 0x18) >> 3) == 3) return MQTT_ERR_FLAGS;
    int has_user = (flags & 0x80) != 0, has_password = (flags & 0x40) != 0;
    if (has_password && !has_user && !v5) return MQTT_ERR_FLAGS; /* 3.1.1 §3.1.2.9 */
    TRY(u16(&packet, &out->keepalive));
    Py_ssize_t skip;
    if (v5) { /* CONNECT properties (MQTT 5 §3.1.2.11), skipped */
        TRY(varint(&packet, &skip));
        TRY(take(&packet, skip, NULL));
    }

    /* Payload, in this order: MQTT 3.1.1 §3.1.3, MQTT 5 §3.1.3. */
    TRY(utf8_field(&packet, &out->client_id, &out->client_id_len));
    if (will) {
        if (v5) { /* will properties (MQTT 5 §3.1.3.2), skipped */
            TRY(varint(&packet, &skip));
            TRY(take(&packet, skip, NULL));
        }
        const unsigned char *ignored;
        TRY(length_prefixed(&packet, &ignored, &skip)); /* will topic */
        TRY(length_prefixed(&packet, &ignored, &skip)); /* will payload */
    }
    out->user_name = NULL;
    out->password = NULL;
    if (has_user) TRY(utf8_field(&packet, &out->user_name, &out->user_name_len));
    if (has_password) TRY(length_prefixed(&packet, &out->password, &out->password_len));
    if (packet.pos != packet.end) return MQTT_ERR_EXTRA;
    out->consumed = packet.end;
    return P_OK;
}

static PyObject *mqtt_result(const MqttConnect *c) {
    PyObject *client_id = NULL, *user_name = NULL, *password = NULL;
    /* §3.1.3.1: a zero-length client id asks the server to assign one. */
    client_id = text_or_none(c->client_id_len ? c->client_id : NULL, c->client_id_len);
    if (client_id == NULL) goto fail;
    user_name = text_or_none(c->user_name, c->user_name_len);
    if (user_name == NULL) goto fail;
    int nul;
    if (c->password != NULL && utf8_valid(c->password, c->password_len, &nul)) {
        password = text_or_none(c->password, c->password_len);
        if (password == NULL) goto fail;
    } else {
        password = Py_NewRef(Py_None); /* binary data (§3.1.3.5): kept only as text */
    }
    return Py_BuildValue("(iNNNIn)", c->level, client_id, user_name, password, c->keepalive, c->consumed);
fail:
    Py_XDECREF(client_id);
    Py_XDECREF(user_name);
    return NULL;
}

/* What a parse that did not give a CONNECT returns: None (P_MORE), DEFER, or the refusal code. */
static PyObject *not_parsed(int rc) {
    if (rc == P_MORE) return Py_NewRef(Py_None);
    return PyLong_FromLong(rc == P_DEFER ? DEFER : rc);
}

static PyObject *mqtt_connect(PyObject *module, PyObject *arg) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    MqttConnect c;
    int rc = parse_mqtt(view.buf, view.len, &c);
    PyObject *result = rc == P_OK ? mqtt_result(&c) : not_parsed(rc);
    PyBuffer_Release(&view);
    return result;
}

/* -- STOMP ---------------------------------------------------------------------------------- */

enum { H_CLIENT_ID, H_LOGIN, H_PASSCODE, H_HOST, H_ACCEPT_VERSION, H_CONTENT_LENGTH, H_COUNT };
static const struct {
    const char *name;
    Py_ssize_t len;
} STOMP_HEADERS[H_COUNT] = {
    {"client-id", 9}, {"login", 5}, {"passcode", 8}, {"host", 4}, {"accept-version", 14}, {"content-length", 14},
};

typedef struct {
    const unsigned char *value[H_COUNT]; /* NULL: not seen (yet) */
    Py_ssize_t len[H_COUNT];
    Py_ssize_t consumed;
} StompConnect;

/* The client frames (STOMP 1.2 §Client Frames): a command line still incomplete waits while it
 * may become one, so the Python sniffer's error can name the whole command. */
static const char *const CLIENT_COMMANDS[] = {
    "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "BEGIN", "COMMIT", "ABORT", "ACK", "NACK", "DISCONNECT", "CONNECT", "STOMP",
};

static const unsigned char *find_byte(const unsigned char *data, Py_ssize_t from, Py_ssize_t to, unsigned char b) {
    if (from >= to) return NULL;
    return memchr(data + from, b, (size_t)(to - from));
}

/* A line without the CR of a CRLF end (STOMP 1.2 §Augmented BNF): its length. */
static Py_ssize_t line_len(const unsigned char *data, Py_ssize_t start, Py_ssize_t end) {
    return end > start && data[end - 1] == '\r' ? end - start - 1 : end - start;
}

/* keys/stomp.py `StompSniffer.sniff` and `_body_complete`, step by step in the same order. */
static int parse_stomp(const unsigned char *data, Py_ssize_t len, StompConnect *out) {
    /* Heart-beat EOLs before the frame (STOMP 1.2 §Heart-beating). */
    Py_ssize_t start = 0;
    for (;;) {
        if (start == len) return P_MORE;
        if (data[start] == '\n') {
            start += 1;
        } else if (data[start] == '\r') {
            if (start + 1 == len) return P_MORE;
            if (data[start + 1] != '\n') return STOMP_ERR_STRAY_CR;
            start += 2;
        } else {
            break;
        }
    }
    const unsigned char *eol = find_byte(data, start, len, '\n');
    if (eol == NULL) {
        Py_ssize_t partial = len - start; /* without every trailing CR, as rstrip(b"\r") */
        while (partial > 0 && data[start + partial - 1] == '\r') partial--;
        for (size_t i = 0; i < sizeof CLIENT_COMMANDS / sizeof CLIENT_COMMANDS[0]; i++) {
            size_t n = strlen(CLIENT_COMMANDS[i]);
            if ((size_t)partial <= n && memcmp(CLIENT_COMMANDS[i], data + start, (size_t)partial) == 0) return P_MORE;
        }
        return STOMP_ERR_COMMAND;
    }
    Py_ssize_t line_end = eol - data;
    Py_ssize_t n = line_len(data, start, line_end);
    if (!((n == 7 && memcmp(data + start, "CONNECT", 7) == 0) || (n == 5 && memcmp(data + start, "STOMP", 5) == 0)))
        return STOMP_ERR_COMMAND;

    for (int h = 0; h < H_COUNT; h++) out->value[h] = NULL;
    Py_ssize_t pos = line_end + 1;
    Py_ssize_t header_end = start + STOMP_MAX_HEADER_BYTES; /* find(b"\n", pos, header_end) */
    if (header_end > len) header_end = len;
    for (;;) {
        eol = find_byte(data, pos, header_end, '\n');
        if (eol == NULL) {
            if (len - start >= STOMP_MAX_HEADER_BYTES) return STOMP_ERR_HEADER_SIZE;
            return P_MORE;
        }
        line_end = eol - data;
        n = line_len(data, pos, line_end);
        const unsigned char *line = data + pos;
        pos = line_end + 1;
        if (n == 0) break;
        const unsigned char *colon = memchr(line, ':', (size_t)n);
        if (colon == NULL) return STOMP_ERR_NO_COLON;
        Py_ssize_t name_len = colon - line, value_len = n - name_len - 1;
        int nul;
        if (!utf8_valid(line, name_len, &nul) || !utf8_valid(colon + 1, value_len, &nul)) return STOMP_ERR_UTF8;
        /* The first occurrence wins (STOMP 1.2 §Repeated Header Entries); values are literal in
         * CONNECT/STOMP (keys/stomp.py's docstring). */
        for (int h = 0; h < H_COUNT; h++) {
            if (out->value[h] == NULL && name_len == STOMP_HEADERS[h].len &&
                memcmp(line, STOMP_HEADERS[h].name, (size_t)name_len) == 0) {
                out->value[h] = colon + 1;
                out->len[h] = value_len;
                break;
            }
        }
    }

    /* The body and its NUL (STOMP 1.2 §Body; §Header content-length). */
    const unsigned char *cl = out->value[H_CONTENT_LENGTH];
    if (cl == NULL) {
        Py_ssize_t limit = pos + STOMP_MAX_BODY_BYTES + 1;
        const unsigned char *nul = find_byte(data, pos, limit < len ? limit : len, '\0');
        if (nul != NULL) {
            out->consumed = nul - data + 1;
            return P_OK;
        }
        if (len - pos > STOMP_MAX_BODY_BYTES) return STOMP_ERR_BODY;
        return P_MORE;
    }
    Py_ssize_t digits = out->len[H_CONTENT_LENGTH];
    if (digits == 0) return STOMP_ERR_CONTENT_LENGTH;
    for (Py_ssize_t i = 0; i < digits; i++) {
        if (cl[i] < '0' || cl[i] > '9') return STOMP_ERR_CONTENT_LENGTH; /* isascii() and isdigit() */
    }
    Py_ssize_t length = 0, i = 0;
    while (i < digits && cl[i] == '0') i++; /* leading zeros do not count, as in keys/stomp.py */
    if (digits - i > 4) return STOMP_ERR_CONTENT_LENGTH; /* 10,000 or more > MAX_BODY_BYTES */
    for (; i < digits; i++) length = length * 10 + (cl[i] - '0');
    if (length > STOMP_MAX_BODY_BYTES) return STOMP_ERR_CONTENT_LENGTH;
    Py_ssize_t end = pos + length;
    if (len <= end) return P_MORE;
    if (data[end] != '\0') return STOMP_ERR_BODY;
    out->consumed = end + 1;
    return P_OK;
}

static PyObject *stomp_result(const StompConnect *c) {
    PyObject *values[5] = {NULL};
    for (int h = 0; h < 5; h++) {
        values[h] = text_or_none(c->value[h], c->len[h]);
        if (values[h] == NULL) {
            for (int k = 0; k < h; k++) Py_DECREF(values[k]);
            return NULL;
        }
    }
    return Py_BuildValue("(NNNNNn)", values[0], values[1], values[2], values[3], values[4], c->consumed);
}

static PyObject *stomp_connect(PyObject *module, PyObject *arg) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    StompConnect c;
    int rc = parse_stomp(view.buf, view.len, &c);
    PyObject *result = rc == P_OK ? stomp_result(&c) : not_parsed(rc);
    PyBuffer_Release(&view);
    return result;
}

/* -- the module ----------------------------------------------------------------------------- */

static PyMethodDef module_methods[] = {
    {"mqtt_connect", mqtt_connect, METH_O,
     "mqtt_connect(buf) -> None | (level, client_id, user_name, password, keepalive_s, consumed) | int\n\n"
     "Parse the MQTT CONNECT at the start of buf as keys.mqtt.MqttSniffer.sniff does: None needs more\n"
     "bytes; an int is a refusal (an MQTT_ERR_* code)."},
    {"stomp_connect", stomp_connect, METH_O,
     "stomp_connect(buf) -> None | (client_id, login, passcode, host, accept_version, consumed) | int\n\n"
     "Parse the STOMP CONNECT/STOMP frame at the start of buf as keys.stomp.StompSniffer.sniff does:\n"
     "None needs more bytes; an int is a refusal (a STOMP_ERR_* code) or DEFER (0): ask Python."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "keys._native",
    "The MQTT and STOMP CONNECT parsers in C (keys/_native.c); keys/native.py wraps them.", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    static const struct {
        const char *name;
        long value;
    } constants[] = {
        {"DEFER", DEFER},
        {"MQTT_ERR_NOT_CONNECT", MQTT_ERR_NOT_CONNECT},
        {"MQTT_ERR_VARINT", MQTT_ERR_VARINT},
        {"MQTT_ERR_OVERRUN", MQTT_ERR_OVERRUN},
        {"MQTT_ERR_PROTOCOL_NAME", MQTT_ERR_PROTOCOL_NAME},
        {"MQTT_ERR_PROTOCOL_LEVEL", MQTT_ERR_PROTOCOL_LEVEL},
        {"MQTT_ERR_FLAGS", MQTT_ERR_FLAGS},
        {"MQTT_ERR_UTF8", MQTT_ERR_UTF8},
        {"MQTT_ERR_EXTRA", MQTT_ERR_EXTRA},
        {"STOMP_ERR_COMMAND", STOMP_ERR_COMMAND},
        {"STOMP_ERR_STRAY_CR", STOMP_ERR_STRAY_CR},
        {"STOMP_ERR_HEADER_SIZE", STOMP_ERR_HEADER_SIZE},
        {"STOMP_ERR_NO_COLON", STOMP_ERR_NO_COLON},
        {"STOMP_ERR_UTF8", STOMP_ERR_UTF8},
        {"STOMP_ERR_CONTENT_LENGTH", STOMP_ERR_CONTENT_LENGTH},
        {"STOMP_ERR_BODY", STOMP_ERR_BODY},
        {"STOMP_MAX_HEADER_BYTES", STOMP_MAX_HEADER_BYTES},
        {"STOMP_MAX_BODY_BYTES", STOMP_MAX_BODY_BYTES},
    };
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++) {
        if (PyModule_AddIntConstant(m, constants[i].name, constants[i].value) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
