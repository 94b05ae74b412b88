"""A fault-injecting tool on 127.0.0.1 that plays one script per call and counts attempts.

A call is named by its path, ``/<run>/<scenario>/<n>``: every attempt at the same path is
the same call, so attempts are counted where they land (at the tool), whatever the proxy
in front says. The scenario picks the script; attempt k plays step k (the last step
repeats). Every answer the tool gives carries ``X-Fault-Tool: 1``, so an agent can tell
the tool's answers from ones a proxy made up.
"""

from __future__ import annotations

import asyncio
import enum
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path

import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.mcp_tap import reset_connection

STAMP = "X-Fault-Tool"
OK = {"success": True, "data": {"temp_c": 21.5, "location": "Tokyo, Japan"}}


def _failure(code: str, category: str, retryable: bool, message: str) -> dict[str, object]:
    return {
        "success": False,
        "error": {"code": code, "category": category, "retryable": retryable, "message": message},
    }


BUSY = _failure("BUSY", "SERVICE_ERROR", True, "the weather service is busy")
RATE_LIMITED = _failure("RATE_LIMITED", "RATE_LIMIT", True, "too many calls")
UNKNOWN_PLACE = _failure("UNKNOWN_LOCATION", "INPUT_ERROR", False, "no such place on the map")


class Step(enum.Enum):
    OK = "ok"
    BUSY_503 = "503"
    BUSY_IN_200 = "200 busy envelope"
    RESET = "reset"  # the request is read whole, then the connection is reset, no answer
    STALL = "stall"  # the answer (200) comes after stall_s
    RATE_LIMITED = "429 until an HTTP-date"  # 429 until the date it names, then 200
    NOT_RETRYABLE = "400 retryable:false"
    FLAKY = "flaky"  # per attempt: a fault (503 or reset, even odds) at flaky_ratio, else 200


RATE_LIMITED_EARLY = "429 early"  # an attempt that came before the date the 429 named


@dataclass
class FaultTool:
    scripts: Mapping[str, Sequence[Step]]
    stall_s: float = 3.0
    flaky_ratio: float = 0.3
    rate_limit_s: float = 2.0
    seed: int = 12
    # Per call, what the tool did at each attempt: a Step's value or RATE_LIMITED_EARLY.
    attempts: dict[str, list[str]] = field(default_factory=dict)
    _open_at: dict[str, float] = field(default_factory=dict)  # per call: when 429s end (wall)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{run}/{scenario}/{call}", self._answer)
        return app

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        call = request.path
        seen = self.attempts.setdefault(call, [])
        script = self.scripts[request.match_info["scenario"]]
        step = script[min(len(seen), len(script) - 1)]
        if step is Step.FLAKY:
            step = self._flaky()
        if step is Step.RATE_LIMITED:
            did, answer = self._rate_limited(call, seen)
            seen.append(did)
            return answer
        seen.append(step.value)
        if step is Step.RESET:
            reset_connection(request)
            return web.Response()  # never written: the connection is gone
        if step is Step.STALL:
            await asyncio.sleep(self.stall_s)
        status, body = _ANSWERS[step]
        return _json(status, body)

    def _flaky(self) -> Step:
        if self._random.random() >= self.flaky_ratio:
            return Step.OK
        return Step.BUSY_503 if self._random.random() < 0.5 else Step.RESET

    def _rate_limited(self, call: str, seen: Sequence[str]) -> tuple[str, web.Response]:
        now = time.time()
        # HTTP-dates count whole seconds: the date named is at least rate_limit_s away.
        open_at = self._open_at.setdefault(call, float(int(now + self.rate_limit_s) + 1))
        if now >= open_at:
            return Step.OK.value, _json(200, OK)
        answer = _json(429, RATE_LIMITED)
        answer.headers["Retry-After"] = formatdate(open_at, usegmt=True)
        return (RATE_LIMITED_EARLY if seen else Step.RATE_LIMITED.value), answer


_ANSWERS: dict[Step, tuple[int, Mapping[str, object]]] = {
    Step.OK: (200, OK),
    Step.STALL: (200, OK),
    Step.BUSY_503: (503, BUSY),
    Step.BUSY_IN_200: (200, BUSY),
    Step.NOT_RETRYABLE: (400, UNKNOWN_PLACE),
}


def _json(status: int, body: Mapping[str, object]) -> web.Response:
    return web.Response(
        status=status,
        body=orjson.dumps(body),
        content_type="application/json",
        headers={STAMP: "1"},
    )
