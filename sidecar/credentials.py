"""What a credential looks like: secret-looking names, and credentials inside free text.

The LLM prompt's redaction and the log processor both read these patterns, so what one
hides the other cannot show.
"""

from __future__ import annotations

import re

_SECRET_NAME = re.compile(
    r"password|passwd|passphrase|(^|[-_])pass$|secret|credential|private[-_]?key|apikey"
    r"|(^|[-_])(api[-_]?)?key$|(^|[-_])((access|refresh|id|auth|api|bearer|session|csrf)[-_]?)?"
    r"token$|^auth(orization)?$|cookie|session[-_]?id|signature|(^|[-_])(sig|otp|pin)$",
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
# a password may hold an unescaped ``@``.
URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/?#\s\"'<>]*@)")

MASK = "***"


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def mask_credentials(text: str) -> str:
    """``text`` with URL userinfo, credential query values and HTTP credentials masked."""
    text = URL_USERINFO.sub(rf"\g<1>{MASK}@", text)
    text = QUERY_CREDENTIAL.sub(rf"\g<1>{MASK}", text)
    return HTTP_CREDENTIAL.sub(rf"\g<1>\g<2>{MASK}", text)
