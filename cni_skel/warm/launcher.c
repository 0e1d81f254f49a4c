/* Native launcher for `cni-skel worker` (warm mode), written by
 * `cni-skel install` (the default when a C compiler is found). It does what
 * cni_skel/warm/client.py does without starting an interpreter (a Python
 * launcher costs ~8 ms of CPU a call; this ~0.3 ms):
 *   - VERSION and the about text (no CNI_COMMAND): answered from data baked
 *     at install, with the bytes the plugin's skel prints;
 *   - any other verb: connect, send the request (with this process's network
 *     and mount namespaces, stderr and the pod's network namespace as fds),
 *     relay the answer;
 *   - the worker cannot serve it: with `--fallback none` (or
 *     CNI_SKEL_WORKER_REQUIRED set) spec error 11 naming the socket (STATUS:
 *     50), never 999 or an empty stdout; with `--fallback oneshot` a warning
 *     on stderr, a line in the socket directory's fallback log, and the
 *     Python launcher code exec'd to run the plugin one-shot (stdin replayed
 *     from a memfd when it was already read);
 *   - the worker took the request and no whole answer came: spec error 11;
 *   - the worker does not speak this launcher's protocol: spec error 11
 *     naming both versions.
 * Python is exec'd only for a one-shot run and for a VERSION config the
 * small JSON reader below leaves to the json module (escapes, non-ASCII);
 * with `--fallback none` never (such a VERSION config then gets the current
 * version).
 *
 * The wire format, statuses, limits and environment names are
 * cni_skel/warm/protocol.py's, as CSK_* macros in launcher_protocol.h, which
 * `cni-skel install` generates from it; no value of them is written here.
 * The per-plugin values come in a second generated header (-include):
 * CSK_PYTHON, CSK_SCRIPT, CSK_REF, CSK_NAME, CSK_SOCKET, CSK_PYTHONPATH
 * (NUL-joined, with CSK_PYTHONPATH_LEN), CSK_CNI_VERSION, CSK_ALL_VERSIONS,
 * CSK_SUPPORTED_JSON and CSK_ABOUT (NULL when not baked), CSK_FALLBACK_NONE
 * and CSK_LAUNCHER_DESC. `cni-skel install` appends the info block naming
 * the plugin and socket after the compiled file. */
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
#include <time.h>
#include <unistd.h>

#ifndef CSK_PYTHON
#include "launcher_config.h"
#endif
#include "launcher_protocol.h"

static char *buf;  /* stdin, once read */
static size_t buf_len, buf_cap;
static int stdin_read;
static const char *sock_path = CSK_SOCKET;
static const char *cmd;

static void write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

/* ---- a growing output string ------------------------------------------ */

struct out {
    char *p;
    size_t n, cap;
};

static void out_put(struct out *o, const char *s, size_t n) {
    if (o->n + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 1024;
        while (cap < o->n + n + 1) cap *= 2;
        char *p = realloc(o->p, cap);
        if (!p) return;  /* out of memory: the answer is cut, never garbage */
        o->p = p;
        o->cap = cap;
    }
    memcpy(o->p + o->n, s, n);
    o->n += n;
    o->p[o->n] = 0;
}

static void out_str(struct out *o, const char *s) { out_put(o, s, strlen(s)); }

/* A string as json.dumps writes it (ensure_ascii); bytes that are not UTF-8
 * become U+FFFD, as Python's "replace" decoding makes them. */
static void out_jstr(struct out *o, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    char esc[16];
    out_put(o, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            out_put(o, esc, 2);
            i++;
            continue;
        }
        if (c >= 0x20 && c < 0x7f) {
            out_put(o, (const char *)u + i, 1);
            i++;
            continue;
        }
        const char *short_esc = c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t"
                               : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        if (short_esc) {
            out_str(o, short_esc);
            i++;
            continue;
        }
        uint32_t cp = 0xFFFD;
        size_t len = 1;
        if (c >= 0xC2 && c <= 0xF4) {
            size_t need = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            uint32_t v = c & (need == 2 ? 0x1F : need == 3 ? 0x0F : 0x07);
            size_t k = 1;
            for (; k < need && i + k < n && (u[i + k] & 0xC0) == 0x80; k++)
                v = v << 6 | (u[i + k] & 0x3F);
            if (k == need && !(need == 3 && v < 0x800) && !(need == 4 && v < 0x10000) &&
                !(v >= 0xD800 && v <= 0xDFFF) && v <= 0x10FFFF) {
                cp = v;
                len = need;
            }
        } else if (c < 0x80) {
            cp = c;
        }
        if (cp > 0xFFFF) {
            cp -= 0x10000;
            snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 | (cp >> 10), 0xDC00 | (cp & 0x3FF));
        } else {
            snprintf(esc, sizeof esc, "\\u%04x", cp);
        }
        out_str(o, esc);
        i += len;
    }
    out_put(o, "\"", 1);
}

/* ---- the config's cniVersion, without a JSON library --------------------
 * json.loads' grammar for UTF-8 input: the whole document is checked, and
 * the last top-level "cniVersion" key, in any ASCII case, wins (as Go reads it). What json
 * would decode differently than read here -- NUL bytes or a BOM (other
 * encodings), and a cniVersion value with escapes or non-ASCII characters
 * -- is J_UNSURE: left to the json module (or, with no Python, answered as
 * not a version). */

enum { J_OK, J_INVALID, J_UNSURE };
#define J_MAX_DEPTH 200

struct jscan {
    const unsigned char *b;
    size_t n, i;
    const unsigned char *ver;  /* the top-level cniVersion when it is a plain string */
    size_t ver_len;
    int ver_unsure;  /* ... when it is a string with escapes or non-ASCII */
};

/* "cniVersion" in any ASCII case: Go's encoding/json matches keys to fields
 * case-insensitively, the last one winning (protocol.go_field, the rule the
 * Python side follows). */
static int j_version_key(const unsigned char *k) {
    static const char want[] = "cniversion";
    for (size_t i = 0; i < 10; i++) {
        unsigned char c = k[i];
        if (c >= 'A' && c <= 'Z') c = (unsigned char)(c - 'A' + 'a');
        if (c != (unsigned char)want[i]) return 0;
    }
    return 1;
}

static void j_ws(struct jscan *s) {
    while (s->i < s->n && (s->b[s->i] == ' ' || s->b[s->i] == '\t' || s->b[s->i] == '\n' ||
                           s->b[s->i] == '\r'))
        s->i++;
}

static int j_digit(struct jscan *s, size_t j) { return j < s->n && s->b[j] >= '0' && s->b[j] <= '9'; }

static size_t j_digits(struct jscan *s, size_t j) {
    while (j_digit(s, j)) j++;
    return j;
}

static int j_hex(unsigned c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Whether b[0:n] is UTF-8 as Python's strict decoder takes it. */
static int utf8_ok(const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = b[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                      : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!need || i + need > n) return 0;
        for (size_t k = 1; k < need; k++)
            if ((b[i + k] & 0xC0) != 0x80) return 0;
        if ((c == 0xE0 && b[i + 1] < 0xA0) || (c == 0xED && b[i + 1] > 0x9F) ||
            (c == 0xF0 && b[i + 1] < 0x90) || (c == 0xF4 && b[i + 1] > 0x8F))
            return 0;
        i += need;
    }
    return 1;
}

/* One value at s->i; sets *str/*str_len (and *plain: no escape, ASCII) when
 * it is a string. */
static int j_value(struct jscan *s, int depth, const unsigned char **str, size_t *str_len,
                   int *plain) {
    if (depth > J_MAX_DEPTH) return J_UNSURE;
    if (s->i >= s->n) return J_INVALID;
    unsigned c = s->b[s->i];
    if (str) *str = NULL;
    if (c == '"') {
        size_t j = s->i + 1;
        int simple = 1;
        while (j < s->n && s->b[j] != '"') {
            if (s->b[j] < 0x20) return J_INVALID;
            if (s->b[j] >= 0x80) simple = 0;
            if (s->b[j] == '\\') {
                simple = 0;
                if (j + 1 >= s->n) return J_INVALID;
                unsigned e = s->b[j + 1];
                if (e == 'u') {
                    if (j + 5 >= s->n || !j_hex(s->b[j + 2]) || !j_hex(s->b[j + 3]) ||
                        !j_hex(s->b[j + 4]) || !j_hex(s->b[j + 5]))
                        return J_INVALID;
                    j += 6;
                    continue;
                }
                if (!strchr("\"\\/bfnrt", (int)e) || !e) return J_INVALID;
                j += 2;
                continue;
            }
            j++;
        }
        if (j >= s->n) return J_INVALID;
        if (str) {
            *str = s->b + s->i + 1;
            *str_len = j - s->i - 1;
            *plain = simple;
        }
        s->i = j + 1;
        return J_OK;
    }
    if (c == '{' || c == '[') {
        int obj = c == '{';
        unsigned close = obj ? '}' : ']';
        s->i++;
        j_ws(s);
        if (s->i < s->n && s->b[s->i] == close) {
            s->i++;
            return J_OK;
        }
        for (;;) {
            int rc;
            if (obj) {
                const unsigned char *key;
                size_t key_len;
                int key_plain;
                if (s->i >= s->n || s->b[s->i] != '"') return J_INVALID;
                if ((rc = j_value(s, depth + 1, &key, &key_len, &key_plain))) return rc;
                j_ws(s);
                if (s->i >= s->n || s->b[s->i] != ':') return J_INVALID;
                s->i++;
                j_ws(s);
                const unsigned char *v;
                size_t v_len;
                int v_plain = 1;
                if ((rc = j_value(s, depth + 1, &v, &v_len, &v_plain))) return rc;
                if (depth == 0 && !key_plain && memchr(key, '\\', key_len)) {
                    /* an escaped key might spell cniVersion: json decides */
                    return J_UNSURE;
                }
                if (depth == 0 && key_len == 10 && j_version_key(key)) {
                    s->ver = v;
                    s->ver_len = v ? v_len : 0;
                    s->ver_unsure = v && !v_plain;
                }
            } else if ((rc = j_value(s, depth + 1, NULL, NULL, NULL))) {
                return rc;
            }
            j_ws(s);
            if (s->i < s->n && s->b[s->i] == close) {
                s->i++;
                return J_OK;
            }
            if (s->i >= s->n || s->b[s->i] != ',') return J_INVALID;
            s->i++;
            j_ws(s);
        }
    }
    static const char *lits[] = {"null", "true", "false", "NaN", "Infinity", "-Infinity"};
    for (size_t k = 0; k < sizeof lits / sizeof *lits; k++) {
        size_t l = strlen(lits[k]);
        if (s->n - s->i >= l && !memcmp(s->b + s->i, lits[k], l)) {
            s->i += l;
            return J_OK;
        }
    }
    size_t j = c == '-' ? s->i + 1 : s->i;  /* -?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)? */
    if (!j_digit(s, j)) return J_INVALID;
    j = s->b[j] == '0' ? j + 1 : j_digits(s, j);
    if (j < s->n && s->b[j] == '.' && j_digit(s, j + 1)) j = j_digits(s, j + 1);
    if (j < s->n && (s->b[j] == 'e' || s->b[j] == 'E')) {
        size_t k = j + 1 + (j + 1 < s->n && (s->b[j + 1] == '+' || s->b[j + 1] == '-'));
        if (j_digit(s, k)) j = j_digits(s, k);
    }
    s->i = j;
    return J_OK;
}

/* J_OK (s->ver: the top-level cniVersion, a plain string, or NULL),
 * J_INVALID (json.loads would refuse it), J_UNSURE (left to the json
 * module). */
static int j_scan(struct jscan *s, const char *data, size_t n) {
    memset(s, 0, sizeof *s);
    s->b = (const unsigned char *)data;
    s->n = n;
    if (memchr(data, 0, n) || (n >= 3 && !memcmp(data, "\xEF\xBB\xBF", 3))) return J_UNSURE;
    if (!utf8_ok(s->b, n)) return J_INVALID;  /* json.loads: UnicodeDecodeError */
    j_ws(s);
    int rc = j_value(s, 0, NULL, NULL, NULL);
    if (rc) return rc;
    j_ws(s);
    if (s->i != s->n) return J_INVALID;
    if (s->ver_unsure) return J_UNSURE;
    return J_OK;  /* s->ver is only ever set for a key of the top-level object */
}

/* skel's parse_version: ^\d+\.\d+\.\d+$ (ASCII here). */
static int is_version(const unsigned char *v, size_t n) {
    int parts = 0;
    size_t i = 0;
    while (parts < 3) {
        size_t start = i;
        while (i < n && v[i] >= '0' && v[i] <= '9') i++;
        if (i == start) return 0;
        parts++;
        if (parts < 3) {
            if (i >= n || v[i] != '.') return 0;
            i++;
        }
    }
    return i == n;
}

/* ---- answers ------------------------------------------------------------ */

#define NORETURN __attribute__((noreturn))
/* Hand over to the Python launcher code. */
static NORETURN void python(const char *mode, const char *detail);

/* The Error object skel prints, in the config's cniVersion when it is one
 * we know (else the current one); exits 1. */
static NORETURN void answer_error(int code, const char *msg, const char *details) {
    static const char *known[] = CSK_ALL_VERSIONS;
    const char *version = CSK_CNI_VERSION;
    struct jscan s;
    if (stdin_read && j_scan(&s, buf, buf_len) == J_OK && s.ver)
        for (size_t k = 0; k < sizeof known / sizeof *known; k++)
            if (strlen(known[k]) == s.ver_len && !memcmp(known[k], s.ver, s.ver_len))
                version = known[k];
    struct out o = {0};
    out_str(&o, "{\n    \"cniVersion\": ");
    out_jstr(&o, version, strlen(version));
    char num[32];
    snprintf(num, sizeof num, ",\n    \"code\": %d,\n    \"msg\": ", code);
    out_str(&o, num);
    out_jstr(&o, msg, strlen(msg));
    if (details && *details) {
        out_str(&o, ",\n    \"details\": ");
        out_jstr(&o, details, strlen(details));
    }
    out_str(&o, "\n}");
    if (o.p) write_all(1, o.p, o.n);
    _exit(1);
}

static int read_stdin(void) {
    /* One byte past the limit is enough for the skel to refuse it. */
    while (buf_len <= CSK_MAX_STDIN) {
        if (buf_len == buf_cap) {
            size_t cap = buf_cap ? buf_cap * 2 : 65536;
            char *p = realloc(buf, cap);
            if (!p) return -1;
            buf = p;
            buf_cap = cap;
        }
        size_t room = buf_cap - buf_len;
        if (room > CSK_MAX_STDIN + 1 - buf_len) room = CSK_MAX_STDIN + 1 - buf_len;
        ssize_t r = read(0, buf + buf_len, room);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        stdin_read = 1;
        if (r == 0) break;
        buf_len += (size_t)r;
    }
    stdin_read = 1;
    return 0;
}

static NORETURN void version_answer(void) {
    const char *asked = CSK_CNI_VERSION;
    size_t asked_len = strlen(asked);
    if (!isatty(0) && read_stdin()) {
        if (!CSK_FALLBACK_NONE) python(CSK_HANDOVER_LAUNCH, NULL);  /* it reports the error */
        answer_error(CSK_ERR_IO, "cni-skel launcher: reading stdin failed", strerror(errno));
    }
    int blank = 1;
    for (size_t k = 0; k < buf_len && blank; k++) blank = strchr(" \t\n\r\v\f", buf[k]) && buf[k];
    if (!blank) {
        struct jscan s;
        int rc = j_scan(&s, buf, buf_len);
        if (rc == J_UNSURE && !CSK_FALLBACK_NONE) python(CSK_HANDOVER_LAUNCH, NULL);
        if (rc == J_OK && s.ver && is_version(s.ver, s.ver_len)) {
            asked = (const char *)s.ver;
            asked_len = s.ver_len;
        }
    }
    struct out o = {0};
    out_str(&o, "{\n    \"cniVersion\": ");
    out_jstr(&o, asked, asked_len);
    out_str(&o, ",\n    \"supportedVersions\": ");
    out_str(&o, CSK_SUPPORTED_JSON);
    out_str(&o, "\n}");
    if (o.p) write_all(1, o.p, o.n);
    _exit(0);
}

static int worker_required(void) {
    const char *v = getenv(CSK_REQUIRED_ENV);
    return CSK_FALLBACK_NONE || (v && *v && strcmp(v, "0"));
}

/* The worker could not serve the call (`why`): code 11 (STATUS: 50), or a
 * one-shot run with a warning and a line in the fallback log. */
static NORETURN void not_served(const char *why) {
    if (worker_required()) {
        if (!stdin_read) read_stdin();  /* for the error's cniVersion only */
        char details[1536];
        snprintf(details, sizeof details,
                 "%s (socket %s); %s, so the plugin was not run in the launcher's process: start "
                 "the worker (systemctl start cni-skel-worker.socket, or the DaemonSet) and try "
                 "again",
                 why, sock_path,
                 CSK_FALLBACK_NONE ? "this launcher was installed with --fallback none"
                                   : CSK_REQUIRED_ENV " is set");
        answer_error(!strcmp(cmd, "STATUS") ? CSK_ERR_NOT_AVAILABLE : CSK_ERR_TRY_AGAIN_LATER,
                     strncmp(why, "cannot connect", 14) ? "cni-skel worker did not serve the "
                     "request" : "cni-skel worker not reachable", details);
    }
    char line[1024];
    int n = snprintf(line, sizeof line,
                     "cni-skel: %s: worker not reachable (%s, socket %s); running it one-shot\n",
                     CSK_NAME, why, sock_path);
    write_all(2, line, n < (int)sizeof line ? (size_t)n : sizeof line - 1);
    /* One line in the socket directory's fallback log, when the directory exists. */
    char logp[sizeof ((struct sockaddr_un *)0)->sun_path + sizeof CSK_FALLBACK_LOG + 1];
    const char *slash = strrchr(sock_path, '/');
    size_t dir_len = slash ? (size_t)(slash - sock_path) : 0;
    if (slash && dir_len + 1 + sizeof CSK_FALLBACK_LOG <= sizeof logp) {
        snprintf(logp, sizeof logp, "%.*s/%s", (int)dir_len, sock_path, CSK_FALLBACK_LOG);
        int fd = open(logp,
                      O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
        struct stat st;
        if (fd >= 0 && !fstat(fd, &st) && S_ISREG(st.st_mode) && st.st_size < CSK_FALLBACK_LOG_MAX) {
            const char *cid = getenv("CNI_CONTAINERID");
            n = snprintf(line, sizeof line, "%lld %s %s %.128s %s\n", (long long)time(NULL), cmd,
                         CSK_REF, cid && *cid ? cid : "-", why);
            for (char *p = line; *p && p < line + sizeof line - 2; p++)
                if (*p == '\n' && p[1]) *p = ' ';
            write_all(fd, line, n < (int)sizeof line ? (size_t)n : sizeof line - 1);
        }
        if (fd >= 0) close(fd);
    }
    python(CSK_HANDOVER_NOT_SERVED, why);
}

static NORETURN void python(const char *mode, const char *detail) {
    if (stdin_read) {
        int fd = memfd_create("cni-skel-stdin", MFD_CLOEXEC);
        size_t off = 0;
        if (fd >= 0) {
            while (off < buf_len) {
                ssize_t n = write(fd, buf + off, buf_len - off);
                if (n < 0 && errno == EINTR) continue;
                if (n <= 0) break;
                off += (size_t)n;
            }
        }
        if (fd < 0 || off != buf_len || lseek(fd, 0, SEEK_SET) != 0 || dup2(fd, 0) != 0)
            answer_error(CSK_ERR_IO, "cni-skel launcher: cannot replay stdin to the Python "
                                     "launcher code", strerror(errno));
        close(fd);
    }
    char *argv[] = {(char *)CSK_PYTHON, (char *)"-IS", (char *)"-c", (char *)CSK_SCRIPT,
                    (char *)mode, (char *)(detail ? detail : ""), NULL};
    execv(CSK_PYTHON, argv);
    int err = errno;
    if (!stdin_read) read_stdin();  /* for the error's cniVersion only */
    char msg[512], details[1024];
    snprintf(msg, sizeof msg, "cni-skel launcher: cannot run the interpreter %s: %s", CSK_PYTHON,
             strerror(err));
    snprintf(details, sizeof details,
             "%s needs it to run plugin %s in its own process (the worker did not serve the "
             "call); the virtualenv or Python it was installed with is gone: run `cni-skel "
             "install` again, or start the worker", CSK_NAME, CSK_REF);
    answer_error(cmd && !strcmp(cmd, "STATUS") ? CSK_ERR_NOT_AVAILABLE : CSK_ERR_IO, msg, details);
}

static NORETURN void gone(const char *why, int err) {
    char details[1024];
    snprintf(details, sizeof details, "%s%s%s (socket %s); the plugin may or may not have run: "
             "try again later", why, err ? ": " : "", err ? strerror(err) : "", sock_path);
    answer_error(CSK_ERR_TRY_AGAIN_LATER, "cni-skel worker went away during the request", details);
}

/* ---- the request -------------------------------------------------------- */

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

/* The pod's network namespace as an fd, when CNI_NETNS names a regular file
 * (nsfs inodes are): never open a FIFO or a device here. -1 otherwise. */
static int open_pod_netns(void) {
    const char *p = getenv("CNI_NETNS");
    struct stat st;
    if (!p || !*p || stat(p, &st) || !S_ISREG(st.st_mode)) return -1;
    return open(p, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
}

extern char **environ;

int main(void) {
    cmd = getenv("CNI_COMMAND");
    if (!cmd || !*cmd) {  /* a human asking: the about text */
        if (!CSK_ABOUT) python(CSK_HANDOVER_LAUNCH, NULL);
        write_all(2, CSK_ABOUT, strlen(CSK_ABOUT));
        return 0;
    }
    if (!strcmp(cmd, "VERSION")) {
        if (!CSK_SUPPORTED_JSON) python(CSK_HANDOVER_LAUNCH, NULL);
        version_answer();
    }
    const char *env_path = getenv(CSK_SOCKET_ENV);
    if (env_path && *env_path) sock_path = env_path;

    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(sock_path) >= sizeof addr.sun_path) not_served("socket path too long");
    strcpy(addr.sun_path, sock_path);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&addr, sizeof addr) < 0) {
        char why[256];
        snprintf(why, sizeof why, "cannot connect: %s", strerror(errno));
        not_served(why);  /* stdin still unread */
    }

    /* stdin first (the request carries it), then the message after it. */
    if (read_stdin()) {
        int err = errno;
        close(s);
        if (!worker_required()) {
            stdin_read = 0;  /* the rest is unreadable: the one-shot run reports it */
            python(CSK_HANDOVER_LAUNCH, NULL);
        }
        answer_error(CSK_ERR_IO, "cni-skel launcher: reading stdin failed", strerror(err));
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
        not_served("out of memory");
    for (char **e = environ; *e; e++)
        if (put(*e, strlen(*e)) || (e[1] && put("", 1))) not_served("out of memory");
    /* The stdin copy comes from buf itself: grow first (realloc may move it). */
    if (put_u32(stdin_len) || grow(stdin_len)) not_served("out of memory");
    memcpy(buf + buf_len, buf, stdin_len);
    buf_len += stdin_len;
    if (put_field(CSK_LAUNCHER_DESC, strlen(CSK_LAUNCHER_DESC))) not_served("out of memory");
    size_t msg_len = buf_len - msg_off;
    set_u32((unsigned char *)buf + msg_off + CSK_MAGIC_LEN, msg_len - CSK_REQUEST_HEADER);
    buf_len = stdin_len;  /* buf[0:stdin_len] stays the stdin for a fallback */

    int fds[4];
    fds[0] = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    fds[1] = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    fds[2] = fcntl(2, F_GETFD) >= 0 ? 2 : open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fds[0] < 0 || fds[1] < 0 || fds[2] < 0) {
        char why[256];
        snprintf(why, sizeof why, "opening namespaces: %s", strerror(errno));
        not_served(why);
    }
    fds[3] = open_pod_netns();
    size_t nfds = fds[3] >= 0 ? 4 : 3;

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
                        .msg_controllen = CMSG_SPACE(nfds * sizeof(int))};
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));

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
    char why[1024];
    int rc = recv_exact(s, head, sizeof head, 0);
    if (rc != 0 && send_err) {  /* closed before reading it all: it cannot have run */
        snprintf(why, sizeof why, "sending the request failed: %s", strerror(send_err));
        not_served(why);
    }
    if (rc == 1) not_served("connection reset before the request was read");
    if (rc < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            snprintf(why, sizeof why, "no answer within %d s", CSK_REPLY_TIMEOUT);
            gone(why, 0);
        }
        if (errno) gone("reading the answer failed", errno);
        gone("the worker closed the connection without an answer", 0);
    }
    if (memcmp(head, CSK_REPLY_MAGIC, CSK_MAGIC_LEN)) gone("not a cni-skel worker answer", 0);
    uint32_t code = get_u32(head + CSK_REPLY_CODE_AT), len = get_u32(head + CSK_REPLY_LENGTH_AT);
    unsigned status = head[CSK_REPLY_STATUS_AT];
    unsigned char *out = NULL;
    if (len) {
        out = malloc(len + 1);
        if (!out) gone("out of memory for the answer", 0);
        if (recv_exact(s, out, len, 1)) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                snprintf(why, sizeof why, "no answer within %d s", CSK_REPLY_TIMEOUT);
                gone(why, 0);
            }
            gone(errno ? "reading the answer failed" : "the worker closed the connection "
                                                       "without an answer", errno);
        }
        out[len] = 0;
    }
    if (status == CSK_ST_VERSION) {
        snprintf(why, sizeof why, "this launcher speaks protocol %d; %.900s; run `cni-skel "
                 "install` with the worker's version, or restart the worker of this "
                 "launcher's version", CSK_PROTOCOL_VERSION, out ? (char *)out : "");
        answer_error(CSK_ERR_TRY_AGAIN_LATER, "cni-skel launcher and worker speak different "
                     "protocol versions", why);
    }
    if (status != CSK_ST_DONE) {
        static const char *names[] = CSK_STATUS_NAMES;
        char what[32];
        if (status < CSK_STATUS_COUNT) snprintf(what, sizeof what, "%s", names[status]);
        else snprintf(what, sizeof what, "answer status %u", status);
        snprintf(why, sizeof why, "%s: %.900s", what, out ? (char *)out : "");
        not_served(why);
    }
    if (len) write_all(1, (const char *)out, len);
    return (int)(code & 0xff);
}
