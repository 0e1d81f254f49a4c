#!/bin/bash
# Build the cni-skel node image (issue 19) as an OCI archive, without any
# container registry: the base comes from Debian's packages (mmdebstrap), the
# Python packages from PyPI, the native launchers are compiled here.
#
#   image/build.sh [-o OUT.tar] [-n NAME] [-w WORKDIR] [-k]
#
#   -o  the OCI archive to write (default: build/cni-skel-image.tar)
#   -n  the image name inside it (default: localhost/cni-skel:<project version>)
#   -w  a work directory (default: a fresh temporary one, removed at the end)
#   -k  keep the work directory (rootfs.tar, wheels, launchers, buildah store)
#
# Environment: PYTHON (the project's venv python, default .venv/bin/python; its
# `cni-skel install` compiles the launchers and its pip installs the wheels),
# SUITE and MIRROR / SECURITY_MIRROR (default: the Debian suite and mirrors of
# this machine's apt sources), SOURCE_DATE_EPOCH (default: the last commit's
# time; with the same mirror content and PyPI versions the archive is the same).
#
# Loads: `ctr -n NS image import OUT.tar`, `podman load -i OUT.tar`.
# Needs (Debian): mmdebstrap, buildah, gcc, libc6-dev (static launchers).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
OUT=$REPO/build/cni-skel-image.tar
NAME=""
WORK=""
KEEP=""
while getopts "o:n:w:kh" opt; do
    case $opt in
        o) OUT=$OPTARG ;;
        n) NAME=$OPTARG ;;
        w) WORK=$OPTARG ;;
        k) KEEP=1 ;;
        *) sed -n '2,20p' "$0" >&2; exit 2 ;;
    esac
done
case $OUT in /*) ;; *) OUT=$PWD/$OUT ;; esac

for tool in mmdebstrap buildah; do
    command -v "$tool" >/dev/null || { echo "build.sh: $tool missing (apt-get install $tool)" >&2; exit 1; }
done
[ -x "$PY" ] || { echo "build.sh: $PY missing (make venv)" >&2; exit 1; }
CLI=$(dirname "$PY")/cni-skel
VERSION=$("$PY" -c 'import cni_skel; print(cni_skel.__version__)')
NAME=${NAME:-localhost/cni-skel:$VERSION}

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    SOURCE_DATE_EPOCH=$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || echo 0)
fi
export SOURCE_DATE_EPOCH

# The Debian suite and mirrors this machine's apt uses (deb822 or one-line).
read -r SUITE0 MIRROR0 SECURITY0 < <("$PY" - <<'EOF'
import glob, re
suite, mirror, security = "", "", ""
for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*"))]:
    try:
        text = open(path).read()
    except OSError:
        continue
    entries = []
    if path.endswith(".sources"):
        for stanza in re.split(r"\n\s*\n", text):
            f = dict(re.findall(r"(?m)^(\w[\w-]*):\s*(.*)$", stanza))
            if "deb" in f.get("Types", "").split():
                entries += [(u, s) for u in f.get("URIs", "").split()
                            for s in f.get("Suites", "").split()]
    else:
        for line in text.splitlines():
            w = re.sub(r"\[[^]]*\]", "", line.split("#")[0]).split()
            if len(w) >= 3 and w[0] == "deb":
                entries.append((w[1], w[2]))
    for uri, s in entries:
        if uri.rstrip("/").endswith("/debian-security"):
            security = security or uri
        elif uri.rstrip("/").endswith("/debian") and "-" not in s:
            suite, mirror = suite or s, mirror or uri
print(suite or "bookworm", mirror or "http://deb.debian.org/debian",
      security or "http://deb.debian.org/debian-security")
EOF
)
SUITE=${SUITE:-$SUITE0}
MIRROR=${MIRROR:-$MIRROR0}
SECURITY_MIRROR=${SECURITY_MIRROR:-$SECURITY0}

if [ -z "$WORK" ]; then
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/cni-skel-image.XXXXXX")
else
    mkdir -p "$WORK"
fi
WORK=$(cd "$WORK" && pwd)
STORE=$WORK/containers
B=(buildah --storage-driver vfs --root "$STORE/root" --runroot "$STORE/run")
cleanup() {
    if [ -z "$KEEP" ]; then
        "${B[@]}" rm --all >/dev/null 2>&1 || true
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

t0=$(date +%s.%N)
lap() {  # lap WHAT: seconds since the last lap
    local now
    now=$(date +%s.%N)
    awk -v a="$t0" -v b="$now" -v w="$1" 'BEGIN {printf "build.sh: %-30s %6.1f s\n", w, b - a}'
    t0=$now
}

# 1. The project's wheel, from a copy of the working tree (a build in place
#    would write build/ and *.egg-info into the checkout).
rm -rf "$WORK/src" "$WORK/wheels" "$WORK/launchers" "$WORK/rootfs.tar"  # a reused -w dir
mkdir -p "$WORK/src" "$WORK/wheels"
tar -C "$REPO" --exclude-vcs --exclude=./.venv --exclude=./build --exclude='*.egg-info' \
    --exclude=__pycache__ --exclude=./tests --exclude=./bench --exclude=./image \
    --exclude=./deploy -cf - . | tar -C "$WORK/src" -xf -
# The venv's setuptools when it is new enough (pyproject's build-system), else
# pip's isolated build environment (setuptools from PyPI).
isolation=()
"$PY" -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 77)' \
    2>/dev/null && isolation=(--no-build-isolation)
"$PY" -m pip wheel -q --disable-pip-version-check --no-deps "${isolation[@]}" \
    -w "$WORK/wheels" "$WORK/src"
WHEEL=$(ls "$WORK"/wheels/cni_skel-*.whl)
# The dependencies at the versions the venv (and so the test suite) runs.
"$PY" -m pip freeze --exclude-editable 2>/dev/null | grep -vi '^cni[-_]skel' \
    > "$WORK/constraints.txt" || true
lap "wheel"

# 2. Native launchers for every registered plugin, static (no libc needed on
#    the node), never starting Python (--fallback none: with the worker down a
#    call answers CNI error 11).
mkdir -p "$WORK/launchers"
"$CLI" install --bin-dir "$WORK/launchers" --launcher native --fallback none --no-systemd \
    >/dev/null
for f in "$WORK"/launchers/*; do
    if readelf -l "$f" 2>/dev/null | grep -q "program interpreter"; then
        echo "build.sh: $f is not statically linked (install libc6-dev)" >&2
        exit 1
    fi
done
echo "build.sh: launchers: $(cd "$WORK/launchers" && echo *) (native, static, fallback none)"
lap "launchers"

# 3. The root filesystem: Debian minbase + python3 + libnftables1, then the
#    wheels and launchers (image/customize-rootfs.sh, run as a hook).
mmdebstrap --quiet --variant=minbase --include=python3,libnftables1 \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --customize-hook="\"$HERE/customize-rootfs.sh\" \"\$1\" \"$WORK\" \"$PY\"" \
    "$SUITE" "$WORK/rootfs.tar" \
    "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" \
    "deb $SECURITY_MIRROR $SUITE-security main"
lap "mmdebstrap (+ pip, compileall)"

# 4. The image: one layer; entrypoint `cni-skel worker` (which, with
#    --mount-namespace own, makes a read-only /proc/sys writable first).
ctr=$("${B[@]}" from --quiet scratch)
"${B[@]}" add --quiet "$ctr" "$WORK/rootfs.tar" / >/dev/null
"${B[@]}" config --os linux --arch "$(dpkg --print-architecture)" \
    --entrypoint '["/usr/local/bin/cni-skel", "worker"]' --cmd '' --workingdir / \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env PYTHONDONTWRITEBYTECODE=1 \
    --label org.opencontainers.image.title=cni-skel \
    --label org.opencontainers.image.version="$VERSION" \
    --label org.opencontainers.image.description="cni-skel warm worker and native CNI launchers" \
    "$ctr"
"${B[@]}" commit --quiet --rm --omit-history --timestamp "$SOURCE_DATE_EPOCH" "$ctr" "$NAME" >/dev/null
mkdir -p "$(dirname "$OUT")"
rm -f "$OUT"
"${B[@]}" push --quiet "$NAME" "oci-archive:$OUT:$NAME"
"${B[@]}" rmi --all >/dev/null
lap "buildah"

unpacked=$(tar -tvf "$WORK/rootfs.tar" | awk '{s += $3} END {printf "%.0f", s / 1e6}')
echo "build.sh: $NAME -> $OUT ($(( $(stat -c %s "$OUT") / 1000000 )) MB archive, ${unpacked} MB unpacked)"
