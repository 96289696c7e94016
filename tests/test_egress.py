"""The allowlist's rules (trialtool/egress.py): how a list is pinned, and what it lets through.

Pure functions, so the invariants are checked over generated lists and addresses:
a list pins one text whatever its order and spelling; no rule but one naming the
address opens the host's own ranges; a wildcard is its subdomains and nothing else.
"""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trialtool.errors import UsageError
from trialtool.sandbox import egress

_LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
# A name ends in a label with a letter: one of digits and dots alone is an address, or not a host.
_NAME = st.tuples(st.lists(_LABEL, min_size=1, max_size=3), st.from_regex(r"[a-z]{2,6}", fullmatch=True)).map(
    lambda parts: ".".join([*parts[0], parts[1]])
)
_PORT = st.one_of(st.none(), st.just("*"), st.integers(1, 65535).map(str))
_V4 = st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address)
_V6 = st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address)


@st.composite
def _network(draw: st.DrawFn) -> str:
    address = draw(st.one_of(_V4, _V6))
    length = draw(st.integers(0, address.max_prefixlen))
    return str(ipaddress.ip_network(f"{address}/{length}", strict=False))


@st.composite
def _value(draw: st.DrawFn) -> str:
    """One `--allow` value, in any of its spellings."""
    kind = draw(st.sampled_from(("name", "wildcard", "network")))
    port = draw(_PORT)
    if kind == "network":
        host = draw(_network())
        if ":" in host:
            return host if port is None else f"[{host}]:{port}"
    else:
        host = draw(_NAME)
        host = draw(st.sampled_from((host, host.upper(), host + ".")))
        host = "*." + host if kind == "wildcard" else host
    return host if port is None else f"{host}:{port}"


@given(st.lists(_value(), max_size=20), st.randoms())
def test_a_list_pins_one_text_whatever_its_order_repeats_and_spelling(values: list[str], rnd: object) -> None:
    pinned = egress.canonical(values)
    shuffled = values * 2
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert egress.canonical(shuffled) == pinned
    assert egress.canonical(list(pinned)) == pinned  # the pinned form is its own canonical form
    assert egress.stored(list(pinned))
    assert list(pinned) == sorted(set(pinned))
    # What the list allows does not depend on its spelling either.
    assert egress.Rules(pinned).names == egress.Rules(values).names


@given(st.text(max_size=40))
def test_any_text_is_a_rule_or_a_usage_error_naming_it(text: str) -> None:
    refused: UsageError | None = None
    try:
        rules = egress.parse(text)
    except UsageError as exc:
        refused = exc
    if refused is not None:
        assert refused.message.startswith("--allow") and "\n" not in refused.message
    else:
        assert rules and all(rule.port in (0, *range(1, 65536)) for rule in rules)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("", "takes HOST[:PORT]"),
        ("pypi.org:0", "the port must be 1 to 65535"),
        ("pypi.org:http", "the port must be 1 to 65535"),
        ("10.0.0.1/8", "has host bits set"),
        ("300.1.1.1", "does not appear to be an IPv4 or IPv6 network"),
        ("-bad-.org", "is not a host name"),
        ("a_b.org", "is not a host name"),
        ("127.1", "does not appear to be an IPv4"),
        ("bad\u3002", "is not a host name"),
        ("*.", "is not a host name"),
        ("[::1", "expected [ADDRESS]:PORT"),
        ("a b", "takes HOST[:PORT]"),
    ],
)
def test_a_bad_value_is_refused_with_its_reason(value: str, words: str) -> None:
    with pytest.raises(UsageError) as raised:
        egress.parse(value)
    assert words in raised.value.message


def test_a_rule_without_a_port_is_80_and_443_and_star_is_any() -> None:
    assert egress.canonical(["PyPI.org.", "[2001:db8::1]", "*.example.com:*"]) == (
        "*.example.com:*",
        "[2001:db8::1]:443",
        "[2001:db8::1]:80",
        "pypi.org:443",
        "pypi.org:80",
    )
    rules = egress.Rules(egress.canonical(["pypi.org", "*.example.com:*"]))
    assert rules.name_allowed("pypi.org", 443) is None
    assert rules.name_allowed("pypi.org", 22) == "port_not_listed"
    assert rules.name_allowed("a.b.example.com", 22) is None


@given(_NAME, st.integers(1, 65535))
def test_a_wildcard_is_the_subdomains_and_not_the_name(name: str, port: int) -> None:
    rules = egress.Rules([f"*.{name}:*"])
    assert rules.name_allowed(f"sub.{name}", port) is None
    assert rules.name_allowed(egress.hostname(f"A.Sub.{name.upper()}."), port) is None
    assert rules.name_allowed(name, port) == "not_listed"
    assert rules.name_allowed(f"evil{name}", port) == "not_listed"
    assert rules.name_allowed(f"{name}.evil.test", port) == "not_listed"


@st.composite
def _special_address(draw: st.DrawFn) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, str]:
    network, _ = draw(st.sampled_from(egress.SPECIAL))
    offset = draw(st.integers(0, network.num_addresses - 1))
    address = network.network_address + offset
    return address, egress.special(address)[1]


_EVERYTHING = ("0.0.0.0/0:*", "[::/0]:*", "*.test:*", "pypi.org:*")


@given(_special_address(), st.integers(1, 65535), st.booleans())
def test_no_rule_but_one_naming_it_opens_the_hosts_own_ranges(
    found: tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, str], port: int, named: bool
) -> None:
    address, kind = found
    broad = egress.Rules(_EVERYTHING)
    assert broad.address_allowed(address, port, named=named) == kind
    if isinstance(address, ipaddress.IPv4Address):
        # Mapped, NAT64 and 6to4 spellings carry the same address and get the same answer.
        for carrier in (
            ipaddress.IPv6Address(f"::ffff:{address}"),
            ipaddress.IPv6Address(int(ipaddress.IPv6Address("64:ff9b::")) | int(address)),
            ipaddress.IPv6Address((0x2002 << 112) | (int(address) << 80)),
        ):
            assert broad.address_allowed(carrier, port, named=named) == kind
    single = "[{}]:*" if address.version == 6 else "{}:*"
    assert egress.Rules([single.format(address)]).address_allowed(address, port, named=named) is None


@given(st.one_of(_V4, _V6), st.integers(1, 65535))
def test_an_ordinary_address_needs_a_rule_unless_an_allowed_name_resolved_to_it(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int
) -> None:
    empty = egress.Rules([])
    if egress.special(address)[0] is not None or (
        isinstance(address, ipaddress.IPv6Address)
        and (
            address.ipv4_mapped is not None
            or address in ipaddress.ip_network("64:ff9b::/96")
            or address.sixtofour is not None
        )
    ):
        return  # the ranges the test above covers
    assert empty.address_allowed(address, port, named=True) is None
    assert empty.address_allowed(address, port, named=False) == "not_listed"
    whole = "[::/0]" if address.version == 6 else "0.0.0.0/0"
    assert egress.Rules([f"{whole}:{port}"]).address_allowed(address, port, named=False) is None
    other = port % 65535 + 1
    assert egress.Rules([f"{whole}:{other}"]).address_allowed(address, port, named=False) == "not_listed"


def test_a_network_inside_a_special_range_opens_only_that_network() -> None:
    rules = egress.Rules(["10.77.0.0/16:80"])
    assert rules.address_allowed(ipaddress.ip_address("10.77.3.4"), 80, named=True) is None
    assert rules.address_allowed(ipaddress.ip_address("10.78.3.4"), 80, named=True) == "private"
    assert rules.address_allowed(ipaddress.ip_address("10.77.3.4"), 443, named=True) == "private"
    metadata = egress.Rules(["169.254.0.0/16:*"])
    assert metadata.address_allowed(ipaddress.ip_address("169.254.1.1"), 80, named=False) is None
    assert metadata.address_allowed(ipaddress.ip_address("169.254.169.254"), 80, named=False) == "metadata"


def test_checked_settings() -> None:
    assert egress.checked({"allow": ["pypi.org:443"]}) == ("allow", ("pypi.org:443",))
    assert egress.checked({"network": "allow", "allow": []}) == ("allow", ())
    assert egress.checked({"network": "host"}) == ("host", None)
    assert egress.checked({}) == (None, None)
    for settings, words in (
        ({"network": "host", "allow": ["a.test"]}, "--allow goes with --network allow"),
        ({"network": "open"}, "--network must be one of none, host, allow"),
        ({"allow": "a.test"}, "one HOST[:PORT] per use"),
        ({"allow": [1]}, "one HOST[:PORT] per use"),
        ({"network": 1}, "--network must be one of none, host, allow"),
        ({"allow": [f"h{n}.test:1" for n in range(egress.MAX_RULES + 1)]}, "more than the 1000"),
    ):
        with pytest.raises(UsageError) as raised:
            egress.checked(settings)
        assert words in raised.value.message
    assert not egress.stored(["pypi.org:80", "pypi.org:443"])  # not in canonical order: not what a trial pins
    assert not egress.stored("pypi.org:80")


# The one parser of what reaches the proxy (egress.host, egress.authority, egress.port).

_SPELLINGS = [
    # (as sent, what it is, or the code of its refusal)
    ("allowed.test", "allowed.test"),
    ("WWW.Allowed.TEST", "www.allowed.test"),
    ("www.allowed.test.", "www.allowed.test"),
    ("bücher.allowed.test", "xn--bcher-kva.allowed.test"),
    ("xn--bcher-kva.allowed.test", "xn--bcher-kva.allowed.test"),
    ("evil.test\x00.allowed.test", "bad_name"),
    ("evil.test%00.allowed.test", "bad_name"),
    ("evil.test .allowed.test", "bad_name"),
    ("evil.test\t.allowed.test", "bad_name"),
    ("evil.test\n.allowed.test", "bad_name"),
    ("evil.test\x7f.allowed.test", "bad_name"),
    ("evil_test.allowed.test", "bad_name"),
    ("-evil.allowed.test", "bad_name"),
    ("www..allowed.test", "bad_name"),
    ("allowed.test..", "bad_name"),
    ("", "bad_name"),
    ("a" * 64 + ".allowed.test", "bad_name"),
    (".".join(["a" * 63] * 4) + ".allowed.test", "bad_name"),  # 270 characters
    ("127.0.0.1", ipaddress.IPv4Address("127.0.0.1")),
    ("127.0.0.1.", ipaddress.IPv4Address("127.0.0.1")),
    ("127.1", "bad_address"),
    ("2130706433", "bad_address"),
    ("0x7f000001", "bad_address"),
    ("0x7f.0.0.1", "bad_address"),
    ("0177.0.0.1", "bad_address"),
    ("127.000.000.001", "bad_address"),
    ("1.2.3.4.5", "bad_address"),
    ("256.1.1.1", "bad_address"),
    ("evil.0x10", "bad_address"),
    ("[::1]", ipaddress.IPv6Address("::1")),
    ("::1", ipaddress.IPv6Address("::1")),
    ("[::ffff:127.0.0.1]", ipaddress.IPv4Address("127.0.0.1")),
    ("[::FFFF:7f00:1]", ipaddress.IPv4Address("127.0.0.1")),
    ("[fe80::1%eth0]", "bad_address"),
    ("[fe80::1%25eth0]", "bad_address"),
    ("[1.2.3.4]", "bad_address"),
    ("[::1", "bad_address"),
    ("[::g]", "bad_address"),
]


@pytest.mark.parametrize(("given", "expected"), _SPELLINGS)
def test_each_spelling_of_a_host_is_read_one_way(given: str, expected: object) -> None:
    if isinstance(expected, str) and expected.startswith("bad_"):
        with pytest.raises(egress.Malformed) as raised:
            egress.host(given)
        assert raised.value.code == expected and raised.value.why
    else:
        assert egress.host(given) == expected


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("allowed.test:80", ("allowed.test", 80)),
        ("allowed.test", ("allowed.test", 443)),
        ("[::1]:8080", (ipaddress.IPv6Address("::1"), 8080)),
        ("allowed.test:0", "bad_port"),
        ("allowed.test:080", "bad_port"),
        ("allowed.test:+80", "bad_port"),
        ("allowed.test:65536", "bad_port"),
        ("allowed.test:\u0668\u0660", "bad_port"),  # Arabic-Indic digits: str.isdigit says yes
        ("allowed.test:", "bad_port"),
        ("allowed.test:80:80", "bad_address"),
        ("::1:80", "bad_address"),
        ("[::1]80", "bad_address"),
    ],
)
def test_an_authority_is_read_one_way(given: str, expected: object) -> None:
    if isinstance(expected, str):
        with pytest.raises(egress.Malformed) as raised:
            egress.authority(given, 443)
        assert raised.value.code == expected
    else:
        assert egress.authority(given, 443) == expected


@given(st.text(max_size=300))
def test_a_checked_name_is_ldh_and_its_own_check(text: str) -> None:
    """Whatever text comes in, a name that comes out is plain LDH, and checking it again changes nothing."""
    shown = egress.escaped(text)
    assert shown.isascii() and shown.isprintable() and len(shown) <= egress.HOST_CHARS
    bad: egress.Malformed | None = None
    try:
        checked = egress.host(text)
    except egress.Malformed as exc:
        bad = exc
    if bad is not None:
        assert bad.code in ("bad_name", "bad_address") and "\n" not in bad.why
        return
    if isinstance(checked, str):
        assert checked.isascii() and set(checked) <= set("abcdefghijklmnopqrstuvwxyz0123456789-.")
        assert 0 < len(checked) <= 253 and egress.host(checked) == checked
    else:
        assert egress.host(str(checked) if checked.version == 4 else f"[{checked}]") == checked


def test_a_rule_and_the_proxy_read_a_name_alike() -> None:
    rules = egress.Rules(egress.canonical(["Bücher.Allowed.Test.", "*.allowed.test"]))
    assert rules.name_allowed(egress.hostname("BÜCHER.allowed.test"), 443) is None
    assert rules.names == {"xn--bcher-kva.allowed.test": {80, 443}}
