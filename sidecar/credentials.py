"""What a credential looks like, the one rule for it: secret-looking names, credentials
inside free text, and the parts of a URL that may hold one.

The log processor, the LLM prompt's redaction and ``check-config``'s display all ask this
module, so what one hides the others cannot show.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import unquote

from yarl import URL

_SECRET_NAME = re.compile(
    r"password|passwd|passphrase|(^|[-_])pass$|secret|credential|private[-_]?key|apikey"
    r"|(^|[-_])(api[-_]?)?key$|(^|[-_])((access|refresh|id|auth|api|bearer|session|csrf)[-_]?)?"
    r"token$|^auth(orization)?$|cookie|session[-_]?(id|key)|signature|(^|[-_])(sig|otp|pin)$"
    r"|(^|[-_])jwt$",
    re.IGNORECASE,
)

# A query parameter holding a credential, in group 2 (group 1 is ``name=``). Names ending
# in a credential word match whatever comes before it (``x-api-key``, ``client_secret``,
# ``refresh_token``, S3's ``X-Amz-Signature``); short words only alone (``key``, Azure
# SAS's ``sig``, OAuth's ``code``, OpenWeatherMap's ``appid``), so ``monkey=`` stays.
QUERY_CREDENTIAL = re.compile(
    r"(?i)(?<![\w.-])((?:(?:[\w.-]*[-_.])?"
    r"(?:api[-_]?key|apikey|token|secret|password|passwd|signature|credential|session[-_]?id)"
    r"|key|sig|code|auth|pwd|app_?id)=)([^&\s#\"']+)"
)
# An HTTP credential (``Authorization: Bearer …``) written out: the value is group 3.
HTTP_CREDENTIAL = re.compile(r"(?i)\b(Bearer|Basic|Token)(\s+)([A-Za-z0-9._~+/=-]{6,})")
# ``user:password@`` in a URL, in group 2. Greedy up to the last ``@`` of the authority:
# a password may hold an unescaped ``@``. The scheme is bounded: unbounded, every letter of
# a long run such as ``a-a-a-…`` started a scan to the run's end, time quadratic in it.
URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,31}://)([^/?#\s\"'<>]*@)")
# ``user:password@host`` with no scheme before it, as a path segment or a value may carry a
# URL (``/fetch/user:pw@h.example/x``): the userinfo in group 2, a host after it (a name,
# or ``[`` for an IPv6 address). The colon is what marks a password: ``alice@example.com``
# is an address, not a credential. The user may hold escapes (``alice%40corp``, an address)
# other than a colon's and a slash's, which belong to a URL escaped whole (decoded below),
# and the password runs to the last ``@`` before the host, as in ``URL_USERINFO``, since
# it may hold an unescaped ``@``. Both parts are bounded, as the scheme above is, so that
# no run of text is scanned once per place it could start.
BARE_USERINFO = re.compile(
    r"(?i)(^|[/=\s\"'(,;])((?:[\w.~!$&'*+-]|%(?!3a|2f)[0-9a-f]{2}){0,256}"
    r":[^/?#\s\"'<>]{0,256}@)(?=[\w\[-])"
)

MASK = "***"
# A byte each pattern above, or a percent-escape of one, needs: text with none of them (most
# paths) is returned after one scan instead of three substitutions and a decode.
_MAYBE_CREDENTIAL = re.compile(r"[=@%\s]")


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def _masked(_credential: str) -> str:
    return MASK


def mask_credentials(text: str, replace: Callable[[str], str] = _masked) -> str:
    """``text`` with each credential in it (URL userinfo, a credential query value, an HTTP
    credential) replaced by ``replace(credential)``: the mask, or the redactor's placeholder.
    """
    text = URL_USERINFO.sub(lambda found: found[1] + replace(found[2][:-1]) + "@", text)
    text = BARE_USERINFO.sub(lambda found: found[1] + replace(found[2][:-1]) + "@", text)
    text = QUERY_CREDENTIAL.sub(lambda found: found[1] + replace(found[2]), text)
    return HTTP_CREDENTIAL.sub(lambda found: found[1] + found[2] + replace(found[3]), text)


# Percent-escapes undone at most this many times: a credential escaped twice (a URL in a
# path segment of a URL in a query) is found; no path needs more.
_MAX_DECODINGS = 3


def mask_path(text: str) -> str:
    """``text`` (a path, a label, a log field) with each credential masked, also one spelled
    in percent-escapes, once or more (``%3Ftoken%3D…``, ``user%253Apw%2540h``): as given
    when it holds none, else decoded as far as its credential showed, with it masked. Every
    metric label, log field and page that carries a path shows it through this one rule."""
    if not _MAYBE_CREDENTIAL.search(text):
        return text
    masked = mask_credentials(text)
    decoded = masked
    for _ in range(_MAX_DECODINGS):
        if "%" not in decoded:
            break
        decoded = unquote(decoded)
        redone = mask_credentials(decoded)
        if redone != decoded:
            return redone
    return masked


def mask_url(url: URL) -> str:
    """``url`` fit to print: its userinfo masked, and every query value, not only those
    ``QUERY_CREDENTIAL`` names, since a configured URL's parameters are set for the tool
    and any of them may be its key."""
    if url.password is not None or url.user is not None:
        url = url.with_user(MASK).with_password(None)
    if url.query:
        url = url.with_query({key: MASK for key in url.query})
    return str(url)
