"""Prometheus metrics of ``cni-skel worker`` (``--metrics-address``).

The worker's parent keeps them (prometheus_client, its own registry) and
serves them over HTTP from a thread; children report each request's outcome
to the parent (`cni_skel.warm.pool`), so nothing here runs in a child.

Metrics (all prefixed ``cni_skel_``):

* ``requests_total{plugin,verb,code}``: requests answered, ``code`` the
  spec error code of the answer ("0": success);
* ``not_served_total{reason}``: requests the worker did not run
  (``refused``, ``unknown-plugin``, ``bad-request``, ``protocol``,
  ``too-large``): the launcher fell back by its install;
* ``request_duration_seconds{plugin,verb}``: histogram of the time from the
  request's arrival to its answer;
* ``requests_in_flight``, ``children{state="idle"|"busy"}``;
* ``child_deaths_total{during="request"|"idle"|"keeper"}``: children that
  ended without answering (a request's are answered code 11), and keeper
  processes that ended before the worker did (forked again);
* ``keeper_held{service}``: what each service of the keeper holds for pods
  (`cni_skel.keeper`; the dhcp plugin's: leases), and
  ``keeper_events_total{service,event}``: what they did (dhcp: leases
  acquired, renewed, rebound, released, expired; NAKs; ADDs timed out);
* ``launcher_fallbacks_total``: one-shot fallbacks launchers logged in the
  socket directory's fallback log (`cni_skel.warm.protocol.fallback_log`);
* ``worker_info{version,protocol}`` (1) and ``worker_start_time_seconds``.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily

from .. import __version__
from .protocol import FALLBACK_LOG_MAX, SERVED_VERSIONS, fallback_log

__all__ = ["Metrics", "parse_address"]

#: Seconds: a warm request takes milliseconds; one-shot-like stalls show up
#: in the upper buckets.
BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


#: Buckets of ``cni_skel_link_batch_size`` (links per batch).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
#: Why the worker did not run a request (``cni_skel_not_served_total{reason}``).
NOT_SERVED_REASONS = ("bad-request", "protocol", "refused", "too-large", "unknown-plugin")


def parse_address(text: str) -> tuple[str, int]:
    """``"HOST:PORT"``, ``"[V6]:PORT"`` or ``":PORT"`` (all addresses) ->
    (host, port). Raises ValueError naming the bad part."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r}: expected HOST:PORT (port 1-65535)")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host or "0.0.0.0", int(port)


class _Fallbacks:
    """``launcher_fallbacks_total``, counted from the fallback log at scrape
    time (launchers append a line each; the worker may not have been up)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def collect(self) -> Any:
        metric = CounterMetricFamily(
            "cni_skel_launcher_fallbacks",
            f"One-shot fallbacks launchers logged in {self.path} (capped at "
            f"{FALLBACK_LOG_MAX} bytes)")
        try:
            with open(self.path, "rb") as fp:
                count = fp.read(FALLBACK_LOG_MAX + 4096).count(b"\n")
        except OSError:
            count = 0
        metric.add_metric([], count)
        yield metric


class Metrics:
    """The worker's metrics; `start` serves them on ``(host, port)``."""

    def __init__(self, socket_path: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("cni_skel_requests", "Requests answered, by spec error "
                                "code (0: success)", ["plugin", "verb", "code"], registry=r)
        self.not_served = Counter("cni_skel_not_served", "Requests the worker did not run",
                                  ["reason"], registry=r)
        self.duration = Histogram("cni_skel_request_duration_seconds", "Request arrival to "
                                  "answer", ["plugin", "verb"], buckets=BUCKETS, registry=r)
        self.in_flight = Gauge("cni_skel_requests_in_flight", "Requests being served",
                               registry=r)
        self.children = Gauge("cni_skel_children", "Serving processes", ["state"], registry=r)
        self.recycles = Counter("cni_skel_recycled", "Serving processes that exited after a "
                                "call to be replaced (state they could not put back, error "
                                "999, --max-requests)", registry=r)
        self.deaths = Counter("cni_skel_child_deaths", "Children that ended without "
                              "answering", ["during"], registry=r)
        # Every label value exported from the start, at 0: a series that
        # appears only with its first event hides that event from rate().
        for reason in NOT_SERVED_REASONS:
            self.not_served.labels(reason)
        for during in ("request", "idle", "keeper"):
            self.deaths.labels(during)
        self.batches = Histogram("cni_skel_link_batch_size", "Links deleted by one request "
                                 "of a batch of concurrent deletions (one per batch)",
                                 buckets=BATCH_BUCKETS, registry=r)
        self.batches_refused = Counter("cni_skel_link_batches_refused", "Batches whose one "
                                       "request the kernel refused (each link deleted alone)",
                                       registry=r)
        self.held = Gauge("cni_skel_keeper_held", "What the keeper's services hold for pods "
                          "(dhcp: leases)", ["service"], registry=r)
        self.events = Counter("cni_skel_keeper_events", "What the keeper's services did "
                              "(dhcp: acquired, renewed, rebound, released, expired, nak, "
                              "timeout)", ["service", "event"], registry=r)
        self._events: dict[tuple[str, str], int] = {}
        info = Gauge("cni_skel_worker_info", "The worker's version and the launcher "
                     "protocols it serves", ["version", "protocol"], registry=r)
        info.labels(__version__, f"{SERVED_VERSIONS[0]}-{SERVED_VERSIONS[-1]}").set(1)
        Gauge("cni_skel_worker_start_time_seconds", "Unix time the worker started",
              registry=r).set(time.time())
        r.register(_Fallbacks(fallback_log(socket_path)))
        self.server: Any = None

    def start(self, address: str) -> None:
        """Serve ``/metrics`` on ``address`` (`parse_address`) from a thread.
        Raises ValueError (bad address) or OSError (cannot listen)."""
        host, port = parse_address(address)
        self.server, _ = start_http_server(port, host, registry=self.registry)

    def close_in_child(self) -> None:
        """In a forked child: let go of the listening socket (the thread is
        not there)."""
        if self.server is not None:
            self.server.socket.close()

    def observe(self, plugin: str, verb: str, outcome: str, code: str, seconds: float) -> None:
        """One request's report: ``outcome`` "answered" (``code`` the answer's
        spec error code, "0" for success) or why it was not served."""
        if outcome == "answered":
            self.requests.labels(plugin, verb, code).inc()
            self.duration.labels(plugin, verb).observe(seconds)
        else:
            self.not_served.labels(outcome).inc()

    def crashed(self, plugin: str, verb: str, seconds: float) -> None:
        """A child died in a request; the worker answered it code 11."""
        self.deaths.labels("request").inc()
        self.requests.labels(plugin, verb, "11").inc()
        self.duration.labels(plugin, verb).observe(seconds)

    def link_batches(self, sizes: list[int], refused: int) -> None:
        """A serving process's report of the link deletion batches it led."""
        for size in sizes:
            self.batches.observe(size)
        if refused:
            self.batches_refused.inc(refused)

    def recycled(self) -> None:
        self.recycles.inc()

    def idle_death(self) -> None:
        self.deaths.labels("idle").inc()

    def keeper_death(self) -> None:
        self.deaths.labels("keeper").inc()
        self._events.clear()  # the next keeper counts from 0

    def keeper(self, held: dict[str, int], events: dict[str, dict[str, int]]) -> None:
        """The keeper's report: what each service holds, and its event
        counts since the keeper started (a new keeper counts from 0)."""
        for service, n in held.items():
            self.held.labels(service).set(n)
        for service, counts in events.items():
            for event, n in counts.items():
                seen = self._events.get((service, event), 0)
                self.events.labels(service, event).inc(max(0, n - seen))
                self._events[(service, event)] = n

    def set_children(self, idle: int, busy: int) -> None:
        self.children.labels("idle").set(idle)
        self.children.labels("busy").set(busy)
        self.in_flight.set(busy)
