"""The demo's weather tool, in the style of a GoMind tool, with faults on purpose.

Every endpoint fails the way real tools do, so each of the sidecar's recovery paths shows:

- ``POST /weather/current``: a 503 burst (twice per payload, told apart by its
  Idempotency-Key), and a city it knows only as "City, State, Country"
  (``LOCATION_NOT_FOUND``, retryable, with a hint);
- ``POST /weather/forecast``: one 429 with ``Retry-After: 1`` per payload;
- ``POST /weather/point``: a Go-style type error when ``lat``/``lon`` are strings;
- ``POST /weather/convert``: the MIRA bot format, suggesting ``parameter_adjustments``;
- ``GET /weather/alerts``: an auth error without the right ``X-Api-Key``;
- ``GET /openapi.json``: the OpenAPI document the sidecar coerces with.

Every request is recorded so the demo can show what the tool saw at each attempt.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

API_KEY = "demo-key"
KNOWN_CITIES = {
    "Tokyo, Japan": 17.5,
    "Flower Mound, Texas, US": 22.0,
    "Lisbon, Portugal": 19.0,
}
UNITS = ("metric", "imperial")


@dataclass(frozen=True, slots=True)
class Seen:
    request_id: str
    method: str
    path: str
    body: bytes
    status: int


@dataclass
class ToolLog:
    seen: list[Seen] = field(default_factory=list)

    def for_request(self, request_id: str) -> list[Seen]:
        return [entry for entry in self.seen if entry.request_id == request_id]


def _failure(
    status: int, code: str, message: str, category: str, retryable: bool, **details: Any
) -> web.Response:
    body = {
        "success": False,
        "error": {
            "code": code,
            "message": message,
            "category": category,
            "retryable": retryable,
            "details": details,
        },
    }
    return web.json_response(body, status=status)


def _success(data: dict[str, Any]) -> web.Response:
    return web.json_response({"success": True, "data": data})


def create_tool_app() -> tuple[web.Application, ToolLog]:
    log = ToolLog()
    attempts_per_payload: Counter[str] = Counter()

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        body = await request.read()
        response: web.StreamResponse = await handler(request)
        log.seen.append(
            Seen(
                request.headers.get("X-Request-ID", ""),
                request.method,
                request.path,
                body,
                response.status,
            )
        )
        return response

    def attempt_of(request: web.Request) -> int:
        key = request.headers.get("Idempotency-Key") or request.headers.get("X-Request-ID") or ""
        attempts_per_payload[key] += 1
        return attempts_per_payload[key]

    async def current(request: web.Request) -> web.Response:
        payload = await _json(request)
        if payload is None:
            return _failure(400, "INVALID_JSON", "body is not JSON", "INPUT_ERROR", False)
        if payload.get("burst") and attempt_of(request) <= 2:
            return _failure(
                503, "SERVICE_UNAVAILABLE", "weather backend overloaded", "SERVICE_ERROR", True
            )
        location = payload.get("location")
        if location not in KNOWN_CITIES:
            return _failure(
                404,
                "LOCATION_NOT_FOUND",
                f"City '{location}' not found",
                "NOT_FOUND",
                True,
                hint="use the form 'City, State, Country' or 'City, Country'",
            )
        return _success({"location": location, "temp_c": KNOWN_CITIES[location]})

    async def forecast(request: web.Request) -> web.Response:
        payload = await _json(request) or {}
        if attempt_of(request) == 1:
            response = _failure(
                429, "RATE_LIMITED", "too many requests", "RATE_LIMIT", True, retry_after="1s"
            )
            response.headers["Retry-After"] = "1"
            return response
        return _success({"location": payload.get("location"), "days": [18.0, 19.5, 17.0]})

    async def point(request: web.Request) -> web.Response:
        payload = await _json(request) or {}
        for name in ("lat", "lon"):
            if not isinstance(payload.get(name), int | float) or isinstance(
                payload.get(name), bool
            ):
                return web.Response(
                    status=400,
                    text=f"json: cannot unmarshal {type(payload.get(name)).__name__} into Go "
                    f"struct field PointRequest.{name} of type float64",
                )
        return _success({"lat": payload["lat"], "lon": payload["lon"], "temp_c": 17.5})

    async def convert(request: web.Request) -> web.Response:
        payload = await _json(request) or {}
        if payload.get("units") not in UNITS:
            return web.json_response(
                {
                    "error": {
                        "code": "UNSUPPORTED_UNITS",
                        "category": "INPUT_ERROR",
                        "source": "weather-tool",
                        "message": f"units '{payload.get('units')}' are not supported",
                        "context": {"supported": list(UNITS)},
                        "recovery": {
                            "is_retryable": True,
                            "retry_strategy": {
                                "suggested_delay": 0,
                                "max_retries": 1,
                                "parameter_adjustments": {"units": "metric"},
                            },
                            "alternatives": [],
                            "required_actions": [],
                        },
                        "debug": {},
                    }
                },
                status=400,
            )
        value = payload.get("value_c", 0)
        converted = value if payload["units"] == "metric" else value * 9 / 5 + 32
        return _success({"value": converted, "units": payload["units"]})

    async def alerts(request: web.Request) -> web.Response:
        if request.headers.get("X-Api-Key") != API_KEY:
            return _failure(401, "AUTH_ERROR", "invalid API key", "AUTH_ERROR", False)
        return _success({"alerts": []})

    async def openapi(request: web.Request) -> web.Response:
        return web.json_response(OPENAPI)

    app = web.Application(middlewares=[record])
    app.router.add_post("/weather/current", current)
    app.router.add_post("/weather/forecast", forecast)
    app.router.add_post("/weather/point", point)
    app.router.add_post("/weather/convert", convert)
    app.router.add_get("/weather/alerts", alerts)
    app.router.add_get("/openapi.json", openapi)
    return app, log


async def _json(request: web.Request) -> dict[str, Any] | None:
    try:
        payload = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return None
    return payload if isinstance(payload, dict) else None


def _body(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "required": True,
        "content": {
            "application/json": {
                "schema": {"type": "object", "properties": properties, "required": required}
            }
        },
    }


OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "Demo weather tool", "version": "1.0.0"},
    "paths": {
        "/weather/current": {
            "post": {
                "requestBody": _body(
                    {
                        "location": {"type": "string"},
                        "units": {"type": "string", "enum": list(UNITS)},
                        "burst": {"type": "boolean"},
                    },
                    ["location"],
                )
            }
        },
        "/weather/forecast": {
            "post": {
                "requestBody": _body(
                    {"location": {"type": "string"}, "days": {"type": "integer"}}, ["location"]
                )
            }
        },
        "/weather/point": {
            "post": {
                "requestBody": _body(
                    {
                        "lat": {"type": "number"},
                        "lon": {"type": "number"},
                        "hourly": {"type": "boolean"},
                    },
                    ["lat", "lon"],
                )
            }
        },
        "/weather/convert": {
            "post": {
                "requestBody": _body(
                    {"value_c": {"type": "number"}, "units": {"type": "string"}}, ["units"]
                )
            }
        },
        "/weather/alerts": {"get": {}},
    },
}


def main(argv: list[str] | None = None) -> None:
    """Serve the demo tool alone: the example workload of the Helm chart and compose file."""
    parser = argparse.ArgumentParser(prog="python -m sidecar.demo.tool", description=main.__doc__)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    app, _ = create_tool_app()
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
