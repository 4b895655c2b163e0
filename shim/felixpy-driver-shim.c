/*
 * felixpy-driver-shim: the DataplaneDriver a stock calico-node's Felix execs.
 *
 * Felix (FELIX_USEINTERNALDATAPLANEDRIVER=false, FELIX_DATAPLANEDRIVER=<this file>)
 * execs its external driver with no arguments, writes ToDataplane frames on the
 * driver's fd 3 and reads FromDataplane frames from its fd 4 (8-byte little-endian
 * length, then the protobuf bytes).  felixpy's unix-socket transport
 * (`felixpy run --listen unix:PATH`) speaks the same framing, so this program only
 * relays bytes: fd 3 -> socket, socket -> fd 4.  It never parses a frame.
 *
 * Exit status:
 *   0  Felix closed fd 3 (or fd 4): the socket's write side is shut down, so felixpy
 *      sees a clean end of feed and keeps the kernel as programmed.
 *   1  felixpy could not be reached within FELIXPY_CONNECT_TIMEOUT seconds, or it
 *      closed the socket / the socket failed: Felix sees its driver die and restarts.
 *   2  bad usage (arguments given, fd 3 or fd 4 not open).
 *
 * Environment:
 *   FELIXPY_SOCKET            felixpy's socket (default /var/run/calico/felixpy.sock)
 *   FELIXPY_CONNECT_TIMEOUT   seconds to keep retrying the connect (default 30): in the
 *                             drop-in pod, felixpy's container may still be starting.
 *
 * No runtime dependencies: built with `gcc -static` (calico-node's image has no Python).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define FELIX_IN 3  /* Felix -> driver */
#define FELIX_OUT 4 /* driver -> Felix */
#define DEFAULT_SOCKET "/var/run/calico/felixpy.sock"
#define DEFAULT_CONNECT_TIMEOUT 30.0
#define BUF_SIZE (1 << 16)

static const char *prog = "felixpy-driver-shim";

static void say(const char *fmt, const char *arg) {
    fprintf(stderr, "%s: ", prog);
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Write all of buf; 0 on success, -1 with errno set. */
static int write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

enum relay_result { RELAY_OK, RELAY_EOF, RELAY_READ_ERROR, RELAY_WRITE_ERROR };

/* Move what one read gives from `from` to `to`; errno is left set on the errors. */
static enum relay_result relay(int from, int to) {
    static char buf[BUF_SIZE];
    ssize_t n = read(from, buf, sizeof(buf));
    if (n < 0)
        return errno == EINTR ? RELAY_OK : RELAY_READ_ERROR;
    if (n == 0)
        return RELAY_EOF;
    return write_all(to, buf, (size_t)n) < 0 ? RELAY_WRITE_ERROR : RELAY_OK;
}

static int connect_felixpy(const char *path, double timeout) {
    struct sockaddr_un addr;
    if (strlen(path) >= sizeof(addr.sun_path)) {
        say("socket path too long: %s", path);
        return -1;
    }
    memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    strcpy(addr.sun_path, path);
    double deadline = now() + timeout;
    int warned = 0;
    for (;;) {
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0) {
            say("socket: %s", strerror(errno));
            return -1;
        }
        if (connect(s, (struct sockaddr *)&addr, sizeof(addr)) == 0)
            return s;
        int err = errno;
        close(s);
        if (now() >= deadline) {
            fprintf(stderr, "%s: cannot reach felixpy at %s: %s\n", prog, path, strerror(err));
            return -1;
        }
        if (!warned) {
            fprintf(stderr, "%s: waiting for felixpy at %s (%s)\n", prog, path, strerror(err));
            warned = 1;
        }
        struct timespec pause = {0, 200 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

int main(int argc, char **argv) {
    if (argc > 1) {
        int help = strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0;
        fprintf(help ? stdout : stderr,
                "usage: %s (no arguments; Felix execs it as DataplaneDriver with fds 3 and 4 open)\n"
                "  relays fd 3 -> $FELIXPY_SOCKET (default " DEFAULT_SOCKET ") -> fd 4\n",
                prog);
        return help ? 0 : 2;
    }
    if (fcntl(FELIX_IN, F_GETFD) < 0 || fcntl(FELIX_OUT, F_GETFD) < 0) {
        say("%s", "fd 3 and fd 4 must be open: Felix execs this driver with its pipes there");
        return 2;
    }
    /* A closed peer shows up as EPIPE from write(), not as a signal. */
    signal(SIGPIPE, SIG_IGN);

    const char *path = getenv("FELIXPY_SOCKET");
    if (path == NULL || *path == '\0')
        path = DEFAULT_SOCKET;
    double timeout = DEFAULT_CONNECT_TIMEOUT;
    const char *t = getenv("FELIXPY_CONNECT_TIMEOUT");
    if (t != NULL && *t != '\0') {
        char *end;
        double v = strtod(t, &end);
        if (*end != '\0' || v < 0) {
            say("bad FELIXPY_CONNECT_TIMEOUT %s", t);
            return 2;
        }
        timeout = v;
    }

    int sock = connect_felixpy(path, timeout);
    if (sock < 0)
        return 1;
    fprintf(stderr, "%s: relaying Felix <-> felixpy at %s\n", prog, path);

    struct pollfd fds[2] = {{.fd = FELIX_IN, .events = POLLIN}, {.fd = sock, .events = POLLIN}};
    for (;;) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            say("poll: %s", strerror(errno));
            return 1;
        }
        if (fds[0].revents) {
            int r = relay(FELIX_IN, sock);
            if (r == RELAY_EOF || r == RELAY_READ_ERROR) {
                /* Felix closed its end: a clean end of feed for felixpy. */
                shutdown(sock, SHUT_WR);
                say("%s", "Felix closed fd 3; ending the feed (felixpy keeps the kernel as programmed)");
                return 0;
            }
            if (r == RELAY_WRITE_ERROR) {
                say("felixpy went away (write: %s)", strerror(errno));
                return 1;
            }
        }
        if (fds[1].revents) {
            int r = relay(sock, FELIX_OUT);
            if (r == RELAY_EOF) {
                say("%s", "felixpy closed the connection");
                return 1;
            }
            if (r == RELAY_READ_ERROR) {
                say("felixpy went away (read: %s)", strerror(errno));
                return 1;
            }
            if (r == RELAY_WRITE_ERROR) {
                if (errno == EPIPE) {
                    shutdown(sock, SHUT_WR);
                    say("%s", "Felix closed fd 4; ending the feed");
                    return 0;
                }
                say("write fd 4: %s", strerror(errno));
                return 1;
            }
        }
    }
}
