/* Native launcher for `cni-skel worker` (warm mode), written by
 * `cni-skel install --launcher native` (the default when a C compiler is
 * found). It does the same as cni_skel/warm/client.py on the path every pod
 * takes -- connect, send the request, relay the answer -- without starting an
 * interpreter (a Python launcher costs ~8 ms of CPU a call; this ~0.3 ms).
 *
 * Everything else is the Python launcher's, exec'd with the same stdin
 * (replayed from a memfd when it was already read):
 *   - VERSION and the about text (no CNI_COMMAND): answered there, locally;
 *   - no worker (no socket, connection refused): the plugin runs one-shot
 *     (or code 11 with the worker required), CSK_HANDOVER_LAUNCH;
 *   - the worker certainly did not run it (reset before reading, unknown
 *     plugin, refused, bad request): CSK_HANDOVER_NOT_SERVED with the reason;
 *   - the worker took the request and no whole answer came: CSK_HANDOVER_GONE,
 *     which answers spec error 11 (try again later) in the config's version.
 *
 * The wire format, statuses, limits and environment names are
 * cni_skel/warm/protocol.py's, as CSK_* macros in launcher_protocol.h, which
 * `cni-skel install` generates from it; no value of them is written here.
 * The per-plugin values come in a second generated header (-include):
 * CSK_PYTHON, CSK_SCRIPT, CSK_REF, CSK_SOCKET, CSK_PYTHONPATH (NUL-joined,
 * with CSK_PYTHONPATH_LEN) and CSK_CNI_VERSION. `cni-skel install` appends
 * the info block naming the plugin and socket after the compiled file. */
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
#include "launcher_protocol.h"

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
                mode = CSK_HANDOVER_GONE;
                detail = "cannot replay stdin to the Python launcher";
            }
        } else {
            mode = CSK_HANDOVER_GONE;
            detail = "memfd_create failed; cannot replay stdin to the Python launcher";
        }
    }
    char *argv[] = {(char *)CSK_PYTHON, (char *)"-IS", (char *)"-c", (char *)CSK_SCRIPT,
                    (char *)mode, (char *)(detail ? detail : ""), NULL};
    execv(CSK_PYTHON, argv);
    /* No interpreter: nothing can answer in the spec's format but this. */
    dprintf(1, "{\n    \"cniVersion\": \"%s\",\n    \"code\": 999,\n"
               "    \"msg\": \"cni-skel launcher: cannot run %s\"\n}", CSK_CNI_VERSION,
            CSK_PYTHON);
    _exit(1);
}

static void reason(const char *mode, const char *what, int err) {
    char detail[512];
    snprintf(detail, sizeof detail, "%s%s%s", what, err ? ": " : "", err ? strerror(err) : "");
    fallback(mode, detail);
}

/* The worker took the request and no whole answer came (errno from recv_exact). */
static void gone(void) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
        char detail[64];
        snprintf(detail, sizeof detail, "no answer within %d s", CSK_REPLY_TIMEOUT);
        fallback(CSK_HANDOVER_GONE, detail);
    }
    if (errno) reason(CSK_HANDOVER_GONE, "reading the answer failed", errno);
    reason(CSK_HANDOVER_GONE, "the worker closed the connection without an answer", 0);
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

static void set_u32(unsigned char *b, size_t n) {
    b[0] = (unsigned char)(n >> 24);
    b[1] = (unsigned char)(n >> 16);
    b[2] = (unsigned char)(n >> 8);
    b[3] = (unsigned char)n;
}

static int put_u32(size_t n) {
    unsigned char b[4];
    set_u32(b, n);
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
    if (!cmd || !*cmd || !strcmp(cmd, "VERSION")) fallback(CSK_HANDOVER_LAUNCH, NULL);
    const char *path = getenv(CSK_SOCKET_ENV);
    if (!path || !*path) path = CSK_SOCKET;

    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) fallback(CSK_HANDOVER_LAUNCH, NULL);
    strcpy(addr.sun_path, path);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&addr, sizeof addr) < 0)
        fallback(CSK_HANDOVER_LAUNCH, NULL);  /* no worker: stdin still unread */

    /* stdin first (the request carries it), then the message after it. */
    /* One byte past the limit is enough for the skel to refuse it. */
    while (buf_len <= CSK_MAX_STDIN) {
        if (grow(65536)) fallback(CSK_HANDOVER_LAUNCH, NULL);
        size_t room = buf_cap - buf_len;
        if (room > CSK_MAX_STDIN + 1 - buf_len) room = CSK_MAX_STDIN + 1 - buf_len;
        ssize_t r = read(0, buf + buf_len, room);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            close(s);
            stdin_read = 0;  /* the rest is unreadable: it reports the error itself */
            fallback(CSK_HANDOVER_LAUNCH, NULL);
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

    /* The frame: magic, body length (set once the body is in), fields. */
    size_t msg_off = buf_len;
    if (put(CSK_REQUEST_MAGIC, CSK_MAGIC_LEN) || put_u32(0) ||
        put_field(CSK_KIND_RUN, sizeof CSK_KIND_RUN - 1) ||
        put_field(CSK_REF, strlen(CSK_REF)) ||
        put_field(CSK_PYTHONPATH, CSK_PYTHONPATH_LEN) || put_field(cwd, strlen(cwd)) ||
        put_field(umask_s, (size_t)umask_n) || put_u32(env_len ? env_len - 1 : 0))
        reason(CSK_HANDOVER_NOT_SERVED, "out of memory", 0);
    for (char **e = environ; *e; e++)
        if (put(*e, strlen(*e)) || (e[1] && put("", 1))) reason(CSK_HANDOVER_NOT_SERVED, "out of memory", 0);
    /* The stdin copy comes from buf itself: grow first (realloc may move it). */
    if (put_u32(stdin_len) || grow(stdin_len)) reason(CSK_HANDOVER_NOT_SERVED, "out of memory", 0);
    memcpy(buf + buf_len, buf, stdin_len);
    buf_len += stdin_len;
    size_t msg_len = buf_len - msg_off;
    set_u32((unsigned char *)buf + msg_off + CSK_MAGIC_LEN, msg_len - CSK_REQUEST_HEADER);
    buf_len = stdin_len;  /* buf[0:stdin_len] stays the stdin for a fallback */

    int fds[3];
    fds[0] = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    fds[1] = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    fds[2] = fcntl(2, F_GETFD) >= 0 ? 2 : open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fds[0] < 0 || fds[1] < 0 || fds[2] < 0) reason(CSK_HANDOVER_NOT_SERVED, "opening namespaces", errno);

    struct timeval tv = {.tv_sec = CSK_REPLY_TIMEOUT};
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

    unsigned char head[CSK_REPLY_HEADER];
    int rc = recv_exact(s, head, sizeof head, 0);
    if (rc != 0 && send_err)  /* closed before reading it all: it cannot have run */
        reason(CSK_HANDOVER_NOT_SERVED, "sending the request failed", send_err);
    if (rc == 1) reason(CSK_HANDOVER_NOT_SERVED, "connection reset before the request was read", 0);
    if (rc < 0) gone();
    if (memcmp(head, CSK_REPLY_MAGIC, CSK_MAGIC_LEN))
        reason(CSK_HANDOVER_GONE, "not a cni-skel worker answer", 0);
    uint32_t code = get_u32(head + CSK_REPLY_CODE_AT), len = get_u32(head + CSK_REPLY_LENGTH_AT);
    unsigned status = head[CSK_REPLY_STATUS_AT];
    unsigned char *out = NULL;
    if (len) {
        out = malloc(len);
        if (!out) reason(CSK_HANDOVER_GONE, "out of memory for the answer", 0);
        if (recv_exact(s, out, len, 1)) gone();
    }
    if (status != CSK_ST_DONE) {
        static const char *names[] = CSK_STATUS_NAMES;
        char what[32], detail[1024];
        if (status < CSK_STATUS_COUNT) snprintf(what, sizeof what, "%s", names[status]);
        else snprintf(what, sizeof what, "answer status %u", status);
        snprintf(detail, sizeof detail, "%s: %.*s", what, (int)(len < 900 ? len : 900),
                 out ? (char *)out : "");
        fallback(CSK_HANDOVER_NOT_SERVED, detail);
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
