/* Native launcher for `cni-skel worker` (warm mode), written by
 * `cni-skel install --launcher native` (the default when a C compiler is
 * found). It does the same as cni_skel/launcher.py on the path every pod
 * takes -- connect, send the request, relay the answer -- without starting an
 * interpreter (a Python launcher costs ~8 ms of CPU a call; this ~0.3 ms).
 *
 * Everything else is the Python launcher's, exec'd with the same stdin
 * (replayed from a memfd when it was already read):
 *   - VERSION and the about text (no CNI_COMMAND): answered there, locally;
 *   - no worker (no socket, connection refused): the plugin runs one-shot
 *     (or code 11 with CNI_SKEL_WORKER_REQUIRED), mode "launch";
 *   - the worker certainly did not run it (reset before reading, unknown
 *     plugin, refused, bad request): mode "notserved" with the reason;
 *   - the worker took the request and no whole answer came: mode "gone",
 *     which answers spec error 11 (try again later) in the config's version.
 *
 * The wire format is launcher.py's (see there). Compiled with a generated
 * header defining CSK_PYTHON, CSK_SCRIPT, CSK_REF, CSK_SOCKET, CSK_PYTHONPATH
 * (NUL-joined, with CSK_PYTHONPATH_LEN), CSK_MAX_STDIN (launcher.py's
 * MAX_STDIN_BYTES) and CSK_INFO (the marker that
 * `cni-skel install` and the worker read back from the file). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef CSK_PYTHON
#include "launcher_config.h"
#endif

/* Kept in the binary for `cni-skel install` (overwrite check) and the worker
 * (in-process delegation): "CNI-SKEL-LAUNCHER\n ref=...\n socket=...\n". */
__attribute__((used)) static const char csk_info[] = CSK_INFO;

#define REPLY_TIMEOUT_S 600
#define ST_DONE 0

static char *buf;  /* stdin, once read */
static size_t buf_len, buf_cap;
static int stdin_read;

/* Hand over to the Python launcher (never returns). */
static void fallback(const char *mode, const char *detail) {
    if (stdin_read) {
        int fd = memfd_create("cni-skel-stdin", 0);
        if (fd >= 0) {
            size_t off = 0;
            while (off < buf_len) {
                ssize_t n = write(fd, buf + off, buf_len - off);
                if (n < 0 && errno == EINTR) continue;
                if (n <= 0) break;
                off += (size_t)n;
            }
            if (off == buf_len && lseek(fd, 0, SEEK_SET) == 0 && dup2(fd, 0) == 0) {
                if (fd != 0) close(fd);
            } else {
                mode = "gone";
                detail = "cannot replay stdin to the Python launcher";
            }
        } else {
            mode = "gone";
            detail = "memfd_create failed; cannot replay stdin to the Python launcher";
        }
    }
    char *argv[] = {(char *)CSK_PYTHON, (char *)"-IS", (char *)"-c", (char *)CSK_SCRIPT,
                    (char *)mode, (char *)(detail ? detail : ""), NULL};
    execv(CSK_PYTHON, argv);
    /* No interpreter: nothing can answer in the spec's format but this. */
    dprintf(1, "{\n    \"cniVersion\": \"1.1.0\",\n    \"code\": 999,\n"
               "    \"msg\": \"cni-skel launcher: cannot run %s\"\n}", CSK_PYTHON);
    _exit(1);
}

static void reason(const char *mode, const char *what, int err) {
    char detail[512];
    snprintf(detail, sizeof detail, "%s%s%s", what, err ? ": " : "", err ? strerror(err) : "");
    fallback(mode, detail);
}

static int grow(size_t need) {
    if (buf_len + need <= buf_cap) return 0;
    size_t cap = buf_cap ? buf_cap : 65536;
    while (cap < buf_len + need) cap *= 2;
    char *p = realloc(buf, cap);
    if (!p) return -1;
    buf = p;
    buf_cap = cap;
    return 0;
}

static int put(const void *data, size_t n) {
    if (grow(n)) return -1;
    memcpy(buf + buf_len, data, n);
    buf_len += n;
    return 0;
}

static int put_u32(size_t n) {
    unsigned char b[4] = {(unsigned char)(n >> 24), (unsigned char)(n >> 16),
                          (unsigned char)(n >> 8), (unsigned char)n};
    return put(b, 4);
}

static int put_field(const void *data, size_t n) {
    return put_u32(n) || put(data, n);
}

/* Receive exactly n bytes. 0: done; 1: reset before anything came (not run);
 * -1: anything else (gone), errno or 0 for EOF. */
static int recv_exact(int s, unsigned char *out, size_t n, int got_any) {
    size_t have = 0;
    while (have < n) {
        ssize_t r = recv(s, out + have, n - have, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == ECONNRESET && !got_any && !have) return 1;
        if (r <= 0) {
            if (r == 0) errno = 0;
            return -1;
        }
        have += (size_t)r;
    }
    return 0;
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

extern char **environ;

int main(void) {
    const char *cmd = getenv("CNI_COMMAND");
    if (!cmd || !*cmd || !strcmp(cmd, "VERSION")) fallback("launch", NULL);
    const char *path = getenv("CNI_SKEL_WORKER_SOCKET");
    if (!path || !*path) path = CSK_SOCKET;

    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) fallback("launch", NULL);
    strcpy(addr.sun_path, path);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&addr, sizeof addr) < 0)
        fallback("launch", NULL);  /* no worker: stdin still unread */

    /* stdin first (the request carries it), then the message after it. */
    /* One byte past the limit is enough for the skel to refuse it. */
    while (buf_len <= CSK_MAX_STDIN) {
        if (grow(65536)) fallback("launch", NULL);
        size_t room = buf_cap - buf_len;
        if (room > CSK_MAX_STDIN + 1 - buf_len) room = CSK_MAX_STDIN + 1 - buf_len;
        ssize_t r = read(0, buf + buf_len, room);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            close(s);
            stdin_read = 0;  /* the rest is unreadable: it reports the error itself */
            fallback("launch", NULL);
        }
        stdin_read = 1;
        if (r == 0) break;
        buf_len += (size_t)r;
    }
    size_t stdin_len = buf_len;

    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd)) strcpy(cwd, "/");
    mode_t mask = umask(022);
    umask(mask);
    char umask_s[16];
    int umask_n = snprintf(umask_s, sizeof umask_s, "%u", (unsigned)mask);

    size_t env_len = 0;
    for (char **e = environ; *e; e++) env_len += strlen(*e) + 1;

    size_t body = 4 + 3 + 4 + strlen(CSK_REF) + 4 + CSK_PYTHONPATH_LEN + 4 + strlen(cwd) +
                  4 + (size_t)umask_n + 4 + (env_len ? env_len - 1 : 0) + 4 + stdin_len;
    size_t msg_off = buf_len;
    if (put("CSKQ", 4) || put_u32(body) || put_field("run", 3) ||
        put_field(CSK_REF, strlen(CSK_REF)) ||
        put_field(CSK_PYTHONPATH, CSK_PYTHONPATH_LEN) || put_field(cwd, strlen(cwd)) ||
        put_field(umask_s, (size_t)umask_n) || put_u32(env_len ? env_len - 1 : 0))
        reason("notserved", "out of memory", 0);
    for (char **e = environ; *e; e++)
        if (put(*e, strlen(*e)) || (e[1] && put("", 1))) reason("notserved", "out of memory", 0);
    /* The stdin copy comes from buf itself: grow first (realloc may move it). */
    if (put_u32(stdin_len) || grow(stdin_len)) reason("notserved", "out of memory", 0);
    memcpy(buf + buf_len, buf, stdin_len);
    buf_len += stdin_len;
    size_t msg_len = buf_len - msg_off;
    buf_len = stdin_len;  /* buf[0:stdin_len] stays the stdin for a fallback */

    int fds[3];
    fds[0] = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    fds[1] = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    fds[2] = fcntl(2, F_GETFD) >= 0 ? 2 : open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fds[0] < 0 || fds[1] < 0 || fds[2] < 0) reason("notserved", "opening namespaces", errno);

    struct timeval tv = {.tv_sec = REPLY_TIMEOUT_S};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);

    char *msg = buf + msg_off;
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof fds)];
    } anc;
    memset(&anc, 0, sizeof anc);
    struct iovec iov = {.iov_base = msg, .iov_len = msg_len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = anc.space,
                        .msg_controllen = sizeof anc.space};
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(c), fds, sizeof fds);

    ssize_t sent;
    do sent = sendmsg(s, &mh, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    int send_err = sent < 0 ? errno : 0;
    while (!send_err && (size_t)sent < msg_len) {
        ssize_t n = send(s, msg + sent, msg_len - (size_t)sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) send_err = errno;
        else sent += n;
    }

    unsigned char head[13];
    int rc = recv_exact(s, head, sizeof head, 0);
    if (rc != 0 && send_err)  /* closed before reading it all: it cannot have run */
        reason("notserved", "sending the request failed", send_err);
    if (rc == 1) reason("notserved", "connection reset before the request was read", 0);
    if (rc < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            reason("gone", "no answer within 600 s", 0);
        if (errno) reason("gone", "reading the answer failed", errno);
        reason("gone", "the worker closed the connection without an answer", 0);
    }
    if (memcmp(head, "CSKR", 4)) reason("gone", "not a cni-skel worker answer", 0);
    uint32_t code = get_u32(head + 5), len = get_u32(head + 9);
    unsigned char *out = NULL;
    if (len) {
        out = malloc(len);
        if (!out) reason("gone", "out of memory for the answer", 0);
        if (recv_exact(s, out, len, 1)) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                reason("gone", "no answer within 600 s", 0);
            if (errno) reason("gone", "reading the answer failed", errno);
            reason("gone", "the worker closed the connection without an answer", 0);
        }
    }
    if (head[4] != ST_DONE) {
        static const char *names[] = {"done", "unknown plugin", "refused", "bad request"};
        char detail[1024];
        snprintf(detail, sizeof detail, "%s: %.*s",
                 head[4] < 4 ? names[head[4]] : "unexpected answer status",
                 (int)(len < 900 ? len : 900), out ? (char *)out : "");
        fallback("notserved", detail);
    }
    size_t off = 0;
    while (off < len) {
        ssize_t n = write(1, out + off, len - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        off += (size_t)n;
    }
    return (int)(code & 0xff);
}
