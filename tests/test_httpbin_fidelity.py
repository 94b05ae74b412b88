"""Field test of wire fidelity, with httpbin (real software nobody here wrote) as the tool.

Each request goes to httpbin twice, straight and through the sidecar, as raw bytes on a
socket. What httpbin received (its request line and header block as they arrived, and what
its echo endpoints report) and what came back (status line, headers in order, body bytes)
must be the same both ways, but for the changes ``docs/forwarding.md`` documents:

- to the tool: hop-by-hop headers dropped; ``X-Forwarded-For`` appended, ``-Proto`` and
  ``-Host`` set; ``X-Request-ID`` and ``Idempotency-Key`` added when the agent sent none;
  ``Host`` as the agent sent it; a body read whole goes with its ``Content-Length``;
- to the agent: hop-by-hop headers dropped; ``X-Sidecar-*`` (and ``x-should-retry: false``
  when the sidecar gave up) added; ``Date`` added when the tool sent none; a body read whole
  comes with its ``Content-Length``; chunk boundaries may differ.

Any other difference is a fidelity defect.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

import brotli
import pytest
from httpbin import app as httpbin_app
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

# RFC 9110 §7.6.1 and the proxy-only fields: never compared, in either direction.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# httpbin hides these from its echoed headers unless the query has ``show_env``.
HTTPBIN_ENV_HEADERS = frozenset({"x-forwarded-proto", "x-forwarded-for", "x-request-id"})
OUTCOMES = frozenset(
    {
        "ok",
        "recovered",
        "exhausted",
        "unreachable",
        "not-retryable",
        "budget-exhausted",
        "deadline",
        "overloaded",
    }
)
AGENT_HEADERS: tuple[tuple[str, str], ...] = (
    ("User-Agent", "fidelity-agent/1.0"),
    ("Accept", "*/*"),
    ("X-Custom", "one"),
    ("X-Custom", "two"),
)
LARGE = bytes(b"0123456789abcdef"[i % 16] for i in range(64 * 1024))
MULTIPART = (
    b"--XyZ\r\n"
    b'Content-Disposition: form-data; name="field"\r\n\r\n'
    b"value\r\n"
    b"--XyZ\r\n"
    b'Content-Disposition: form-data; name="upload"; filename="a.txt"\r\n'
    b"Content-Type: text/plain\r\n\r\n"
    b"file contents\r\n"
    b"--XyZ--\r\n"
)
Pairs = list[tuple[str, str]]


# --- httpbin on loopback ---------------------------------------------------------------


@dataclass
class Received:
    """A request head as httpbin's server read it off the socket."""

    request_line: str
    headers: Pairs


@dataclass
class Httpbin:
    port: int
    seen: list[Received]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _handler(seen: list[Received], flavour: str) -> type[WSGIRequestHandler]:
    class Handler(WSGIRequestHandler):
        if flavour == "http10":
            # What werkzeug speaks unthreaded: no chunking, a body ends when the
            # connection does. Set here, werkzeug leaves it alone.
            protocol_version = "HTTP/1.0"

        def make_environ(self) -> Any:
            # The head before WSGI folds it into an environ: names as spelled, in order.
            seen.append(
                Received(self.raw_requestline.decode("latin-1"), list(self.headers.items()))
            )
            environ = super().make_environ()
            if environ.get("wsgi.input_terminated"):
                # A chunked request body: werkzeug de-chunks it, but httpbin refuses with
                # 501 any chunked body not served by gunicorn, whose name it looks for.
                environ["SERVER_SOFTWARE"] = "gunicorn/werkzeug-dechunks"
            return environ

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            pass  # one access-log line per request would bury a failure's output

        def send_response(self, code: int, message: str | None = None) -> None:
            if flavour != "bare":
                super().send_response(code, message)
                return
            # http.server adds Server and Date to every answer: a bare server sends
            # neither, so the sidecar is seen adding Date (as RFC 9110 §6.6.1 asks of it)
            # and never a Server of its own.
            self.log_request(code)
            self.send_response_only(code, message)

    return Handler


@contextlib.contextmanager
def serve_httpbin(flavour: str) -> Iterator[Httpbin]:
    seen: list[Received] = []
    server: BaseWSGIServer = make_server(
        "127.0.0.1", 0, httpbin_app, threaded=True, request_handler=_handler(seen, flavour)
    )
    # A short poll interval: shutdown() waits for the loop's next look at the flag.
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield Httpbin(server.server_address[1], seen)
    finally:
        if thread.is_alive():
            server.shutdown()
        thread.join(timeout=5)
        server.server_close()
        assert not thread.is_alive(), "httpbin's server thread did not stop"


FLAVOURS = ("werkzeug", "bare", "http10")


@pytest.fixture(scope="module")
def httpbins() -> Iterator[dict[str, Httpbin]]:
    """httpbin served by werkzeug as it comes ("werkzeug"); without the Server and Date
    headers http.server adds ("bare"); and speaking HTTP/1.0 ("http10")."""
    with contextlib.ExitStack() as stack:
        yield {flavour: stack.enter_context(serve_httpbin(flavour)) for flavour in FLAVOURS}


# --- the cases -------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    method: str
    target: str
    headers: tuple[tuple[str, str], ...] = ()
    # None: no body and no framing header; b"" goes with Content-Length: 0.
    body: bytes | None = None
    chunked: bool = False  # the agent sends the body chunked (in 1000-byte chunks)
    # How the answer bodies compare: "bytes" exactly; "echo" as httpbin's JSON echo of the
    # request, "lines" as one echo per line; "gzip", "deflate", "br": an echo, compressed.
    compare: str = "bytes"
    # Answer headers whose values httpbin makes anew on each call (ETag, Last-Modified).
    volatile: frozenset[str] = frozenset()
    settings: tuple[tuple[str, Any], ...] = ()
    server: str = "werkzeug"  # one of FLAVOURS
    version: str = "HTTP/1.1"  # the agent's

    def agent_values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name.lower()]


JSON_BODY = b'{"city": "Tokyo", "lat": 35.6,   "units":"metric", "tags": ["a", "\\u00e9"]}'
FORM_BODY = b"a=1&b=two+words&c=%E2%9C%93&a=2"
JSON_TYPE = (("Content-Type", "application/json"),)
FORM_TYPE = (("Content-Type", "application/x-www-form-urlencoded"),)


def _body_cases() -> list[Case]:
    cases: list[Case] = []
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        low = method.lower()
        cases += [
            Case(
                f"{low}-json", method, "/anything?show_env=1", JSON_TYPE, JSON_BODY, compare="echo"
            ),
            Case(f"{low}-form", method, "/anything", FORM_TYPE, FORM_BODY, compare="echo"),
            Case(f"{low}-empty-cl0", method, "/anything?show_env=1", body=b"", compare="echo"),
            Case(f"{low}-no-body", method, "/anything?show_env=1", compare="echo"),
        ]
    return cases


CASES: list[Case] = [
    Case("get", "GET", "/get", compare="echo"),
    Case("get-query", "GET", "/get?a=1&b=two%20words&a=3&show_env=1", compare="echo"),
    Case(
        "headers-agent-ids",
        "GET",
        "/headers?show_env=1",
        (
            ("X-Request-ID", "agent-chosen-id"),
            ("Idempotency-Key", "agent-key-1"),
            ("X-Forwarded-For", "203.0.113.7"),
            ("Authorization", "Bearer secret-token"),
        ),
        compare="echo",
    ),
    Case("headers", "GET", "/headers", compare="echo"),
    Case("anything", "GET", "/anything", compare="echo"),
    Case(
        "anything-raw-path",
        "GET",
        "/anything/a%2Fb/%7Euser/a%20b?q=a%20b&q=c&empty=&x=%2f&show_env=1",
        compare="echo",
    ),
    Case("trace-anything", "TRACE", "/anything?show_env=1", compare="echo"),
    *_body_cases(),
    Case(
        "post-multipart",
        "POST",
        "/anything",
        (("Content-Type", "multipart/form-data; boundary=XyZ"),),
        MULTIPART,
        compare="echo",
    ),
    Case(
        "post-binary",
        "POST",
        "/anything",
        (("Content-Type", "application/octet-stream"),),
        bytes(range(256)),
        compare="echo",
    ),
    Case(
        "post-json-chunked",
        "POST",
        "/anything?show_env=1",
        JSON_TYPE,
        JSON_BODY * 40,
        chunked=True,
        compare="echo",
    ),
    Case("post-64k", "POST", "/anything", (("Content-Type", "text/plain"),), LARGE, compare="echo"),
    Case(
        "post-64k-streamed",
        "POST",
        "/anything?show_env=1",
        (("Content-Type", "text/plain"),),
        LARGE,
        compare="echo",
        settings=(("max_body_bytes", 1024),),
    ),
    Case(
        "post-64k-chunked-streamed",
        "POST",
        "/anything",
        (("Content-Type", "text/plain"),),
        LARGE,
        chunked=True,
        compare="echo",
        settings=(("max_body_bytes", 1024),),
    ),
    Case("head-get", "HEAD", "/get", compare="echo"),
    Case("head-anything", "HEAD", "/anything", compare="echo"),
    Case("options-get", "OPTIONS", "/get"),
    Case("options-anything", "OPTIONS", "/anything"),
    *(Case(f"status-{code}", "GET", f"/status/{code}") for code in (200, 204, 304, 404, 418, 500)),
    Case("status-post-500", "POST", "/status/500", JSON_TYPE, JSON_BODY),
    Case("response-headers", "GET", "/response-headers?X-Foo=bar&X-Foo=baz"),
    Case(
        "response-headers-type-server",
        "GET",
        "/response-headers?Content-Type=text/plain;+charset=UTF-8&Server=tool-server/9",
    ),
    Case("bytes-1024", "GET", "/bytes/1024?seed=7"),
    Case("stream-3", "GET", "/stream/3", compare="lines"),
    Case("gzip", "GET", "/gzip", (("Accept-Encoding", "gzip"),), compare="gzip"),
    Case("deflate", "GET", "/deflate", (("Accept-Encoding", "deflate"),), compare="deflate"),
    Case("brotli", "GET", "/brotli", (("Accept-Encoding", "br"),), compare="br"),
    Case("redirect-to", "GET", "/redirect-to?url=/get"),
    Case("redirect-to-307", "POST", "/redirect-to?url=/anything&status_code=307", JSON_TYPE, b"{}"),
    Case("cookies-set", "GET", "/cookies/set?a=b&c=d"),
    Case("cookies", "GET", "/cookies", (("Cookie", "a=b; c=d"),)),
    Case("encoding-utf8", "GET", "/encoding/utf8"),
    Case("html", "GET", "/html"),
    Case("json", "GET", "/json"),
    Case("xml", "GET", "/xml"),
    Case("robots", "GET", "/robots.txt"),
    Case("range", "GET", "/range/100", (("Range", "bytes=10-19"),)),
    Case("range-unsatisfiable", "GET", "/range/100", (("Range", "bytes=200-300"),)),
    Case("etag-not-modified", "GET", "/etag/abc", (("If-None-Match", '"abc"'),)),
    Case("etag-precondition", "GET", "/etag/abc", (("If-Match", '"xyz"'),)),
    Case("cache", "GET", "/cache", compare="echo", volatile=frozenset({"etag", "last-modified"})),
    Case(
        "cache-conditional",
        "GET",
        "/cache",
        (("If-Modified-Since", "Sat, 29 Oct 1994 19:43:31 GMT"),),
    ),
    Case("delay-0", "GET", "/delay/0", compare="echo"),
    Case("drip", "GET", "/drip?numbytes=5&duration=0&delay=0"),
    Case("base64", "GET", "/base64/aGVsbG8="),
    Case("bare-get", "GET", "/get?show_env=1", compare="echo", server="bare"),
    Case("bare-head-get", "HEAD", "/get", compare="echo", server="bare"),
    Case("bare-status-204", "GET", "/status/204", server="bare"),
    Case("bare-status-304", "GET", "/status/304", server="bare"),
    Case("bare-status-500", "GET", "/status/500", server="bare"),
    Case("bare-bytes", "GET", "/bytes/1024?seed=7", server="bare"),
    Case("bare-stream-3", "GET", "/stream/3", compare="lines", server="bare"),
    Case("bare-drip", "GET", "/drip?numbytes=5&duration=0&delay=0", server="bare"),
    # Beyond the basics: framing, sizes and header spellings a proxy could get wrong.
    Case("get-cl0", "GET", "/anything?show_env=1", body=b"", compare="echo"),
    Case("get-with-body", "GET", "/anything", JSON_TYPE, JSON_BODY, compare="echo"),
    Case(
        "request-hop-by-hop",
        "GET",
        "/headers?show_env=1",
        (
            ("Connection", "X-Hop"),
            ("X-Hop", "private"),
            ("Keep-Alive", "timeout=5"),
            ("TE", "trailers"),
            ("Proxy-Authorization", "Basic cHJveHk6c2VjcmV0"),
        ),
        compare="echo",
    ),
    Case(
        "request-control-headers",
        "GET",
        "/headers",
        (("X-Sidecar-Max-Retries", "0"), ("X-Sidecar-Timeout-Ms", "5000")),
        compare="echo",
    ),
    Case(
        "request-header-spellings",
        "GET",
        "/headers",
        (
            ("x-lower-case", "v1"),
            ("X-MiXeD-CaSe", "v2"),
            ("X-Empty", ""),
            ("X-Spaces", "a  b\tc"),
            # UTF-8 bytes (é) written as latin-1 characters: the bytes go out as they are.
            ("X-Utf8", "caf\u00c3\u00a9"),
            ("X-Quote", '"quoted", <angle>'),
        ),
        compare="echo",
    ),
    Case(
        "post-expect-continue",
        "POST",
        "/anything?show_env=1",
        (*JSON_TYPE, ("Expect", "100-continue")),
        JSON_BODY,
        compare="echo",
    ),
    Case(
        "raw-target-specials",
        "GET",
        "/anything/x;p=1/%7e/%2F?a=|&b={x}&c=%zz&d=%2F&e=a+b&&f&show_env=1",
        compare="echo",
    ),
    # Flask answers a "//" in the path with a 308 to the merged path.
    Case("raw-target-double-slash", "GET", "/anything//double//slash?a=|&c=%zz"),
    Case(
        "post-300k-json-answer",
        "POST",
        "/anything",
        (("Content-Type", "text/plain"),),
        LARGE * 5,
        compare="echo",
    ),
    Case("head-stream-3", "HEAD", "/stream/3"),
    Case("head-bytes", "HEAD", "/bytes/1024?seed=7"),
    Case("head-status-404", "HEAD", "/status/404"),
    Case("head-drip", "HEAD", "/drip?numbytes=5&duration=0&delay=0"),
    Case("stream-bytes", "GET", "/stream-bytes/200000?seed=3&chunk_size=4096"),
    Case("range-whole", "GET", "/range/102400"),
    Case("status-401", "GET", "/status/401"),
    Case("status-429", "GET", "/status/429"),
    Case("basic-auth", "GET", "/basic-auth/user/pass", (("Authorization", "Basic dXNlcjpwYXNz"),)),
    Case("absolute-redirect", "GET", "/absolute-redirect/1"),
    Case("relative-redirect", "GET", "/relative-redirect/1"),
    Case("response-headers-empty-value", "GET", "/response-headers?X-Empty=&X-Spaces=a++b"),
    Case(
        "response-headers-hop-by-hop",
        "GET",
        "/response-headers?Connection=X-Hop&X-Hop=private&Keep-Alive=timeout%3D5&X-Kept=1",
    ),
    Case("response-headers-should-retry", "GET", "/response-headers?x-should-retry=true"),
    Case("response-headers-forged-report", "GET", "/response-headers?X-Sidecar-Outcome=forged"),
    Case("http10-get", "GET", "/get?show_env=1", compare="echo", server="http10"),
    Case("http10-stream-3", "GET", "/stream/3", compare="lines", server="http10"),
    Case("http10-stream-bytes", "GET", "/stream-bytes/20000?seed=3", server="http10"),
    Case("http10-status-404", "GET", "/status/404", server="http10"),
    Case("http10-head-stream", "HEAD", "/stream/3", server="http10"),
    Case("http10-agent-get", "GET", "/get?show_env=1", compare="echo", version="HTTP/1.0"),
    Case("http10-agent-stream-3", "GET", "/stream/3", compare="lines", version="HTTP/1.0"),
    Case("http10-agent-stream-bytes", "GET", "/stream-bytes/20000?seed=3", version="HTTP/1.0"),
    Case(
        "http10-agent-post",
        "POST",
        "/anything?show_env=1",
        JSON_TYPE,
        JSON_BODY,
        compare="echo",
        version="HTTP/1.0",
    ),
]


# --- HTTP/1.1 on a raw socket ----------------------------------------------------------


@dataclass
class Answer:
    status_line: str
    status: int
    reason: str
    headers: Pairs
    body: bytes  # without the framing
    framing: str  # "length", "chunked", "close" or "none" (no body by status or method)
    extra: bytes = b""  # bytes after the framed body: never expected
    interim: list[bytes] = field(default_factory=list)  # 1xx answers before this one


def _request_bytes(case: Case, host: str) -> bytes:
    lines = [f"{case.method} {case.target} {case.version}", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in (*AGENT_HEADERS, *case.headers)]
    body = b""
    if case.body is not None and case.chunked:
        lines.append("Transfer-Encoding: chunked")
        parts = [case.body[i : i + 1000] for i in range(0, len(case.body), 1000)]
        body = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"
    elif case.body is not None:
        lines.append(f"Content-Length: {len(case.body)}")
        body = case.body
    # Each exchange ends with the server closing: what was read is the whole answer.
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _dechunk(data: bytes) -> tuple[bytes, bytes]:
    body = bytearray()
    while True:
        size_line, sep, data = data.partition(b"\r\n")
        assert sep, "chunked body cut short"
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            trailers, sep, rest = data.partition(b"\r\n")
            while trailers:  # a trailer section: skip its fields
                trailers, sep, rest = rest.partition(b"\r\n")
            return bytes(body), rest
        body += data[:size]
        assert data[size : size + 2] == b"\r\n", "chunk not followed by CRLF"
        data = data[size + 2 :]


def parse_answer(raw: bytes, method: str) -> Answer:
    interim: list[bytes] = []
    while raw.startswith(b"HTTP/1.1 1") and not raw.startswith(b"HTTP/1.1 101"):
        head, _, raw = raw.partition(b"\r\n\r\n")
        interim.append(head)
    answer = _parse_final(raw, method)
    answer.interim = interim
    return answer


def _parse_final(raw: bytes, method: str) -> Answer:
    head, sep, rest = raw.partition(b"\r\n\r\n")
    assert sep, f"no complete answer head in {raw[:200]!r}"
    status_line, *field_lines = head.decode("latin-1").split("\r\n")
    _, code, *reason = status_line.split(" ", 2)
    headers = [
        (name, value.strip(" \t")) for name, _, value in (f.partition(":") for f in field_lines)
    ]
    status = int(code)
    names = {name.lower(): value for name, value in headers}
    if method == "HEAD" or status in (204, 304) or status < 200:
        return Answer(status_line, status, "".join(reason), headers, b"", "none", rest)
    if "transfer-encoding" in names:
        body, extra = _dechunk(rest)
        return Answer(status_line, status, "".join(reason), headers, body, "chunked", extra)
    if "content-length" in names:
        length = int(names["content-length"])
        return Answer(
            status_line, status, "".join(reason), headers, rest[:length], "length", rest[length:]
        )
    return Answer(status_line, status, "".join(reason), headers, rest, "close")


async def exchange(port: int, request: bytes, method: str) -> Answer:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return parse_answer(raw, method)


async def call(tool: Httpbin, port: int, case: Case, host: str) -> tuple[Received, Answer]:
    """``case`` sent to ``port``; the head httpbin received, and the answer."""
    before = len(tool.seen)
    answer = await exchange(port, _request_bytes(case, host), case.method)
    received = tool.seen[before:]
    assert len(received) == 1, f"httpbin received {len(received)} requests, not 1"
    return received[0], answer


# --- what may differ -------------------------------------------------------------------


def _named(pairs: Pairs, name: str) -> list[str]:
    return [value for key, value in pairs if key.lower() == name]


def _without(pairs: Pairs, names: set[str] | frozenset[str]) -> Pairs:
    return [(key, value) for key, value in pairs if key.lower() not in names]


def _hop_by_hop(pairs: Pairs) -> set[str]:
    """The hop-by-hop names of ``pairs``: the standard ones and any named in Connection."""
    named = {
        token.strip().lower()
        for value in _named(pairs, "connection")
        for token in value.split(",")
        if token.strip()
    }
    return set(HOP_BY_HOP) | named


def request_differences(
    case: Case,
    direct: Pairs,
    through: Pairs,
    agent_host: str,
    hidden: frozenset[str],
) -> list[str]:
    """Differences between the headers httpbin got straight and through the sidecar, with
    the documented changes taken out (and checked to be what the docs say).

    ``hidden``: the lower-case names httpbin leaves out of what it echoes.
    """
    diffs: list[str] = []
    direct = _without(direct, _hop_by_hop(direct))
    through = _without(through, HOP_BY_HOP)  # the sidecar's own framing, checked below
    # The agent's X-Sidecar-* headers are for the sidecar and never forwarded.
    direct = [(name, value) for name, value in direct if not name.lower().startswith("x-sidecar-")]
    # UNDOCUMENTED (not in docs/forwarding.md): the sidecar answers Expect: 100-continue
    # itself and does not pass Expect on (upstream.py: "owned by this hop"), which RFC 9110
    # §10.1.1 allows a proxy.
    direct = _without(direct, {"expect"})
    documented = {
        # The agent's chain, then the address it connected to the sidecar from.
        "x-forwarded-for": [", ".join([*case.agent_values("X-Forwarded-For"), "127.0.0.1"])],
        "x-forwarded-proto": ["http"],
        "x-forwarded-host": [agent_host],
    }
    for name, expected in documented.items():
        got = _named(through, name)
        if name in hidden:
            expected = []
        if got != expected:
            diffs.append(f"request {name}: expected {expected}, got {got}")
        direct, through = _without(direct, {name}), _without(through, {name})
    for name in ("x-request-id", "idempotency-key"):
        if case.agent_values(name):
            continue  # the agent's own: passed on unchanged, compared with the rest
        got = _named(through, name)
        if name not in hidden and (len(got) != 1 or not got[0]):
            diffs.append(f"request {name}: expected one generated value, got {got}")
        through = _without(through, {name})
    body_length = _named(through, "content-length")
    if case.chunked:
        # A body read whole is re-sent with its length; a streamed one is re-chunked.
        buffered = len(case.body or b"") <= dict(case.settings).get("max_body_bytes", 1 << 30)
        expected_length = [str(len(case.body or b""))] if buffered else []
        if body_length != expected_length:
            diffs.append(f"request content-length: expected {expected_length}, got {body_length}")
        through = _without(through, {"content-length"})
    if direct != through:
        diffs.append(f"request headers differ:\n  direct:  {direct}\n  through: {through}")
    return diffs


def _echo(doc: Any) -> Any:
    """httpbin's echo without ``origin`` (the client address: X-Forwarded-For's last hop),
    its headers as a list of pairs for ``request_differences``."""
    if not isinstance(doc, dict) or "headers" not in doc:
        return doc
    doc = dict(doc)
    doc.pop("origin", None)
    doc["headers"] = sorted(doc["headers"].items())
    return doc


def body_differences(case: Case, direct: Answer, through: Answer, agent_host: str) -> list[str]:
    if case.compare == "bytes" or case.method == "HEAD":
        if direct.body != through.body:
            shown = f"direct:  {direct.body[:300]!r}\n  through: {through.body[:300]!r}"
            return [f"body differs:\n  {shown}"]
        return []
    decode: Callable[[bytes], bytes] = {
        "gzip": gzip.decompress,
        "deflate": zlib.decompress,
        "br": brotli.decompress,
    }.get(case.compare, lambda data: data)
    if case.compare == "lines":
        direct_docs = [_echo(json.loads(line)) for line in direct.body.splitlines()]
        through_docs = [_echo(json.loads(line)) for line in through.body.splitlines()]
    else:
        direct_docs = [_echo(json.loads(decode(direct.body)))]
        through_docs = [_echo(json.loads(decode(through.body)))]
    if len(direct_docs) != len(through_docs):
        return [f"{len(direct_docs)} echoes straight, {len(through_docs)} through the sidecar"]
    hidden = frozenset() if "show_env" in case.target else HTTPBIN_ENV_HEADERS
    diffs: list[str] = []
    for direct_doc, through_doc in zip(direct_docs, through_docs, strict=True):
        direct_headers = direct_doc.pop("headers")
        through_headers = through_doc.pop("headers")
        diffs += [
            f"echoed {diff}"
            for diff in request_differences(
                case, direct_headers, through_headers, agent_host, hidden
            )
        ]
        if direct_doc != through_doc:
            diffs.append(f"echo differs:\n  direct:  {direct_doc}\n  through: {through_doc}")
    return diffs


def answer_differences(case: Case, direct: Answer, through: Answer, agent_host: str) -> list[str]:
    diffs: list[str] = []
    if case.version == "HTTP/1.0" and through.framing == "chunked":
        diffs.append(f"chunked answer to an HTTP/1.0 agent: {through.status_line!r}")
    if (direct.status, direct.reason) != (through.status, through.reason):
        diffs.append(
            f"status line: {direct.status_line!r} straight, {through.status_line!r} through"
        )
    for side, answer in (("direct", direct), ("through", through)):
        if answer.extra:
            diffs.append(
                f"{side}: {len(answer.extra)} bytes after the body: {answer.extra[:100]!r}"
            )
    # werkzeug writes "100 Continue" twice (http.server's and its own): one is the same.
    if list(dict.fromkeys(direct.interim)) != through.interim:
        diffs.append(f"interim answers: {direct.interim} straight, {through.interim} through")
    diffs += _report_differences(direct, through)
    direct_headers = _without(direct.headers, _hop_by_hop(direct.headers))
    through_headers = _without(through.headers, HOP_BY_HOP)
    # The X-Sidecar-* names are the sidecar's report: a tool's own (which could pass for
    # it) are dropped, as relay.py says; x-should-retry is checked by _report_differences.
    direct_headers, through_headers = (
        [
            (name, value)
            for name, value in headers
            if not name.lower().startswith("x-sidecar-") and name.lower() != "x-should-retry"
        ]
        for headers in (direct_headers, through_headers)
    )
    dates = _named(through_headers, "date")
    if len(dates) != 1 or not _is_http_date(dates[0]):
        diffs.append(f"through: Date should be one HTTP-date, is {dates}")
    if len(_named(direct_headers, "date")) > 1:
        diffs.append("direct: more than one Date")
    direct_headers = _without(direct_headers, {"date"})
    through_headers = _without(through_headers, {"date"})
    diffs += _length_differences(case, direct, through, direct_headers, through_headers)
    direct_headers = _without(direct_headers, {"content-length"})
    through_headers = _without(through_headers, {"content-length"})
    for name in case.volatile:
        if len(_named(direct_headers, name)) != len(_named(through_headers, name)):
            diffs.append(
                f"{name}: {_named(direct_headers, name)} vs {_named(through_headers, name)}"
            )
    direct_headers = _without(direct_headers, case.volatile)
    through_headers = _without(through_headers, case.volatile)
    if direct_headers != through_headers:
        diffs.append(
            f"answer headers differ:\n  direct:  {direct_headers}\n  through: {through_headers}"
        )
    return diffs + body_differences(case, direct, through, agent_host)


def _length_differences(
    case: Case, direct: Answer, through: Answer, direct_headers: Pairs, through_headers: Pairs
) -> list[str]:
    """The answer's Content-Length: the tool's, or for a body read whole its length."""
    direct_length = _named(direct_headers, "content-length")
    through_length = _named(through_headers, "content-length")
    if through.framing == "length" and through_length != [str(len(through.body))]:
        return [f"through: Content-Length {through_length} for {len(through.body)} bytes"]
    # An echo is as long as the request it echoes, which the sidecar made longer.
    echo = case.compare != "bytes"
    if direct_length and (len(through_length) != 1 if echo else direct_length != through_length):
        return [f"Content-Length: {direct_length} straight, {through_length} through"]
    if not direct_length and through_length and through.framing != "length":
        return [f"through: Content-Length {through_length} added to a bodiless answer"]
    return []


def _report_differences(direct: Answer, through: Answer) -> list[str]:
    attempts = _named(through.headers, "x-sidecar-attempts")
    outcome = _named(through.headers, "x-sidecar-outcome")
    trail = _named(through.headers, "x-sidecar-trail")
    should_retry = _named(through.headers, "x-should-retry")
    diffs: list[str] = []
    if attempts != ["1"]:
        diffs.append(f"X-Sidecar-Attempts: {attempts}, with max_retries=0")
    if len(outcome) != 1 or outcome[0] not in OUTCOMES or len(trail) != 1:
        diffs.append(f"X-Sidecar-Outcome {outcome}, X-Sidecar-Trail {trail}")
    elif through.status < 400 and outcome != ["ok"]:
        diffs.append(f"X-Sidecar-Outcome {outcome} for a {through.status}")
    # Given up: the sidecar's "false" replaces the tool's own; else the tool's stays.
    gave_up = bool(outcome) and outcome[0] not in ("ok", "recovered")
    expected = ["false"] if gave_up else _named(direct.headers, "x-should-retry")
    if should_retry != expected:
        diffs.append(f"x-should-retry {should_retry} with outcome {outcome}, not {expected}")
    if _named(through.headers, "x-sidecar-repaired"):
        diffs.append(f"X-Sidecar-Repaired: {_named(through.headers, 'x-sidecar-repaired')}")
    return diffs


def _is_http_date(value: str) -> bool:
    try:
        return parsedate_to_datetime(value).tzname() == "UTC" and value.endswith(" GMT")
    except (TypeError, ValueError):
        return False


# --- the test --------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
async def test_httpbin_sees_and_answers_the_same_through_the_sidecar(
    case: Case, httpbins: dict[str, Httpbin], make_sidecar: Any
) -> None:
    tool = httpbins[case.server]
    sidecar = await make_sidecar(tool.url, max_retries=0, **dict(case.settings))
    agent_host = f"127.0.0.1:{sidecar.client.port}"
    # The same Host both ways: the sidecar passes the agent's on as it came.
    direct_received, direct = await call(tool, tool.port, case, agent_host)
    through_received, through = await call(tool, sidecar.client.port, case, agent_host)

    diffs: list[str] = []
    # RFC 9112 §2.3: a proxy sends its own HTTP version, whatever the agent spoke.
    expected_line = direct_received.request_line.replace(case.version, "HTTP/1.1")
    if through_received.request_line != expected_line:
        diffs.append(
            f"request line: {direct_received.request_line!r} straight, "
            f"{through_received.request_line!r} through"
        )
    diffs += request_differences(
        case, direct_received.headers, through_received.headers, agent_host, frozenset()
    )
    diffs += answer_differences(case, direct, through, agent_host)
    assert not diffs, f"{case.method} {case.target}:\n" + "\n".join(diffs)


async def test_a_latin1_answer_header_from_httpbin_gets_the_documented_502(
    httpbins: dict[str, Httpbin], make_sidecar: Any
) -> None:
    """werkzeug writes header values as latin-1: ``é`` leaves as the lone byte 0xE9, which
    the agent's HTTP stack could not pass on unchanged. docs/forwarding.md: such an answer
    is not relayed altered but replaced by ``502 UPSTREAM_RESET`` naming the header."""
    tool = httpbins["werkzeug"]
    case = Case("latin1", "GET", "/response-headers?X-Latin1=caf%C3%A9")
    _, direct = await call(tool, tool.port, case, f"127.0.0.1:{tool.port}")
    assert direct.status == 200
    assert ("X-Latin1", "caf\u00e9") in direct.headers  # the byte 0xE9, read as latin-1

    sidecar = await make_sidecar(tool.url, max_retries=0)
    agent_host = f"127.0.0.1:{sidecar.client.port}"
    _, through = await call(tool, sidecar.client.port, case, agent_host)

    assert through.status == 502
    error = json.loads(through.body)["error"]
    assert error["code"] == "UPSTREAM_RESET"
    assert error["details"]["reason"] == "header X-Latin1 is not valid UTF-8"


async def test_httpbins_failing_endpoint_opens_its_own_circuit_and_get_keeps_answering(
    httpbins: dict[str, Httpbin], make_sidecar: Any
) -> None:
    """0.3 opened the route's circuit after six 503s from ``/status/503`` and refused a
    healthy ``/get`` for 30 s; each endpoint is a tool of its own now."""
    tool = httpbins["werkzeug"]
    sidecar = await make_sidecar(tool.url, max_retries=0, circuit_min_calls=0)
    received_before = len(tool.seen)

    failing = [(await sidecar.client.get("/status/503")).status for _ in range(6)]
    refused = await sidecar.client.get("/status/503")
    healthy = await sidecar.client.get("/get?x=1")

    assert failing == [503] * 6
    assert (await refused.json())["error"]["details"]["tool"] == "/status/503"
    assert healthy.status == 200
    assert (await healthy.json())["args"] == {"x": "1"}
    targets = [received.request_line.split()[1] for received in tool.seen[received_before:]]
    # The fifth failure in the window opened the circuit: the sixth call was refused too.
    assert targets == ["/status/503"] * 5 + ["/get?x=1"]
