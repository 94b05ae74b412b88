"""A real FastAPI tool served by uvicorn; the route's schema is FastAPI's own /openapi.json.

What the tool received is recorded server-side, as bytes, for every request — whatever
FastAPI answered — and so is what its handlers got after pydantic validated it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import orjson
import pytest
from fastapi import FastAPI, Query
from pydantic import BaseModel, Field

from tests.asgi import uvicorn_serving


class Num(BaseModel):
    op: Literal["gt", "lt"]
    value: float


class Text(BaseModel):
    op: Literal["contains"]
    value: str


class Transfer(BaseModel):
    amount: float
    account: int


@dataclass
class Received:
    path: str
    query: str
    body: bytes


@dataclass
class FastApiTool:
    url: str = ""
    received: list[Received] = field(default_factory=list)
    validated: list[dict[str, Any]] = field(default_factory=list)


def build_app(tool: FastApiTool) -> FastAPI:
    app = FastAPI()

    @app.post("/filter")
    async def add_filter(rule: Annotated[Num | Text, Field(discriminator="op")]) -> dict:
        tool.validated.append({"model": type(rule).__name__, "value": rule.value})
        return {"ok": True}

    @app.post("/transfer")
    async def transfer(body: Transfer, limit: Annotated[int, Query(le=100)] = 10) -> dict:
        tool.validated.append({"amount": body.amount, "account": body.account})
        return {"ok": True, "account": str(body.account)}

    return app


def recording(app: Any, tool: FastApiTool) -> Any:
    """``app`` with every request body recorded as it arrived (the schema fetch aside)."""

    async def asgi(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] == "/openapi.json":
            await app(scope, receive, send)
            return
        chunks: list[bytes] = []

        async def recorded_receive() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
            return message

        await app(scope, recorded_receive, send)
        tool.received.append(
            Received(scope["path"], scope["query_string"].decode(), b"".join(chunks))
        )

    return asgi


@pytest.fixture
async def fastapi_tool() -> AsyncIterator[FastApiTool]:
    tool = FastApiTool()
    async with uvicorn_serving(recording(build_app(tool), tool)) as url:
        tool.url = url
        yield tool


JSON = {"Content-Type": "application/json"}


async def sidecar_for(make_sidecar: Any, tool: FastApiTool, llm: Any) -> Any:
    return await make_sidecar(
        routes=[
            {
                "name": "fastapi",
                "prefix": "/",
                "upstream": tool.url,
                "schema": f"{tool.url}/openapi.json",
            }
        ],
        llm_base_url=llm.base_url,
    )


def correction(payload: dict) -> dict:
    return {
        "can_fix": True,
        "analysis": "the tool says which value is wrong",
        "corrected_payload": payload,
        "is_transient": False,
    }


async def test_a_discriminated_union_reaches_fastapi_unchanged_or_correctly_typed(
    fastapi_tool, make_sidecar, make_llm
):
    llm = await make_llm(correction({}))
    sidecar = await sidecar_for(make_sidecar, fastapi_tool, llm)
    bodies = [
        b'{"op": "contains", "value": "42"}',
        b'{"op": "contains", "value": "007"}',
        b'{"op": "gt", "value": "42"}',
    ]

    responses = [await sidecar.client.post("/filter", data=body, headers=JSON) for body in bodies]

    assert [response.status for response in responses] == [200, 200, 200]
    assert [response.headers.get("X-Sidecar-Repaired") for response in responses] == [
        None,
        None,
        "coercion",
    ]
    assert [received.body for received in fastapi_tool.received] == [
        b'{"op": "contains", "value": "42"}',
        b'{"op": "contains", "value": "007"}',
        b'{"op": "gt", "value": 42}',
    ]
    assert fastapi_tool.validated == [
        {"model": "Text", "value": "42"},
        {"model": "Text", "value": "007"},
        {"model": "Num", "value": 42.0},
    ]
    assert llm.requests == []


async def test_a_big_integer_reaches_fastapi_digit_for_digit(fastapi_tool, make_sidecar, make_llm):
    llm = await make_llm(correction({}))
    sidecar = await sidecar_for(make_sidecar, fastapi_tool, llm)

    response = await sidecar.client.post(
        "/transfer",
        data=b'{"amount": "10.5", "account": 123456789012345678901234}',
        headers=JSON,
    )

    assert response.status == 200
    assert response.headers["X-Sidecar-Repaired"] == "coercion"
    assert response.headers["X-Sidecar-Attempts"] == "1"
    [received] = fastapi_tool.received
    assert received.body == b'{"amount": 10.5, "account": 123456789012345678901234}'
    assert fastapi_tool.validated == [{"amount": 10.5, "account": 123456789012345678901234}]
    assert await response.json() == {"ok": True, "account": "123456789012345678901234"}
    assert llm.requests == []


async def test_a_422_only_in_the_query_is_returned_without_repair(
    fastapi_tool, make_sidecar, make_llm
):
    llm = await make_llm(correction({"amount": 1, "account": 2}))
    sidecar = await sidecar_for(make_sidecar, fastapi_tool, llm)

    response = await sidecar.client.post(
        "/transfer?limit=500", data=b'{"amount": 1.5, "account": 2}', headers=JSON
    )

    assert response.status == 422
    [error] = (await response.json())["detail"]
    assert (error["type"], error["loc"]) == ("less_than_equal", ["query", "limit"])
    assert response.headers["X-Sidecar-Outcome"] == "not-retryable"
    assert response.headers["X-Sidecar-Trail"] == "422"
    assert len(fastapi_tool.received) == 1
    assert llm.requests == []


async def test_a_422_in_the_body_and_the_query_stays_repairable(
    fastapi_tool, make_sidecar, make_llm
):
    llm = await make_llm(correction({"amount": 10, "account": 2}))
    sidecar = await sidecar_for(make_sidecar, fastapi_tool, llm)

    response = await sidecar.client.post(
        "/transfer?limit=500", data=b'{"amount": "ten", "account": 2}', headers=JSON
    )

    # The model fixed the body; the query is still wrong, and that is the end.
    assert response.status == 422
    assert response.headers["X-Sidecar-Trail"] == "422 repair=llm, 422"
    assert response.headers["X-Sidecar-Outcome"] == "not-retryable"
    assert [received.body for received in fastapi_tool.received] == [
        b'{"amount": "ten", "account": 2}',
        b'{"amount": 10, "account": 2}',
    ]
    assert [received.query for received in fastapi_tool.received] == ["limit=500"] * 2
    assert len(llm.requests) == 1
    errors = orjson.loads(llm.prompt()["tool_answer"]["error"]["body"])["detail"]
    assert {error["loc"][0] for error in errors} == {"query", "body"}


async def test_a_tag_in_the_wrong_case_is_repaired(fastapi_tool, make_sidecar, make_llm):
    llm = await make_llm(correction({"op": "gt", "value": 3}))
    sidecar = await sidecar_for(make_sidecar, fastapi_tool, llm)

    response = await sidecar.client.post("/filter", data=b'{"op": "GT", "value": 3}', headers=JSON)

    assert response.status == 200
    assert response.headers["X-Sidecar-Trail"] == "422 repair=llm, 200"
    assert fastapi_tool.received[1].body == b'{"op": "gt", "value": 3}'
    assert fastapi_tool.validated == [{"model": "Num", "value": 3.0}]
