"""host-local's pure parts in-process: the round-robin walk (property-tested
against a plain model of Go's iterator), range defaults, store records,
requested-address parsing. The executables are tested in test_host_local.py."""

from __future__ import annotations

import ipaddress

import pytest
from cni_skel_plugins.host_local.allocator import Range, RangeError, RangeSet, walk
from cni_skel_plugins.host_local.config import HostLocalArgs
from cni_skel_plugins.host_local.store import Owner, parse_owner
from hypothesis import given, settings
from hypothesis import strategies as st

from cni_skel.args import load_args
from cni_skel.errors import CNIError


def rng(subnet, start=None, end=None, gw=None) -> Range:
    ip = ipaddress.ip_address
    return Range.build(ipaddress.ip_interface(subnet), start and ip(start), end and ip(end),
                       gw and ip(gw))


def test_defaults_as_go():
    r = rng("10.0.0.0/24")
    assert (str(r.start), str(r.end), str(r.gateway)) == ("10.0.0.1", "10.0.0.254", "10.0.0.1")
    assert r.allocatable_count() == 253
    r6 = rng("fd00::/120")
    assert (str(r6.start), str(r6.end), str(r6.gateway)) == ("fd00::1", "fd00::ff", "fd00::1")
    assert str(rng("10.0.0.0/30")) == "10.0.0.1-10.0.0.2"


def test_mapped_ipv4_is_ipv4():
    r = rng("10.0.0.0/24", start="::ffff:10.0.0.5")
    assert r.start == ipaddress.ip_address("10.0.0.5")
    assert r.contains(ipaddress.ip_address("::ffff:10.0.0.9"))


def test_walk_first_time_and_after_last():
    s = RangeSet([rng("10.0.0.0/29")])
    assert [str(ip) for ip, _ in walk(s, None)] == [f"10.0.0.{n}" for n in range(2, 7)]
    after = [str(ip) for ip, _ in walk(s, ipaddress.ip_address("10.0.0.4"))]
    assert after == ["10.0.0.5", "10.0.0.6", "10.0.0.2", "10.0.0.3", "10.0.0.4"]


def test_walk_is_lazy_on_huge_ranges():
    s = RangeSet([rng("fd00::/64")])
    it = walk(s, ipaddress.ip_address("fd00::ffff:ffff:ffff:fffe"))
    assert [str(next(it)[0]) for _ in range(3)] == ["fd00::ffff:ffff:ffff:ffff", "fd00::2",
                                                    "fd00::3"]
    assert s.allocatable_count() == 2**64 - 2


@st.composite
def range_sets(draw):
    """1-3 disjoint IPv4 ranges inside 10.x.0.0/28 subnets, in any order."""
    blocks = draw(st.lists(st.integers(0, 9), min_size=1, max_size=3, unique=True))
    ranges = []
    for b in blocks:
        lo = draw(st.integers(0, 15))
        hi = draw(st.integers(lo, 15))
        gw = draw(st.integers(1, 14))
        base = f"10.{b}.0."
        ranges.append((f"{base}0/28", f"{base}{lo}", f"{base}{hi}", f"{base}{gw}"))
    return ranges


@settings(max_examples=300, deadline=None)
@given(range_sets(), st.integers(0, 200), st.booleans())
def test_walk_visits_every_allocatable_address_once_in_go_order(spec, pick, use_last):
    ranges = [rng(*r) for r in spec]
    try:
        rset = RangeSet(ranges)
    except RangeError:
        return  # nothing allocatable: refused at config time
    every = [ipaddress.ip_address(n) for r in ranges for n in range(int(r.start), int(r.end) + 1)]
    last = every[pick % len(every)] if use_last else None
    # Go's iterator: from rangeStart of the first range, or right after the
    # last reserved address, through the ranges in order, wrapping around.
    if last is not None:
        i = every.index(last)
        every = every[i + 1:] + every[:i + 1]
    expected = [ip for ip in every if not rset.range_for(ip).reserved(ip)]
    got = [ip for ip, _ in walk(rset, last)]
    assert got == expected
    assert len(got) == rset.allocatable_count()
    assert all(ip != r.gateway and ip.packed[-1] % 16 not in (0, 15) for ip, r in walk(rset, last))


def test_owner_records():
    assert parse_owner(b"c1\r\neth0") == Owner("c1", "eth0")
    assert parse_owner(b"  c1\r\neth0\n") == Owner("c1", "eth0")
    assert parse_owner(b"oldid\n") == Owner("oldid", None)
    assert parse_owner(b"") is None and parse_owner(b" \n") is None
    o = parse_owner(b"c1\r\neth0")
    assert o.matches("c1", "eth0") and not o.matches("c1", "eth1")
    assert not o.matches_legacy("c1")
    legacy = parse_owner(b"c1")
    assert legacy.matches_legacy("c1") and not legacy.matches("c1", "eth0")


@pytest.mark.parametrize("text,want", [
    ("10.1.2.3", "10.1.2.3"), ("10.1.2.3/24", "10.1.2.3"), ("fd00::5/64", "fd00::5"),
    ("::ffff:10.1.2.3", "10.1.2.3"),
])
def test_requested_ip_forms(text, want):
    assert [str(ip) for ip in HostLocalArgs.model_validate({"IP": text}).ip] == [want]


@pytest.mark.parametrize("text", ["10.1.2.3/33", "10.1.2.3/255.255.255.0", "fe80::1%eth0",
                                  "10.1.2.3,bogus", "10.1.2"])
def test_requested_ip_rejects(text):
    with pytest.raises(CNIError) as ei:
        load_args(f"IP={text}", HostLocalArgs)
    assert ei.value.code == 4
