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
    text = QUERY_CREDENTIAL.sub(lambda found: found[1] + replace(found[2]), text)
    return HTTP_CREDENTIAL.sub(lambda found: found[1] + found[2] + replace(found[3]), text)


def mask_path(text: str) -> str:
    """``text`` (a path, a label, a log field) with each credential masked, also one spelled
    in percent-escapes (``%3Ftoken%3D…``, ``%3Bkey%3D…``): as given when it holds none,
    else decoded with its credentials masked. Every metric label, log field and page that
    carries a path shows it through this one rule."""
    if not _MAYBE_CREDENTIAL.search(text):
        return text
    masked = mask_credentials(text)
    if "%" not in masked:
        return masked
    decoded = unquote(masked)
    redone = mask_credentials(decoded)
    return masked if redone == decoded else redone


def mask_url(url: URL) -> str:
    """``url`` fit to print: its userinfo masked, and every query value, not only those
    ``QUERY_CREDENTIAL`` names, since a configured URL's parameters are set for the tool
    and any of them may be its key."""
    if url.password is not None or url.user is not None:
        url = url.with_user(MASK).with_password(None)
    if url.query:
        url = url.with_query({key: MASK for key in url.query})
    return str(url)
