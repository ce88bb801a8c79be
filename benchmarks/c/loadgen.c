/* loadgen: the load client of the benchmark (benchmarks/run.py). One thread, epoll, non-blocking.
 *
 *   loadgen rate -a HOST -p PORT -c CONC -n TOTAL -t SECONDS -k echo|mqtt3|mqtt5|core|amqp
 *                [-r REASON] [-s NSRC] [-i ID_PREFIX] [-o HEX -O OFFSET]
 *       Short connections, CONC at a time, until TOTAL are done or SECONDS have passed. Each one
 *       connects, sends one request and reads one reply, then closes:
 *         echo   16 bytes, expects the same 16 bytes back;
 *         mqtt3  an MQTT 3.1.1 CONNECT (clean session, client id ID_PREFIX + a counter), expects
 *                a CONNACK with return code REASON (default 0), then sends DISCONNECT;
 *         mqtt5  the same as MQTT 5, expects a CONNACK with reason code REASON (0x9C = "use
 *                another server" for a redirect);
 *         core   a CORE opening sent whole (pipelined): HEX (-o) is a captured Java client's
 *                opening up to its CREATESESSION_V2's last field, whose int32 length field is at
 *                OFFSET (-O); each connection appends its client id (ID_PREFIX + a counter) as
 *                that field, a nullable String, and fixes the length. Expects a CORE redirect:
 *                DISCONNECT_V3 (type -19) with reason REDIRECT, then EXCEPTION (type 20) with
 *                code 222; PING and topology packets before them are skipped;
 *         amqp   the AMQP 1.0 SASL header, sasl-init PLAIN (admin/admin), the AMQP header and an
 *                Open with container-id ID_PREFIX + a counter, sent whole. Expects sasl-outcome
 *                ok, then a Close with the condition amqp:connection:redirect.
 *
 *   loadgen ping -a HOST -p PORT -n COUNT -t SECONDS [-z SIZE] [-w WARMUP]
 *       Request/response over one connection: send SIZE bytes, read SIZE bytes back, COUNT times
 *       (after WARMUP untimed rounds) or until SECONDS have passed; round-trip percentiles.
 *
 *   loadgen idle -a HOST -p PORT -n COUNT -c CONC -t SECONDS [-s NSRC]
 *       Opens COUNT connections (CONC in flight), each sends one byte and reads its echo so the
 *       whole path is established, then keeps them all open. Prints its result line, then waits
 *       for EOF on stdin (or SIGTERM) and closes them.
 *
 * With -s NSRC > 0, connections are bound round-robin to the source addresses 127.0.0.2 ...
 * 127.0.0.(NSRC+1) with IP_BIND_ADDRESS_NO_PORT, so that the local port is picked at connect()
 * time per 4-tuple. Every mode prints one JSON object on stdout; the exit status is 0 when the
 * run itself worked (failed connections are counted in the JSON, not in the status).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef IP_BIND_ADDRESS_NO_PORT
#define IP_BIND_ADDRESS_NO_PORT 24
#endif

#define MAX_EVENTS 512
#define REQ_MAX 512
#define REPLY_MAX 2048
#define ID_MAX 64
#define ECHO_SIZE 16

enum kind { KIND_ECHO, KIND_MQTT3, KIND_MQTT5, KIND_CORE, KIND_AMQP, KIND_IDLE };
enum state { S_FREE, S_CONNECTING, S_READING };

struct slot {
    int fd;
    enum state state;
    double started;
    size_t got;
    size_t req_len;
    int redirected; /* core: DISCONNECT_V3 seen */
    unsigned char req[REQ_MAX];
    unsigned char reply[REPLY_MAX];
};

struct options {
    const char *mode;
    const char *host;
    int port;
    int conc;
    long total;
    double seconds;
    enum kind kind;
    int reason;
    int nsrc;
    const char *id_prefix;
    size_t size;
    long warmup;
    unsigned char core_head[REQ_MAX];
    size_t core_head_len;
    long core_length_at;
};

struct counters {
    long started, ok, connect_errors, resets, early_eofs, bad_replies;
    int last_reason;
    char last_error[160];
};

static struct options opt = {
    .conc = 50, .total = 1000, .seconds = 10, .kind = KIND_ECHO, .reason = 0, .id_prefix = "bench",
    .size = 16, .warmup = 200,
    .core_length_at = -1,
};
static struct counters cnt = {.last_reason = -1};
static struct sockaddr_in target;
static volatile sig_atomic_t stop;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void usage(void) {
    fprintf(stderr,
            "usage: loadgen rate|ping|idle -a HOST -p PORT [-c CONC] [-n COUNT] [-t SECONDS]\n"
            "               [-k echo|mqtt3|mqtt5|core|amqp] [-r REASON] [-s NSRC] [-i ID_PREFIX]\n"
            "               [-o HEX -O OFFSET] [-z SIZE] [-w WARMUP]\n");
    exit(2);
}

static void note_error(const char *what, int err) {
    snprintf(cnt.last_error, sizeof(cnt.last_error), "%s: %s", what, err ? strerror(err) : "-");
}

static void raise_nofile(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static size_t put_varint(unsigned char *p, size_t value) {
    size_t n = 0;
    do {
        unsigned char byte = (unsigned char)(value % 128);
        value /= 128;
        if (value > 0) byte |= 0x80;
        p[n++] = byte;
    } while (value > 0);
    return n;
}

static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static uint32_t get_be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* The client id of connection number `seq`: ID_PREFIX + 8 digits (at most ID_MAX - 1 bytes). */
static size_t client_id(char *id, long seq) {
    int n = snprintf(id, ID_MAX, "%s%08ld", opt.id_prefix, seq);
    if (n < 0 || n >= ID_MAX) n = ID_MAX - 1;
    return (size_t)n;
}

/* MQTT 3.1.1 §3.1 / MQTT 5 §3.1 CONNECT, clean session, keep-alive 60 s. */
static size_t build_mqtt(unsigned char *req, const char *id, size_t id_len) {
    int v5 = opt.kind == KIND_MQTT5;
    unsigned char body[REQ_MAX];
    size_t b = 0;
    const unsigned char head[] = {0x00, 0x04, 'M', 'Q', 'T', 'T'};
    memcpy(body, head, sizeof(head));
    b += sizeof(head);
    body[b++] = v5 ? 5 : 4; /* protocol level */
    body[b++] = 0x02;       /* connect flags: clean session / clean start */
    body[b++] = 0x00;       /* keep alive: 60 s */
    body[b++] = 60;
    if (v5) body[b++] = 0x00; /* property length */
    body[b++] = (unsigned char)(id_len >> 8);
    body[b++] = (unsigned char)(id_len & 0xff);
    memcpy(body + b, id, id_len);
    b += id_len;
    size_t n = 0;
    req[n++] = 0x10; /* CONNECT */
    n += put_varint(req + n, b);
    memcpy(req + n, body, b);
    return n + b;
}

/* The captured CORE opening with this connection's client id as CREATESESSION_V2's last field: a
 * nullable String (Artemis UTF8Util.writeString): 0x01, int32 length in UTF-16 units, then for
 * fewer than 9 units each unit as 2 bytes, else a uint16 byte count and the (ASCII) bytes. */
static size_t build_core(unsigned char *req, const char *id, size_t id_len) {
    size_t n = opt.core_head_len;
    memcpy(req, opt.core_head, n);
    req[n++] = 0x01;
    put_be32(req + n, (uint32_t)id_len);
    n += 4;
    if (id_len < 9) {
        for (size_t i = 0; i < id_len; i++) {
            req[n++] = 0x00;
            req[n++] = (unsigned char)id[i];
        }
    } else {
        req[n++] = (unsigned char)(id_len >> 8);
        req[n++] = (unsigned char)(id_len & 0xff);
        memcpy(req + n, id, id_len);
        n += id_len;
    }
    size_t at = (size_t)opt.core_length_at;
    put_be32(req + at, (uint32_t)(n - at - 4)); /* the packet's length counts the bytes after it */
    return n;
}

/* An AMQP 1.0 frame (§2.3.1): size, doff 2, type, channel 0, then a described list. Returns the
 * frame's length; `fields` are already encoded, `count` of them. */
static size_t amqp_frame(unsigned char *out, unsigned char type, unsigned char descriptor,
                         const unsigned char *fields, size_t fields_len, unsigned char count) {
    size_t n = 8;
    out[n++] = 0x00; /* described type */
    out[n++] = 0x53; /* smallulong descriptor */
    out[n++] = descriptor;
    out[n++] = 0xC0; /* list8: size (count byte + fields), count */
    out[n++] = (unsigned char)(fields_len + 1);
    out[n++] = count;
    memcpy(out + n, fields, fields_len);
    n += fields_len;
    put_be32(out, (uint32_t)n);
    out[4] = 2; /* doff: 2 words of header */
    out[5] = type;
    out[6] = 0x00;
    out[7] = 0x00;
    return n;
}

/* SASL header, sasl-init PLAIN (§5.3.3.2, RFC 4616), AMQP header, Open with the container id. */
static size_t build_amqp(unsigned char *req, const char *id, size_t id_len) {
    static const unsigned char sasl_header[] = {'A', 'M', 'Q', 'P', 3, 1, 0, 0};
    static const unsigned char amqp_header[] = {'A', 'M', 'Q', 'P', 0, 1, 0, 0};
    static const unsigned char plain[] = "\0admin\0admin";
    unsigned char fields[ID_MAX + 32];
    size_t n = 0, f = 0;
    memcpy(req, sasl_header, sizeof(sasl_header));
    n += sizeof(sasl_header);
    fields[f++] = 0xA3; /* sym8 mechanism */
    fields[f++] = 5;
    memcpy(fields + f, "PLAIN", 5);
    f += 5;
    fields[f++] = 0xA0; /* vbin8 initial-response */
    fields[f++] = (unsigned char)(sizeof(plain) - 1);
    memcpy(fields + f, plain, sizeof(plain) - 1);
    f += sizeof(plain) - 1;
    n += amqp_frame(req + n, 0x01, 0x41, fields, f, 2); /* SASL frame, sasl-init */
    memcpy(req + n, amqp_header, sizeof(amqp_header));
    n += sizeof(amqp_header);
    f = 0;
    fields[f++] = 0xA1; /* str8-utf8 container-id */
    fields[f++] = (unsigned char)id_len;
    memcpy(fields + f, id, id_len);
    f += id_len;
    n += amqp_frame(req + n, 0x00, 0x10, fields, f, 1); /* AMQP frame, open */
    return n;
}

/* The request of connection number `seq`: the echo message, an MQTT CONNECT or a CORE or AMQP
 * opening. */
static size_t build_request(unsigned char *req, long seq) {
    if (opt.kind == KIND_IDLE) {
        req[0] = 'i';
        return 1;
    }
    if (opt.kind == KIND_ECHO) {
        char text[32];
        snprintf(text, sizeof(text), "echo%012lu", (unsigned long)seq % 1000000000000UL);
        memcpy(req, text, ECHO_SIZE);
        return ECHO_SIZE;
    }
    char id[ID_MAX];
    size_t id_len = client_id(id, seq);
    if (opt.kind == KIND_CORE) return build_core(req, id, id_len);
    if (opt.kind == KIND_AMQP) return build_amqp(req, id, id_len);
    return build_mqtt(req, id, id_len);
}

/* CORE (Artemis PacketImpl): packets of int32 length, int8 type, int64 channel, body. The
 * redirect is DISCONNECT_V3 (-19: nullable SimpleString node id, byte reason 0 = REDIRECT, ...)
 * on channel 0, then EXCEPTION (20: int32 code, 222 = ROUTING_EXCEPTION) on channel 1. */
static int check_core(struct slot *s) {
    size_t pos = 0;
    while (pos + 4 <= s->got) {
        uint32_t len = get_be32(s->reply + pos);
        if (len < 9 || len > REPLY_MAX) {
            snprintf(cnt.last_error, sizeof(cnt.last_error), "CORE packet length %u", len);
            return -1;
        }
        if (pos + 4 + len > s->got) return 0;
        const unsigned char *body = s->reply + pos + 13;
        size_t body_len = len - 9;
        int type = (signed char)s->reply[pos + 4];
        if (type == -19) {
            size_t at = 0;
            if (body_len >= 5 && body[0] == 1) at = 5 + get_be32(body + 1);
            else if (body_len >= 1 && body[0] == 0) at = 1;
            if (at == 0 || at >= body_len || body[at] != 0) {
                snprintf(cnt.last_error, sizeof(cnt.last_error), "DISCONNECT_V3 without reason REDIRECT");
                return -1;
            }
            s->redirected = 1;
        } else if (type == 20) {
            uint32_t code = body_len >= 4 ? get_be32(body) : 0;
            if (code == 222 && s->redirected) return 1;
            snprintf(cnt.last_error, sizeof(cnt.last_error), "EXCEPTION %u%s", code,
                     s->redirected ? "" : " without DISCONNECT_V3");
            return -1;
        } else if (type == 31) {
            snprintf(cnt.last_error, sizeof(cnt.last_error), "CREATESESSION_RESP: the session was created");
            return -1;
        }
        pos += 4 + len;
    }
    return 0;
}

/* AMQP 1.0: protocol headers (8 bytes, "AMQP"...) and frames (§2.3.1: size, doff, type, channel).
 * sasl-outcome (0x44) must say ok (code 0); the Close (0x18) must carry amqp:connection:redirect. */
static int check_amqp(struct slot *s) {
    static const char redirect[] = "amqp:connection:redirect";
    size_t pos = 0;
    while (pos < s->got) {
        if (s->reply[pos] == 'A') {
            if (pos + 8 > s->got) return 0;
            if (memcmp(s->reply + pos, "AMQP", 4) != 0) break;
            pos += 8;
            continue;
        }
        if (pos + 8 > s->got) return 0;
        uint32_t size = get_be32(s->reply + pos);
        size_t doff = (size_t)s->reply[pos + 4] * 4;
        if (size < 8 || size > REPLY_MAX || doff < 8 || doff > size) break;
        if (pos + size > s->got) return 0;
        const unsigned char *frame = s->reply + pos, *body = frame + doff;
        size_t body_len = size - doff;
        if (body_len >= 3 && body[0] == 0x00 && body[1] == 0x53) {
            if (body[2] == 0x44) { /* sasl-outcome: a list8 or list32 whose first field is the code */
                size_t at = body_len > 3 && body[3] == 0xC0 ? 6 : body_len > 3 && body[3] == 0xD0 ? 12 : 0;
                int ok = at > 0 && body_len >= at + 2 && body[at] == 0x50 && body[at + 1] == 0x00;
                if (!ok) {
                    snprintf(cnt.last_error, sizeof(cnt.last_error), "sasl-outcome is not ok");
                    return -1;
                }
            } else if (body[2] == 0x18) { /* close */
                if (memmem(body, body_len, redirect, sizeof(redirect) - 1) != NULL) return 1;
                snprintf(cnt.last_error, sizeof(cnt.last_error), "Close without amqp:connection:redirect");
                return -1;
            }
        }
        pos += size;
    }
    if (pos < s->got) {
        snprintf(cnt.last_error, sizeof(cnt.last_error), "unreadable AMQP frame at byte %zu", pos);
        return -1;
    }
    return 0;
}

/* 1 = a complete good reply, 0 = need more bytes, -1 = a bad reply. */
static int check_reply(struct slot *s) {
    if (opt.kind == KIND_ECHO || opt.kind == KIND_IDLE) {
        if (s->got < s->req_len) return 0;
        return memcmp(s->reply, s->req, s->req_len) == 0 && s->got == s->req_len ? 1 : -1;
    }
    if (opt.kind == KIND_CORE) return check_core(s);
    if (opt.kind == KIND_AMQP) return check_amqp(s);
    if (s->got < 2) return 0;
    if (s->reply[0] != 0x20) {
        snprintf(cnt.last_error, sizeof(cnt.last_error), "expected a CONNACK, got packet byte 0x%02x",
                 s->reply[0]);
        return -1;
    }
    size_t remaining = 0, mult = 1, i = 1;
    for (;;) {
        if (i >= s->got) return 0;
        if (i > 4) return -1;
        remaining += (size_t)(s->reply[i] & 0x7f) * mult;
        mult *= 128;
        if ((s->reply[i++] & 0x80) == 0) break;
    }
    if (remaining < 2 || i + remaining > REPLY_MAX) return -1;
    if (s->got < i + remaining) return 0;
    int reason = s->reply[i + 1];
    cnt.last_reason = reason;
    if (reason != opt.reason) {
        snprintf(cnt.last_error, sizeof(cnt.last_error), "CONNACK reason 0x%02x, expected 0x%02x", reason,
                 opt.reason);
        return -1;
    }
    return 1;
}

static void release(struct slot *s) {
    if (s->fd >= 0) close(s->fd); /* closing also removes it from the epoll set */
    s->fd = -1;
    s->state = S_FREE;
}

static int send_request(struct slot *s) {
    ssize_t n = send(s->fd, s->req, s->req_len, MSG_NOSIGNAL);
    if (n == (ssize_t)s->req_len) return 0;
    note_error("send", n < 0 ? errno : 0);
    return -1;
}

/* Start a connection in slot s; returns 0, or -1 when it failed at once (counted). */
static int start_conn(int ep, struct slot *s, long seq) {
    cnt.started++;
    s->got = 0;
    s->redirected = 0;
    s->req_len = build_request(s->req, seq);
    s->started = now_s();
    s->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->fd < 0) {
        note_error("socket", errno);
        cnt.connect_errors++;
        s->state = S_FREE;
        return -1;
    }
    int one = 1;
    setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (opt.nsrc > 0) {
        struct sockaddr_in src = {.sin_family = AF_INET, .sin_port = 0};
        src.sin_addr.s_addr = htonl(0x7f000002u + (uint32_t)(seq % opt.nsrc));
        setsockopt(s->fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
        if (bind(s->fd, (struct sockaddr *)&src, sizeof(src)) < 0) {
            note_error("bind", errno);
            cnt.connect_errors++;
            release(s);
            return -1;
        }
    }
    int r = connect(s->fd, (struct sockaddr *)&target, sizeof(target));
    struct epoll_event ev = {.data.ptr = s};
    if (r == 0) {
        if (send_request(s) < 0) {
            cnt.connect_errors++;
            release(s);
            return -1;
        }
        s->state = S_READING;
        ev.events = EPOLLIN;
    } else if (errno == EINPROGRESS) {
        s->state = S_CONNECTING;
        ev.events = EPOLLOUT;
    } else {
        note_error("connect", errno);
        cnt.connect_errors++;
        release(s);
        return -1;
    }
    if (epoll_ctl(ep, EPOLL_CTL_ADD, s->fd, &ev) < 0) {
        note_error("epoll_ctl", errno);
        cnt.connect_errors++;
        release(s);
        return -1;
    }
    return 0;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static double percentile(const uint32_t *sorted, long n, double p) {
    if (n <= 0) return 0;
    long rank = (long)(p * (double)n + 0.999999);
    if (rank < 1) rank = 1;
    if (rank > n) rank = n;
    return (double)sorted[rank - 1];
}

static void print_counters(void) {
    printf("\"ok\":%ld,\"errors\":%ld,\"connect_errors\":%ld,\"resets\":%ld,\"early_eofs\":%ld,"
           "\"bad_replies\":%ld,\"last_reason\":%d,\"last_error\":\"%s\"",
           cnt.ok, cnt.connect_errors + cnt.resets + cnt.early_eofs + cnt.bad_replies, cnt.connect_errors,
           cnt.resets, cnt.early_eofs, cnt.bad_replies, cnt.last_reason, cnt.last_error);
}

/* rate and idle: returns the number of connections kept open (idle) via *kept. */
static int run_connections(int **kept_fds, long *kept) {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) {
        perror("epoll_create1");
        return 1;
    }
    struct slot *slots = calloc((size_t)opt.conc, sizeof(*slots));
    uint32_t *lat = calloc((size_t)opt.total + 1, sizeof(*lat));
    int *keep = opt.kind == KIND_IDLE ? calloc((size_t)opt.total + 1, sizeof(int)) : NULL;
    if (slots == NULL || lat == NULL || (opt.kind == KIND_IDLE && keep == NULL)) {
        perror("calloc");
        return 1;
    }
    for (int i = 0; i < opt.conc; i++) slots[i].fd = -1;
    long n_lat = 0, n_keep = 0, in_flight = 0, seq = 0;
    const double t0 = now_s(), deadline = t0 + opt.seconds;
    double t_last = t0;
    struct epoll_event events[MAX_EVENTS];
    while (!stop) {
        double now = now_s();
        if (now >= deadline) break;
        for (int i = 0; i < opt.conc && seq < opt.total; i++) {
            if (slots[i].state != S_FREE) continue;
            if (start_conn(ep, &slots[i], seq++) == 0) in_flight++;
        }
        if (in_flight == 0 && seq >= opt.total) break;
        int timeout_ms = (int)((deadline - now) * 1000) + 1;
        if (timeout_ms > 100) timeout_ms = 100;
        int n = epoll_wait(ep, events, MAX_EVENTS, timeout_ms);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("epoll_wait");
            return 1;
        }
        for (int e = 0; e < n; e++) {
            struct slot *s = events[e].data.ptr;
            if (s->state == S_FREE) continue;
            int done = 0; /* 1 ok, -1 failed */
            if (s->state == S_CONNECTING) {
                int err = 0;
                socklen_t len = sizeof(err);
                getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len);
                if (err != 0) {
                    note_error("connect", err);
                    cnt.connect_errors++;
                    done = -1;
                } else if (send_request(s) < 0) {
                    cnt.resets++;
                    done = -1;
                } else {
                    s->state = S_READING;
                    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = s};
                    epoll_ctl(ep, EPOLL_CTL_MOD, s->fd, &ev);
                }
            } else {
                ssize_t r = recv(s->fd, s->reply + s->got, REPLY_MAX - s->got, 0);
                if (r == 0) {
                    snprintf(cnt.last_error, sizeof(cnt.last_error), "EOF after %zu reply bytes", s->got);
                    cnt.early_eofs++;
                    done = -1;
                } else if (r < 0) {
                    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                        note_error("recv", errno);
                        cnt.resets++;
                        done = -1;
                    }
                } else {
                    s->got += (size_t)r;
                    int c = check_reply(s);
                    if (c < 0) {
                        cnt.bad_replies++;
                        done = -1;
                    } else if (c > 0) {
                        done = 1;
                    } else if (s->got >= REPLY_MAX) {
                        cnt.bad_replies++;
                        done = -1;
                    }
                }
            }
            if (done == 0) continue;
            in_flight--;
            double t = now_s();
            if (done > 0) {
                cnt.ok++;
                t_last = t;
                lat[n_lat++] = (uint32_t)((t - s->started) * 1e6);
                if (opt.kind == KIND_MQTT3 || opt.kind == KIND_MQTT5) {
                    if (opt.reason == 0) {
                        static const unsigned char disconnect[] = {0xE0, 0x00};
                        send(s->fd, disconnect, sizeof(disconnect), MSG_NOSIGNAL | MSG_DONTWAIT);
                    }
                } else if (opt.kind == KIND_IDLE) {
                    epoll_ctl(ep, EPOLL_CTL_DEL, s->fd, NULL);
                    keep[n_keep++] = s->fd;
                    s->fd = -1;
                }
            }
            release(s);
        }
    }
    double elapsed = (cnt.ok + cnt.connect_errors + cnt.resets + cnt.early_eofs + cnt.bad_replies >= opt.total)
                         ? t_last - t0
                         : now_s() - t0;
    if (elapsed <= 0) elapsed = 1e-9;
    for (int i = 0; i < opt.conc; i++)
        if (slots[i].state != S_FREE) release(&slots[i]);
    qsort(lat, (size_t)n_lat, sizeof(*lat), cmp_u32);
    printf("{\"mode\":\"%s\",", opt.mode);
    print_counters();
    printf(",\"unfinished\":%ld,\"seconds\":%.6f,\"rate\":%.3f,\"conn_p50_us\":%.0f,\"conn_p99_us\":%.0f}\n",
           in_flight + (opt.total - seq), elapsed, (double)cnt.ok / elapsed, percentile(lat, n_lat, 0.50),
           percentile(lat, n_lat, 0.99));
    fflush(stdout);
    free(slots);
    free(lat);
    close(ep);
    *kept_fds = keep;
    *kept = n_keep;
    return 0;
}

static int run_ping(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (fd < 0 || connect(fd, (struct sockaddr *)&target, sizeof(target)) < 0) {
        note_error("connect", errno);
        printf("{\"mode\":\"ping\",\"count\":0,\"errors\":1,\"last_error\":\"%s\"}\n", cnt.last_error);
        return 0;
    }
    if (opt.size < 1) opt.size = 1;
    unsigned char *out = malloc(opt.size), *in = malloc(opt.size);
    uint32_t *lat = calloc((size_t)opt.total + 1, sizeof(*lat));
    if (out == NULL || in == NULL || lat == NULL) return 1;
    for (size_t i = 0; i < opt.size; i++) out[i] = (unsigned char)('a' + i % 26);
    long n_lat = 0, errors = 0;
    const double deadline = now_s() + opt.seconds;
    for (long round = 0; round < opt.warmup + opt.total && !stop; round++) {
        double t = now_s();
        if (t >= deadline) break;
        if (send(fd, out, opt.size, MSG_NOSIGNAL) != (ssize_t)opt.size) {
            note_error("send", errno);
            errors++;
            break;
        }
        size_t got = 0;
        while (got < opt.size) {
            ssize_t r = recv(fd, in + got, opt.size - got, 0);
            if (r <= 0) {
                note_error(r == 0 ? "recv: EOF" : "recv", r == 0 ? 0 : errno);
                errors++;
                break;
            }
            got += (size_t)r;
        }
        if (got < opt.size) break;
        if (round >= opt.warmup) lat[n_lat++] = (uint32_t)((now_s() - t) * 1e9 / 100); /* 0.1 us */
    }
    close(fd);
    qsort(lat, (size_t)n_lat, sizeof(*lat), cmp_u32);
    double sum = 0;
    for (long i = 0; i < n_lat; i++) sum += lat[i];
    printf("{\"mode\":\"ping\",\"count\":%ld,\"errors\":%ld,\"last_error\":\"%s\",\"p50_us\":%.1f,"
           "\"p90_us\":%.1f,\"p99_us\":%.1f,\"max_us\":%.1f,\"mean_us\":%.2f}\n",
           n_lat, errors, cnt.last_error, percentile(lat, n_lat, 0.50) / 10, percentile(lat, n_lat, 0.90) / 10,
           percentile(lat, n_lat, 0.99) / 10, n_lat ? (double)lat[n_lat - 1] / 10 : 0,
           n_lat ? sum / (double)n_lat / 10 : 0);
    fflush(stdout);
    return 0;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* -o HEX -O OFFSET of the core kind: the opening's head, and where its CREATESESSION_V2's length
 * field is; room must be left for the client id field. Returns 0 when both are usable. */
static int parse_core_head(const char *hex) {
    if (hex == NULL) return -1;
    size_t len = strlen(hex);
    if (len % 2 != 0 || len / 2 + 1 + 4 + 2 + ID_MAX > REQ_MAX) return -1;
    for (size_t i = 0; i < len / 2; i++) {
        int high = hex_digit(hex[2 * i]), low = hex_digit(hex[2 * i + 1]);
        if (high < 0 || low < 0) return -1;
        opt.core_head[i] = (unsigned char)(high << 4 | low);
    }
    opt.core_head_len = len / 2;
    if (opt.core_length_at < 7 || (size_t)opt.core_length_at + 4 + 9 > opt.core_head_len) return -1;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) usage();
    opt.mode = argv[1];
    int c;
    optind = 2;
    const char *core_hex = NULL;
    while ((c = getopt(argc, argv, "a:p:c:n:t:k:r:s:i:z:w:o:O:")) != -1) {
        switch (c) {
        case 'a': opt.host = optarg; break;
        case 'p': opt.port = atoi(optarg); break;
        case 'c': opt.conc = atoi(optarg); break;
        case 'n': opt.total = atol(optarg); break;
        case 't': opt.seconds = atof(optarg); break;
        case 'r': opt.reason = (int)strtol(optarg, NULL, 0); break;
        case 's': opt.nsrc = atoi(optarg); break;
        case 'i': opt.id_prefix = optarg; break;
        case 'z': opt.size = (size_t)atol(optarg); break;
        case 'w': opt.warmup = atol(optarg); break;
        case 'o': core_hex = optarg; break;
        case 'O': opt.core_length_at = atol(optarg); break;
        case 'k':
            if (strcmp(optarg, "echo") == 0) opt.kind = KIND_ECHO;
            else if (strcmp(optarg, "mqtt3") == 0) opt.kind = KIND_MQTT3;
            else if (strcmp(optarg, "mqtt5") == 0) opt.kind = KIND_MQTT5;
            else if (strcmp(optarg, "core") == 0) opt.kind = KIND_CORE;
            else if (strcmp(optarg, "amqp") == 0) opt.kind = KIND_AMQP;
            else usage();
            break;
        default: usage();
        }
    }
    if (opt.host == NULL || opt.port <= 0 || opt.conc <= 0 || opt.total <= 0 || opt.seconds <= 0) usage();
    if (strlen(opt.id_prefix) > 40) usage();
    if (opt.kind == KIND_CORE && parse_core_head(core_hex) != 0) usage();
    target.sin_family = AF_INET;
    target.sin_port = htons((uint16_t)opt.port);
    if (inet_pton(AF_INET, opt.host, &target.sin_addr) != 1) usage();
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    raise_nofile();

    if (strcmp(opt.mode, "ping") == 0) return run_ping();
    int *kept = NULL;
    long n_kept = 0;
    if (strcmp(opt.mode, "idle") == 0) opt.kind = KIND_IDLE;
    else if (strcmp(opt.mode, "rate") != 0) usage();
    int status = run_connections(&kept, &n_kept);
    if (status != 0 || opt.kind != KIND_IDLE) return status;
    /* idle: hold the connections until stdin closes or a signal comes */
    char buf[64];
    while (!stop) {
        ssize_t r = read(STDIN_FILENO, buf, sizeof(buf));
        if (r == 0 || (r < 0 && errno != EINTR)) break;
    }
    for (long i = 0; i < n_kept; i++) close(kept[i]);
    free(kept);
    return 0;
}
