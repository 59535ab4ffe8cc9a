"""String formats the grammar enforces, each as a pattern the grammar holds and a checker.

The grammar writes a format through its pattern here (not the grammar library's
own format rules, which admit dates such as 2023-02-31); the checker is what the
validation of a finished output applies, so both sides agree on every value.
Patterns may be narrower than the format (years 1000-9999, February up to the
28th, IPv6 in full form, bounded label lengths): whatever they admit is valid.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
from collections.abc import Callable

_DATE = (
    r"[1-9][0-9]{3}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])"
    r"|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))"
)
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6}){0,1}(Z|[+\-]([01][0-9]|2[0-3]):[0-5][0-9])"
_LABEL = r"[a-z0-9]([a-z0-9\-]{0,20}[a-z0-9])?"
_HOSTNAME = _LABEL + r"(\." + _LABEL + r"){0,4}"

FORMAT_PATTERNS: dict[str, str] = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "uuid": r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
    "ipv4": r"^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$",
    "ipv6": r"^([0-9a-f]{1,4}:){7}[0-9a-f]{1,4}$",
    "hostname": f"^{_HOSTNAME}$",
    "email": r"^[a-z0-9]([a-z0-9._+\-]{0,30}[a-z0-9])?@" + _LABEL + r"(\." + _LABEL + r"){1,4}$",
}
"""format -> the pattern the grammar writes it with."""


def _is_date(value: str) -> bool:
    if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", value):
        return False
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return False
    return True


_TIME_SYNTAX = re.compile(
    r"(?P<h>[0-9]{2}):(?P<m>[0-9]{2}):(?P<s>[0-9]{2})(\.[0-9]+)?"
    r"(Z|z|[+\-](?P<oh>[0-9]{2}):(?P<om>[0-9]{2}))"
)


def _is_time(value: str) -> bool:
    match = _TIME_SYNTAX.fullmatch(value)
    if match is None:
        return False
    hour, minute, second = int(match["h"]), int(match["m"]), int(match["s"])
    offset_ok = match["oh"] is None or (int(match["oh"]) < 24 and int(match["om"]) < 60)
    return hour < 24 and minute < 60 and second < 60 and offset_ok


def _is_date_time(value: str) -> bool:
    date, sep, time = value.partition("T") if "T" in value else value.partition("t")
    return bool(sep) and _is_date(date) and _is_time(time)


def _is_uuid(value: str) -> bool:
    return re.fullmatch(r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}", value) is not None


def _is_ipv4(value: str) -> bool:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        return False
    return True


def _is_ipv6(value: str) -> bool:
    try:
        ipaddress.IPv6Address(value)
    except ValueError:
        return False
    return True


_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9\-]{0,61}[A-Za-z0-9])?")


def _is_hostname(value: str) -> bool:
    labels = value.split(".")
    return len(value) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)


def _is_email(value: str) -> bool:
    local, at, domain = value.rpartition("@")
    return bool(at) and 0 < len(local) <= 64 and "." in domain and _is_hostname(domain)


FORMAT_CHECKS: dict[str, Callable[[str], bool]] = {
    "date": _is_date,
    "time": _is_time,
    "date-time": _is_date_time,
    "uuid": _is_uuid,
    "ipv4": _is_ipv4,
    "ipv6": _is_ipv6,
    "hostname": _is_hostname,
    "email": _is_email,
}
"""format -> whether a string is one; used when a finished output is validated."""
