"""Every ``format`` the JSON Schema drafts define, checked: the format checker of the final check.

``jsonschema`` asserts a format only when an optional package for it is installed (``uri``
needs ``rfc3987``, ``date-time`` ``rfc3339-validator``, ``duration`` ``isoduration``, ...),
and lets every string through otherwise. :data:`FORMATS` checks each format the drafts
define from its RFC's grammar, with no optional package, whatever the draft of the schema
(a Draft 4 schema that says ``"format": "date"`` asks for a date):

- dates and times (RFC 3339 §5.6, with calendar days and leap years): ``date-time``,
  ``date``, ``time`` (an offset required), ``duration`` (RFC 3339 Appendix A);
- internet names (RFC 5321 / 6531 mailboxes, RFC 1123 host names, RFC 5890 IDNA):
  ``email``, ``idn-email``, ``hostname``, ``idn-hostname``, ``ipv4``, ``ipv6``;
- resource identifiers (RFC 3986 / 3987, RFC 6570, RFC 6901): ``uri``,
  ``uri-reference``, ``iri``, ``iri-reference``, ``uri-template``, ``json-pointer``,
  ``relative-json-pointer``;
- ``uuid`` (RFC 4122's hyphenated form), ``regex`` (Python's ``re``, close to ECMA 262);
- Draft 3's names for two of them: ``host-name``, ``ip-address``.

Any other name is an annotation, as the specification says, and not checked. A check
applies to strings only::

    from llamppl.decoding.grammar.json_formats import FORMATS, check_format
    check_format("uri", "https://example.com/a?b#c"), check_format("uri", "example.com")
    # (True, False)
"""

from __future__ import annotations

import datetime
import ipaddress
import re
import uuid
from collections.abc import Callable

__all__ = ["FORMATS", "check_format", "format_checker"]

# ---------------------------------------------------------------------- dates and times
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})", re.ASCII)
_TIME = re.compile(r"(\d{2}):(\d{2}):(\d{2})(?:\.\d+)?(?:[Zz]|[+-](\d{2}):(\d{2}))", re.ASCII)
_DUR_TIME = r"T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S)"
_DUR_DATE = r"(?:\d+D|\d+M(?:\d+D)?|\d+Y(?:\d+M(?:\d+D)?)?)"
_DURATION = re.compile(rf"P(?:{_DUR_DATE}(?:{_DUR_TIME})?|{_DUR_TIME}|\d+W)", re.ASCII)


def _date(text: str) -> bool:
    m = _DATE.fullmatch(text)
    if m is None:
        return False
    try:
        datetime.date(*map(int, m.groups()))
    except ValueError:
        return False
    return True


def _time(text: str) -> bool:
    m = _TIME.fullmatch(text)
    if m is None:
        return False
    hour, minute, second, off_hour, off_minute = m.groups()
    if int(hour) > 23 or int(minute) > 59 or int(second) > 60:  # 60: a leap second
        return False
    return off_hour is None or (int(off_hour) <= 23 and int(off_minute) <= 59)


def _date_time(text: str) -> bool:
    date, sep, time = text[:10], text[10:11], text[11:]
    return sep in ("T", "t") and _date(date) and _time(time)


def _duration(text: str) -> bool:
    return _DURATION.fullmatch(text) is not None


# ---------------------------------------------------------------------- internet names
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)", re.ASCII)
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_DOT_ATOM = re.compile(rf"{_ATEXT}+(?:\.{_ATEXT}+)*", re.ASCII)
_QUOTED = re.compile(r'"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\[\x20-\x7e])*"', re.ASCII)


def _hostname(text: str) -> bool:
    if not text or len(text) > 253:
        return False
    return all(_LABEL.fullmatch(label) for label in text.split("."))


def _idn_hostname(text: str) -> bool:
    if not text or not text.isprintable():
        return False
    try:
        import idna
    except ImportError:  # pragma: no cover - idna ships with the grammar extra's deps
        return _hostname(text.encode("punycode").decode("ascii"))
    try:
        idna.encode(text)
    except (idna.IDNAError, UnicodeError, ValueError):
        return False
    return True


def _address_literal(text: str) -> bool:
    inner = text[1:-1]
    if inner.lower().startswith("ipv6:"):
        return _ipv6(inner[5:])
    return _ipv4(inner)


def _mailbox(text: str, host: Callable[[str], bool], local: re.Pattern) -> bool:
    name, at, domain = text.rpartition("@")
    if not at or not name or not domain:
        return False
    if not (local.fullmatch(name) or _QUOTED.fullmatch(name)):
        return False
    if domain.startswith("[") and domain.endswith("]"):
        return _address_literal(domain)
    return host(domain)


def _email(text: str) -> bool:
    return _mailbox(text, _hostname, _DOT_ATOM)


_UTF8_ATOM = rf"(?:{_ATEXT}|[^\x00-\x7f])"
_UTF8_DOT_ATOM = re.compile(rf"{_UTF8_ATOM}+(?:\.{_UTF8_ATOM}+)*")


def _idn_email(text: str) -> bool:
    return _mailbox(text, _idn_hostname, _UTF8_DOT_ATOM)


def _ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def _ipv6(text: str) -> bool:
    if "%" in text:  # no zone identifiers in RFC 4291's text form
        return False
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------- resource identifiers
_UNRESERVED = r"A-Za-z0-9\-._~"
_SUB_DELIMS = r"!$&'()*+,;="
_PCT = r"%[0-9A-Fa-f]{2}"
_UCS = (
    "\u00a0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef"
    "\U00010000-\U0001fffd\U00020000-\U0002fffd\U00030000-\U0003fffd"
    "\U00040000-\U0004fffd\U00050000-\U0005fffd\U00060000-\U0006fffd"
    "\U00070000-\U0007fffd\U00080000-\U0008fffd\U00090000-\U0009fffd"
    "\U000a0000-\U000afffd\U000b0000-\U000bfffd\U000c0000-\U000cfffd"
    "\U000d0000-\U000dfffd\U000e1000-\U000efffd"
)
_PRIVATE = "\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+\-.]*", re.ASCII)
_SPLIT = re.compile(r"(?:([^:/?#]+):)?(?://([^/?#]*))?([^?#]*)(?:\?([^#]*))?(?:#(.*))?", re.DOTALL)


class _Identifier:
    """RFC 3986 URIs (``international=False``) or RFC 3987 IRIs: the generic syntax, checked
    component by component after the RFC's own splitting expression (its Appendix B)."""

    def __init__(self, international: bool) -> None:
        extra = _UCS if international else ""
        unreserved = rf"[{_UNRESERVED}{extra}]|{_PCT}"
        pchar = rf"(?:{unreserved}|[{_SUB_DELIMS}:@])"
        query_extra = _PRIVATE if international else ""
        self.segment = re.compile(rf"{pchar}*")
        self.segment_nc = re.compile(rf"(?:{unreserved}|[{_SUB_DELIMS}@])+")  # no ":"
        self.query = re.compile(rf"(?:{pchar}|[/?{query_extra}])*")
        self.fragment = re.compile(rf"(?:{pchar}|[/?])*")
        self.userinfo = re.compile(rf"(?:{unreserved}|[{_SUB_DELIMS}:])*")
        self.reg_name = re.compile(rf"(?:{unreserved}|[{_SUB_DELIMS}])*")

    def authority(self, text: str) -> bool:
        userinfo, at, hostport = text.rpartition("@")
        if at and not self.userinfo.fullmatch(userinfo):
            return False
        if hostport.startswith("["):
            host, close, port = hostport[1:].partition("]")
            if not close or not (_ipv6(host) or re.fullmatch(r"v[0-9A-Fa-f]+\..+", host)):
                return False
            return port == "" or re.fullmatch(r":[0-9]*", port, re.ASCII) is not None
        host, _, port = hostport.partition(":")  # a reg-name has no ":"
        if re.fullmatch(r"[0-9]*", port, re.ASCII) is None:
            return False
        return self.reg_name.fullmatch(host) is not None

    def path(self, text: str, has_authority: bool, has_scheme: bool) -> bool:
        if has_authority and text and not text.startswith("/"):
            return False
        segments = text.split("/")
        if not has_authority and text.startswith("//"):
            return False
        if not has_scheme and not text.startswith("/") and text:  # path-noscheme
            if not self.segment_nc.fullmatch(segments[0]):
                return False
        return all(self.segment.fullmatch(s) for s in segments)

    def __call__(self, text: str, reference: bool) -> bool:
        m = _SPLIT.fullmatch(text)
        if m is None:
            return False
        scheme, authority, path, query, fragment = m.groups()
        if scheme is None and not reference:
            return False
        if scheme is not None and not _SCHEME.fullmatch(scheme):
            return False  # no scheme, and a first segment with ":" is no relative reference
        if authority is not None and not self.authority(authority):
            return False
        if not self.path(path, authority is not None, scheme is not None):
            return False
        if query is not None and not self.query.fullmatch(query):
            return False
        return fragment is None or self.fragment.fullmatch(fragment) is not None


_URI, _IRI = _Identifier(False), _Identifier(True)

_VARCHAR = rf"(?:[A-Za-z0-9_]|{_PCT})"
_VARSPEC = rf"{_VARCHAR}(?:\.?{_VARCHAR})*(?::[1-9][0-9]{{0,3}}|\*)?"
_EXPRESSION = rf"\{{[+#./;?&=,!@|]?{_VARSPEC}(?:,{_VARSPEC})*\}}"
_LITERAL = rf"[^\x00-\x20\"'%<>\\^`{{|}}\x7f]|{_PCT}"
_URI_TEMPLATE = re.compile(rf"(?:{_LITERAL}|{_EXPRESSION})*")
_POINTER = re.compile(r"(?:/(?:[^~/]|~[01])*)*", re.DOTALL)
_RELATIVE_POINTER = re.compile(r"(?:0|[1-9][0-9]*)(?:#|(?:/(?:[^~/]|~[01])*)*)", re.DOTALL)


def _regex(text: str) -> bool:
    try:
        re.compile(text)
    except re.error:
        return False
    return True


def _uuid(text: str) -> bool:
    if len(text) != 36 or any(text[i] != "-" for i in (8, 13, 18, 23)):
        return False
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


#: Each format the drafts define and its check of a string.
FORMATS: dict[str, Callable[[str], bool]] = {
    "date-time": _date_time,
    "date": _date,
    "time": _time,
    "duration": _duration,
    "email": _email,
    "idn-email": _idn_email,
    "hostname": _hostname,
    "host-name": _hostname,
    "idn-hostname": _idn_hostname,
    "ipv4": _ipv4,
    "ip-address": _ipv4,
    "ipv6": _ipv6,
    "uri": lambda s: _URI(s, reference=False),
    "uri-reference": lambda s: _URI(s, reference=True),
    "iri": lambda s: _IRI(s, reference=False),
    "iri-reference": lambda s: _IRI(s, reference=True),
    "uri-template": lambda s: _URI_TEMPLATE.fullmatch(s) is not None,
    "json-pointer": lambda s: _POINTER.fullmatch(s) is not None,
    "relative-json-pointer": lambda s: _RELATIVE_POINTER.fullmatch(s) is not None,
    "uuid": _uuid,
    "regex": _regex,
}


def check_format(name: str, value: object) -> bool:
    """Whether ``value`` passes the format ``name`` (True for a name not in :data:`FORMATS`,
    and for a value that is not a string)."""
    check = FORMATS.get(name)
    return check is None or not isinstance(value, str) or bool(check(value))


def format_checker():
    """A ``jsonschema.FormatChecker`` with every check of :data:`FORMATS`."""
    from jsonschema import FormatChecker

    checker = FormatChecker(formats=())
    for name in FORMATS:
        checker.checks(name)(lambda value, name=name: check_format(name, value))
    return checker
