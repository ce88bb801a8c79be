/* echo_srv: a small epoll echo server, the backend of the benchmark (benchmarks/run.py).
 *
 *   echo_srv HOST PORT [PORT...]
 *
 * Listens on every PORT of HOST (several ports = several backends in one process), echoes every
 * byte back, and closes a connection when the peer has closed its side and everything was
 * echoed. One thread, level-triggered epoll, non-blocking sockets; bytes that cannot be written
 * at once are kept and the connection stops reading until they are gone. Prints "ready" once
 * every port listens. Stops on SIGTERM or SIGINT.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_PORTS 8
#define BUF_SIZE 65536
#define MAX_EVENTS 256

struct conn {
    char *pending; /* bytes read but not yet written back */
    size_t pending_len;
    size_t pending_off;
};

static volatile sig_atomic_t stop;
static struct conn *conns; /* indexed by fd */
static size_t max_fds;
static int listeners[MAX_PORTS];
static int n_listeners;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static int is_listener(int fd) {
    for (int i = 0; i < n_listeners; i++)
        if (listeners[i] == fd) return 1;
    return 0;
}

static void close_conn(int ep, int fd) {
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    free(conns[fd].pending);
    memset(&conns[fd], 0, sizeof(conns[fd]));
    close(fd);
}

static void set_events(int ep, int fd, unsigned events) {
    struct epoll_event ev = {.events = events, .data.fd = fd};
    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
}

/* Write what is pending; returns -1 on a fatal error, 0 when all was written, 1 when some is left. */
static int flush_pending(int fd) {
    struct conn *c = &conns[fd];
    while (c->pending_off < c->pending_len) {
        ssize_t n = send(fd, c->pending + c->pending_off, c->pending_len - c->pending_off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 1;
            if (errno == EINTR) continue;
            return -1;
        }
        c->pending_off += (size_t)n;
    }
    free(c->pending);
    c->pending = NULL;
    c->pending_len = c->pending_off = 0;
    return 0;
}

static void on_readable(int ep, int fd, char *buf) {
    struct conn *c = &conns[fd];
    ssize_t n = recv(fd, buf, BUF_SIZE, 0);
    if (n == 0) {
        close_conn(ep, fd);
        return;
    }
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) close_conn(ep, fd);
        return;
    }
    size_t off = 0;
    while (off < (size_t)n) {
        ssize_t w = send(fd, buf + off, (size_t)n - off, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            close_conn(ep, fd);
            return;
        }
        off += (size_t)w;
    }
    if (off < (size_t)n) {
        c->pending_len = (size_t)n - off;
        c->pending_off = 0;
        c->pending = malloc(c->pending_len);
        if (c->pending == NULL) {
            close_conn(ep, fd);
            return;
        }
        memcpy(c->pending, buf + off, c->pending_len);
        set_events(ep, fd, EPOLLOUT); /* stop reading until the backlog is written */
    }
}

static void accept_all(int ep, int lfd) {
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return; /* EAGAIN, or out of descriptors: try again on the next event */
        if ((size_t)fd >= max_fds) {
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        memset(&conns[fd], 0, sizeof(conns[fd]));
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) close(fd);
    }
}

int main(int argc, char **argv) {
    if (argc < 3 || argc - 2 > MAX_PORTS) {
        fprintf(stderr, "usage: %s HOST PORT [PORT...] (at most %d ports)\n", argv[0], MAX_PORTS);
        return 2;
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    max_fds = rl.rlim_cur == RLIM_INFINITY ? 1048576 : (size_t)rl.rlim_cur;
    conns = calloc(max_fds, sizeof(*conns));
    if (conns == NULL) {
        perror("calloc");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) {
        perror("epoll_create1");
        return 1;
    }
    for (int i = 2; i < argc; i++) {
        struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[i]))};
        if (inet_pton(AF_INET, argv[1], &addr.sin_addr) != 1) {
            fprintf(stderr, "echo_srv: bad IPv4 address %s\n", argv[1]);
            return 2;
        }
        int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        int one = 1;
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) < 0 || listen(lfd, 4096) < 0) {
            fprintf(stderr, "echo_srv: cannot listen on %s:%s: %s\n", argv[1], argv[i], strerror(errno));
            return 1;
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
        epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
        listeners[n_listeners++] = lfd;
    }
    printf("ready\n");
    fflush(stdout);

    char *buf = malloc(BUF_SIZE);
    struct epoll_event events[MAX_EVENTS];
    if (buf == NULL) return 1;
    while (!stop) {
        int n = epoll_wait(ep, events, MAX_EVENTS, 500);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("epoll_wait");
            return 1;
        }
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (is_listener(fd)) {
                accept_all(ep, fd);
                continue;
            }
            if (events[i].events & EPOLLOUT) {
                int r = flush_pending(fd);
                if (r < 0)
                    close_conn(ep, fd);
                else if (r == 0)
                    set_events(ep, fd, EPOLLIN);
                continue;
            }
            if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_readable(ep, fd, buf);
        }
    }
    free(buf);
    return 0;
}
