"""Every value that reaches a manifest or a script is checked for its field, or refused with one line.

Kubernetes names are DNS labels or subdomains, quantities and label keys have their grammars, an image
is a reference; Slurm's directives get their own. No value may hold a control character: a newline in a
`#SBATCH` line would end the directives and run the rest as a shell command.
"""

from __future__ import annotations

import re

from tunebench.errors import UserError

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
QUANTITY = re.compile(r"[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?")
LABEL_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
PATH_COMPONENT = re.compile(r"[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*")
DOMAIN = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*(:[0-9]+)?")
TAG = re.compile(r"[\w][\w.-]{0,127}")
DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
SLURM_NAME = re.compile(r"[A-Za-z0-9._+:@=-]+")
SLURM_PARTITION = re.compile(r"[A-Za-z0-9._-]+(,[A-Za-z0-9._-]+)*")
SLURM_TIME = re.compile(r"\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}(:\d{1,2}(:\d{1,2})?)?|UNLIMITED|INFINITE")


def _bad(what: str, value: str, allowed: str) -> UserError:
    return UserError(f"invalid {what}={value!r}: {allowed}")


def plain(what: str, value: str) -> str:
    """Any text without control characters (newlines, tabs, NUL)."""
    if not value or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise _bad(what, value, "must be non-empty text without newlines or other control characters")
    return value


def dns_label(what: str, value: str, max_len: int = 63) -> str:
    if len(value) > max_len or not DNS_LABEL.fullmatch(value):
        raise _bad(what, value, f"a DNS label: lowercase letters, digits and '-', starting and ending with a letter "
                                f"or digit, at most {max_len} characters")
    return value


def dns_subdomain(what: str, value: str) -> str:
    if len(value) > 253 or not DNS_SUBDOMAIN.fullmatch(value):
        raise _bad(what, value, "a DNS subdomain: lowercase letters, digits, '-' and '.', at most 253 characters")
    return value


def quantity(what: str, value: str) -> str:
    if not QUANTITY.fullmatch(value):
        raise _bad(what, value, "a Kubernetes quantity such as 16Gi, 512Mi or 1G")
    return value


def label_key(what: str, value: str) -> str:
    prefix, _, name = value.rpartition("/")
    if (prefix and not DNS_SUBDOMAIN.fullmatch(prefix)) or not name or len(name) > 63 \
            or not LABEL_NAME.fullmatch(name):
        raise _bad(what, value, "a label key: [prefix/]name, the name at most 63 letters, digits, '-', '_' or '.'")
    return value


def label_value(what: str, value: str) -> str:
    if len(value) > 63 or not LABEL_NAME.fullmatch(value):
        raise _bad(what, value, "a label value: at most 63 letters, digits, '-', '_' or '.'")
    return value


def image(value: str) -> str:
    """A container image reference: [domain[:port]/]path[:tag][@digest], as Docker parses it."""
    plain("image", value)
    rest, _, digest = value.partition("@")
    first, slash, tail = rest.partition("/")
    # Docker's rule: the first component is a registry when it has a '.', a ':', upper case, or is localhost.
    domain = slash and (any(c in first for c in ".:") or first == "localhost" or first != first.lower())
    path = tail if domain else rest
    last = path.rsplit("/", 1)[-1]
    name, colon, tag = last.rpartition(":") if ":" in last else (last, "", "")
    path = path[: len(path) - len(last)] + name
    ok = (not domain or DOMAIN.fullmatch(first)) and all(PATH_COMPONENT.fullmatch(c) for c in path.split("/")) \
        and (not colon or TAG.fullmatch(tag)) and (not digest or DIGEST.fullmatch(digest))
    if not ok or len(value) > 255:
        raise _bad("image", value, "an image reference such as registry.example.com/team/tunebench:0.1 (lowercase "
                                   "path, optional :tag and @sha256:digest)")
    return value


def slurm_name(value: str) -> str:
    if not SLURM_NAME.fullmatch(plain("job-name", value)):
        raise _bad("job-name", value, "letters, digits and . _ + : @ = - only")
    return value


def slurm_partition(value: str) -> str:
    if not SLURM_PARTITION.fullmatch(plain("partition", value)):
        raise _bad("partition", value, "partition names (letters, digits, . _ -), comma-separated")
    return value


def slurm_time(value: str) -> str:
    if not SLURM_TIME.fullmatch(plain("time", value)):
        raise _bad("time", value, "a Slurm time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED")
    return value
