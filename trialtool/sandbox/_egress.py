"""The egress allowlist: `--allow HOST[:PORT]` rules, pinned as text, and the decision for one connection (pure).

A rule names a host by its name (`pypi.org`), by a wildcard over its
subdomains (`*.pythonhosted.org`: any name below it, not the name itself), by
an address (`203.0.113.7`, `[2001:db8::1]`) or by a network (`203.0.113.0/24`);
and a port, `*` for any, or none: 80 and 443. A trial pins its rules in one
canonical form (`canonical`): each host lowercased, each port its own entry,
sorted, without repeats, so that the same list given in any order or spelling
pins the same text, and the fairness check compares like with like.

A name is allowed only by a name rule, and is then resolved (on trial-tool's
side, never in the sandbox); an address only by an address rule. Addresses of
the host's own networks (`SPECIAL`: loopback, private, shared, link-local, the
cloud metadata services, and the reserved ranges) are refused, even when an
allowed name resolves to them, unless a rule names them by an address or a
network lying inside their range: `0.0.0.0/0` does not open `127.0.0.1`. An
IPv6 address that carries an IPv4 one (mapped, NAT64, 6to4) is judged by the
address it carries.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from ..errors import UsageError
from ..osio import plain

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: The sandbox's networks: none; the host's; only through trial-tool's proxy, to what `--allow` lists.
NETWORKS = ("none", "host", "allow")
#: The ports a rule without one allows.
DEFAULT_PORTS = (80, 443)
#: The longest list a trial may pin.
MAX_RULES = 1000
#: Connections of each kind (allowed, denied) a call's record lists; the counts are exact beyond.
LISTED = 100
#: The longest host name a record keeps (a valid one is shorter).
HOST_CHARS = 255
#: Bytes the network part of a call's record can take at most: every listed entry at its longest, escaped.
RECORD_BOUND = 2 * LISTED * (6 * HOST_CHARS + 512) + 1024

#: The host's own and the reserved ranges, each with the name a denial gives it (most specific first).
SPECIAL: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ipaddress.ip_network(network), kind)
    for network, kind in (
        # The cloud providers' instance metadata services.
        ("169.254.169.254/32", "metadata"),
        ("169.254.170.2/32", "metadata"),
        ("100.100.100.200/32", "metadata"),
        ("192.0.0.192/32", "metadata"),
        ("fd00:ec2::254/128", "metadata"),
        ("127.0.0.0/8", "loopback"),
        ("::1/128", "loopback"),
        ("10.0.0.0/8", "private"),
        ("172.16.0.0/12", "private"),
        ("192.168.0.0/16", "private"),
        ("fc00::/7", "private"),
        ("100.64.0.0/10", "shared"),
        ("169.254.0.0/16", "link-local"),
        ("fe80::/10", "link-local"),
        ("0.0.0.0/8", "reserved"),
        ("192.0.0.0/24", "reserved"),
        ("224.0.0.0/4", "reserved"),
        ("240.0.0.0/4", "reserved"),
        ("::/96", "reserved"),  # the unspecified address and the old IPv4-compatible ones
        ("fec0::/10", "reserved"),
        ("ff00::/8", "reserved"),
    )
)


class Rule(NamedTuple):
    """One canonical entry: a host pattern and one port (0: any)."""

    kind: str  # "name", "wildcard", "network"
    host: str  # the name, the suffix after "*." for a wildcard, or the network's text
    port: int

    @property
    def text(self) -> str:
        port = "*" if self.port == 0 else str(self.port)
        if self.kind == "wildcard":
            return f"*.{self.host}:{port}"
        if self.kind == "network" and ":" in self.host:
            return f"[{_short(self.host)}]:{port}"
        return f"{_short(self.host) if self.kind == 'network' else self.host}:{port}"


def _short(network: str) -> str:
    """A single address's network shown as the address."""
    parsed = ipaddress.ip_network(network)
    return str(parsed.network_address) if parsed.num_addresses == 1 else str(parsed)


def _name(host: str, given: str) -> str:
    """`host` of a rule as a checked host name (the proxy's own parser); UsageError otherwise."""
    try:
        return hostname(host)
    except Malformed as exc:
        why = f"{plain(host)} is not a host name, address or network: {exc.why}"
        raise UsageError(f"--allow {plain(given)}: {why}") from None


def parse(given: str) -> list[Rule]:
    """One `--allow` value as its canonical rules (one per port); UsageError naming what is wrong."""
    if not isinstance(given, str) or not given.strip() or not given.isprintable() or " " in given:
        raise UsageError(f"--allow takes HOST[:PORT], not {plain(given)}")
    text = given.strip()
    if text.startswith("["):  # [IPv6] or [IPv6/len], then :PORT maybe
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise UsageError(f"--allow {plain(given)}: expected [ADDRESS]:PORT")
        port_text = rest[1:] if rest else None
    elif text.count(":") > 1:  # a bare IPv6 address or network: no port
        host, port_text = text, None
    else:
        host, colon, port_text_or = text.rpartition(":") if ":" in text else (text, "", "")
        port_text = port_text_or if colon else None
    ports = _ports(port_text, given)
    try:
        network = ipaddress.ip_network(host, strict=True)
    except ValueError as exc:
        if "/" in host or host.replace(".", "").isdigit() or ":" in host:
            raise UsageError(f"--allow {plain(given)}: {exc}") from exc
    else:
        return [Rule("network", str(network), port) for port in ports]
    if host.startswith("*."):
        return [Rule("wildcard", _name(host[2:], given), port) for port in ports]
    return [Rule("name", _name(host, given), port) for port in ports]


def _ports(text: str | None, given: str) -> tuple[int, ...]:
    if text is None:
        return DEFAULT_PORTS
    if text == "*":
        return (0,)
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise UsageError(f"--allow {plain(given)}: the port must be 1 to 65535, or *")
    return (int(text),)


def canonical(given: object) -> tuple[str, ...]:
    """The pinned form of a list of `--allow` values: every rule's text, sorted, without repeats."""
    if not isinstance(given, list | tuple) or not all(isinstance(value, str) for value in given):
        raise UsageError(f"--allow takes one HOST[:PORT] per use, not {plain(given)}")
    texts = sorted({rule.text for value in given for rule in parse(value)})
    if len(texts) > MAX_RULES:
        raise UsageError(f"--allow: {len(texts)} rules, more than the {MAX_RULES} a trial may pin")
    return tuple(texts)


def checked(settings: Mapping[str, object]) -> tuple[str | None, tuple[str, ...] | None]:
    """(`network`, `allow`) of a trial's settings, checked (None: not given); `--allow` alone means network allow."""
    network = settings.get("network")
    if network is not None and (not isinstance(network, str) or network not in NETWORKS):
        raise UsageError(f"--network must be one of {', '.join(NETWORKS)}, not {plain(network)}")
    if settings.get("allow") is None:
        return network, None
    if network not in (None, "allow"):
        raise UsageError(f"--allow goes with --network allow, not --network {plain(network)}")
    return "allow", canonical(settings["allow"])


def stored(value: object) -> bool:
    """Whether a state's stored allowlist is one a trial pins: canonical."""
    try:
        return isinstance(value, list) and tuple(value) == canonical(value)
    except UsageError:
        return False


class Malformed(ValueError):
    """A name, address or port in no spelling this parser accepts: the record's code, and what was wrong."""

    def __init__(self, code: str, why: str) -> None:
        super().__init__(why)
        self.code, self.why = code, why


#: One label of a host name: letters, digits and hyphens, 1 to 63, no hyphen at either end (LDH).
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?", re.ASCII)
#: A last label that reads as a number (decimal, or 0x hex): a resolver would take the name for an IPv4 address.
_NUMERIC = re.compile(r"[0-9]+|0x[0-9a-f]*", re.ASCII)
#: IPv4 in its one spelling: four decimal parts 0 to 255, without leading zeros.
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_QUAD = re.compile(rf"(?:{_OCTET}\.){{3}}{_OCTET}", re.ASCII)
_PORT = re.compile(r"[1-9][0-9]{0,4}", re.ASCII)


def hostname(text: str) -> str:
    """`text` as the one string both the rules and the resolver get: a lowercased LDH host name.

    An optional trailing dot is removed; a name with non-ASCII letters is taken
    in its IDNA (punycode) form. Anything else is Malformed("bad_name"), and a
    name whose last label is a number is Malformed("bad_address"): that is an
    IPv4 address in a spelling other than the dotted quad (`127.1`, `0x7f.1`).
    """
    name = text[:-1] if text.endswith(".") else text
    if not name.isascii():
        try:
            name = name.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise Malformed("bad_name", f"not a name in IDNA: {exc}") from None
    name = name.lower()
    if not name or len(name) > 253:
        raise Malformed("bad_name", "a host name has 1 to 253 characters")
    labels = name.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        raise Malformed("bad_name", "a host name's labels are 1 to 63 letters, digits and inner hyphens")
    if _NUMERIC.fullmatch(labels[-1]):
        raise Malformed("bad_address", "an IPv4 address is four decimal parts, 0 to 255, without leading zeros")
    return name


def unmapped(address: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address as the IPv4 address it maps; any other as it is."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def host(text: str) -> str | IPAddress:
    """A host as the proxy reads it (any way in): an address, in its one spelling, or a checked host name.

    IPv4 only as a dotted quad; IPv6 bare or in brackets, without a zone id
    (no rule can name one), an IPv4-mapped one as the IPv4 address.
    """
    bracketed = text.startswith("[") and text.endswith("]")
    inner = text[1:-1] if bracketed else text
    if ":" in inner:
        if "%" in inner:
            raise Malformed("bad_address", "an IPv6 address with a zone id is not accepted")
        try:  # ipaddress takes ASCII hex digits only (not str.isdigit's)
            return unmapped(ipaddress.IPv6Address(inner))
        except ValueError as exc:
            raise Malformed("bad_address", f"not an IPv6 address: {exc}") from None
    if bracketed:
        raise Malformed("bad_address", "only an IPv6 address goes in brackets")
    bare = text[:-1] if text.endswith(".") else text
    if _QUAD.fullmatch(bare):
        return ipaddress.IPv4Address(bare)
    return hostname(text)


def port(text: str) -> int:
    """A port as decimal ASCII digits, 1 to 65535, without a sign or leading zeros; else Malformed("bad_port")."""
    if not _PORT.fullmatch(text) or int(text) > 65535:
        raise Malformed("bad_port", "a port is 1 to 65535 in decimal digits")
    return int(text)


def split(text: str) -> tuple[str, str | None]:
    """`host[:port]` or `[IPv6][:port]` as its host's text and its port's (None: no port given)."""
    if text.startswith("["):
        inside, bracket, rest = text.partition("]")
        if rest and not rest.startswith(":"):
            raise Malformed("bad_address", "an IPv6 address in brackets is followed by nothing or :PORT")
        return inside + bracket, (rest[1:] if rest else None)
    if text.count(":") > 1:
        raise Malformed("bad_address", "an IPv6 address with a port goes in brackets")
    where, colon, after = text.partition(":")
    return where, (after if colon else None)


def authority(text: str, default: int | None) -> tuple[str | IPAddress, int]:
    """`host[:port]` or `[IPv6][:port]` as (host, port); `default` when no port is given (None: one is needed)."""
    where, given = split(text)
    if given is None:
        if default is None:
            raise Malformed("bad_port", "a port is needed")
        return host(where), default
    return host(where), port(given)


def escaped(text: str) -> str:
    """`text` as a record shows a refused host: control bytes, backslashes and non-ASCII escaped, then cut."""
    return text.encode("unicode_escape").decode("ascii")[:HOST_CHARS]


class Rules:
    """A pinned list, ready to decide: `host_allowed` for a name or address, `address_allowed` after resolving."""

    def __init__(self, pinned: Sequence[str]) -> None:
        self.names: dict[str, set[int]] = {}
        self.wildcards: list[tuple[str, int]] = []
        self.networks: list[tuple[IPNetwork, int]] = []
        for text in pinned:
            for rule in parse(text):
                if rule.kind == "name":
                    self.names.setdefault(rule.host, set()).add(rule.port)
                elif rule.kind == "wildcard":
                    self.wildcards.append((rule.host, rule.port))
                else:
                    self.networks.append((ipaddress.ip_network(rule.host), rule.port))

    def name_allowed(self, name: str, port: int) -> str | None:
        """None if a name rule allows `name` (as `hostname` gave it) on `port`; else the code of the refusal."""
        ports = self.names.get(name, set())
        if 0 in ports or port in ports:
            return None
        listed = bool(ports)
        for suffix, allowed in self.wildcards:
            if name.endswith("." + suffix):
                listed = True
                if allowed in (0, port):
                    return None
        return "port_not_listed" if listed else "not_listed"

    def address_allowed(self, address: IPAddress, port: int, *, named: bool) -> str | None:
        """None if a connection to `address` on `port` is allowed; else the code of the refusal.

        `named`: the address is what an allowed name resolved to, so an ordinary
        address needs no rule of its own; a special one still does.
        """
        address = unmapped(address)
        # An IPv6 address that carries an IPv4 one (NAT64, 6to4) is as special as the address it carries.
        block, kind = special(address)
        if block is None and (carried := _carried(address)) is not None:
            block, kind = special(carried)
        for network, allowed in self.networks:
            if address.version != network.version or address not in network or allowed not in (0, port):
                continue
            if block is None or (network.version == block.version and network.subnet_of(block)):  # type: ignore[arg-type]
                return None
        if block is not None:
            return kind
        return None if named else "not_listed"


#: NAT64's well-known prefix: a host with a NAT64 gateway reaches the IPv4 address in the last 32 bits.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _carried(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address a NAT64 or 6to4 address carries, if it is one."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def special(address: IPAddress) -> tuple[IPNetwork | None, str]:
    """The special range `address` lies in and its kind ("metadata", "loopback", ...), or (None, "")."""
    for network, kind in SPECIAL:
        if address.version == network.version and address in network:
            return network, kind
    return None, ""


#: A denial's code, in words (the proxy's answer and `show`).
REASONS = {
    "not_listed": "is not on this trial's allowlist",
    "port_not_listed": "is on this trial's allowlist, but not on this port",
    "metadata": "is a cloud metadata address",
    "loopback": "is a loopback address",
    "private": "is a private address",
    "shared": "is a shared (carrier-grade NAT) address",
    "link-local": "is a link-local address",
    "reserved": "is a reserved address",
    "capacity": "was refused: too many connections open at once",
    "protocol": "was refused: not a proxy request this proxy speaks",
    "bad_name": "is not a host name",
    "bad_address": "is not an address in the one spelling accepted",
    "bad_port": "has no port in the one spelling accepted",
}

__all__ = [
    "DEFAULT_PORTS",
    "HOST_CHARS",
    "LISTED",
    "NETWORKS",
    "REASONS",
    "RECORD_BOUND",
    "SPECIAL",
    "Malformed",
    "Rule",
    "Rules",
    "authority",
    "canonical",
    "checked",
    "escaped",
    "host",
    "hostname",
    "parse",
    "port",
    "special",
    "split",
    "stored",
    "unmapped",
]
