#!/bin/bash
# mmdebstrap customize hook of image/build.sh:
#   customize-rootfs.sh ROOT WORK PYTHON
# ROOT: the new Debian root; WORK: build.sh's work dir (wheels/, launchers/,
# constraints.txt); PYTHON: the host venv's python, whose pip installs the
# project's wheel and its dependencies (binary wheels from PyPI for the
# image's Python and glibc) into ROOT's /usr/local/lib/python3.X/dist-packages.
set -euo pipefail
ROOT=$1 WORK=$2 PY=$3
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

in_root() { chroot "$ROOT" /usr/bin/python3 -I -c "$1"; }
pyver=$(in_root 'import sys; print("%d.%d" % sys.version_info[:2])')
glibc=$(in_root 'import os; print(os.confstr("CS_GNU_LIBC_VERSION").split()[1])')
arch=$(in_root 'import sysconfig; print(sysconfig.get_platform().split("-", 1)[1])')
site=/usr/local/lib/python$pyver/dist-packages

# Every manylinux tag the image's glibc runs (pip does not widen a given one).
platforms=()
major=${glibc%%.*} minor=${glibc#*.}
for ((m = minor; m >= 5; m--)); do platforms+=(--platform "manylinux_${major}_${m}_$arch"); done
platforms+=(--platform "manylinux2014_$arch" --platform "manylinux2010_$arch" \
            --platform "manylinux1_$arch")
"$PY" -m pip install -q --disable-pip-version-check --no-warn-script-location \
    --target "$ROOT$site" --no-compile --only-binary=:all: \
    --implementation cp --python-version "$pyver" --abi "cp${pyver/./}" --abi abi3 --abi none \
    "${platforms[@]}" -c "$WORK/constraints.txt" "$WORK"/wheels/cni_skel-*.whl
rm -rf "$ROOT$site/bin"  # console scripts with the host's interpreter; ours follows
# Bytecode by the image's own interpreter; unchecked-hash: the image never changes.
chroot "$ROOT" /usr/bin/python3 -I -m compileall -q --invalidation-mode unchecked-hash "$site"

install -d -m 755 "$ROOT/usr/local/bin" "$ROOT/usr/lib/cni-skel/bin"
cat > "$ROOT/usr/local/bin/cni-skel" <<'EOF'
#!/usr/bin/python3 -I
import sys
from cni_skel.cli import main
sys.exit(main())
EOF
chmod 755 "$ROOT/usr/local/bin/cni-skel"
install -m 755 "$WORK"/launchers/* "$ROOT/usr/lib/cni-skel/bin/"
install -m 755 "$HERE/install-launchers" "$ROOT/usr/lib/cni-skel/install-launchers"
"$PY" -m pip list -q --disable-pip-version-check --path "$ROOT$site" --format=freeze \
    > "$ROOT/usr/lib/cni-skel/python-packages.txt"

# Reproducible: no host identity in the image (the runtime provides both
# files), our files at SOURCE_DATE_EPOCH.
rm -f "$ROOT/etc/resolv.conf"
: > "$ROOT/etc/hostname"
find "$ROOT/usr/local" "$ROOT/usr/lib/cni-skel" -exec touch -h -d "@${SOURCE_DATE_EPOCH:-0}" {} +
