"""Worked examples the model reads before the failure, as earlier turns of the conversation.

Each is made up (no tool's or user's data) and short, and shows one kind of fix a small
model misses when it is only described: a ``City, ST`` written out as ``City, State,
Country``, a missing field whose value the user's request gives, a number sent as a string
to a Go tool, a company name where a ticker symbol is wanted, a quantity with its unit
where the field's unit is wanted. Shown as turns, in the very form of the real document
and answer, they teach the form too; and as they are the same for every call, a server
that keeps its prompt cache reads them once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam


def _failure(
    path: str,
    fix: dict[str, Any],
    intent: str,
    payload: dict[str, Any],
    status: int,
    error: dict[str, Any],
) -> dict[str, Any]:
    """A failure as the real document tells it, with the same keys in the same order."""
    return {
        "fix": [fix],
        "user_intent": intent,
        "failed_payload": payload,
        "payload_schema": None,
        "tool_answer": {"status": status, "error": error},
        "call": {"method": "POST", "route": "tools", "path": path},
        "attempt": 1,
    }


def _envelope(code: str, category: str, message: str, **details: str) -> dict[str, Any]:
    return {"code": code, "category": category, "message": message, "details": details}


def _fixed(analysis: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "analysis": analysis,
        "corrected_payload": payload,
        "is_transient": False,
        "can_fix": True,
    }


_GO_PRICE = "json: cannot unmarshal string into Go struct field Item.price of type float64"
_PYDANTIC_SYMBOL = (
    '{"detail":[{"type":"value_error","loc":["body","symbol"],'
    '"msg":"Value error, symbol must be a stock ticker symbol","input":"Microsoft"}]}'
)

_PYDANTIC_DELAY = (
    '{"detail":[{"type":"int_parsing","loc":["body","delay_ms"],"msg":"Input should be a '
    'valid integer, unable to parse string as an integer","input":"2 s"}]}'
)

_EXAMPLES: tuple[tuple[dict[str, Any], dict[str, Any]], ...] = (
    (
        _failure(
            "/forecast",
            {
                "field": "city",
                "sent": "Springfield, IL",
                "tool_says": "City 'Springfield, IL' not found; hint: use the form "
                "'City, State, Country'",
            },
            "Is it raining in Springfield, IL?",
            {"city": "Springfield, IL", "lang": "en"},
            404,
            _envelope(
                "LOCATION_NOT_FOUND",
                "NOT_FOUND",
                "City 'Springfield, IL' not found",
                hint="use the form 'City, State, Country'",
            ),
        ),
        _fixed(
            "The tool wants City, State, Country. IL is the abbreviation of a US state, "
            "Illinois, and the country is US: Springfield, Illinois, US.",
            {"city": "Springfield, Illinois, US", "lang": "en"},
        ),
    ),
    (
        _failure(
            "/rooms/book",
            {"field": "room", "missing_from_payload": True, "tool_says": "room is required"},
            "Book room 4B for the standup at 9:00",
            {"title": "Standup", "time": "09:00"},
            400,
            _envelope("MISSING_FIELD", "INPUT_ERROR", "room is required"),
        ),
        _fixed(
            "The tool wants a room, which the payload lacks; the user asked for room 4B: add it.",
            {"title": "Standup", "time": "09:00", "room": "4B"},
        ),
    ),
    (
        _failure(
            "/items",
            {
                "field": "price",
                "sent": "9.99",
                "tool_says": _GO_PRICE,
                "tool_wants": "a JSON number, without quotes",
            },
            "List the lamp for 9.99, 12 in stock",
            {"name": "lamp", "price": "9.99", "stock": "12"},
            400,
            {"body": _GO_PRICE},
        ),
        _fixed(
            "The tool wants a JSON number for price, not a string; Go names only the first "
            "such field, and stock is a number sent as a string too: both without quotes.",
            {"name": "lamp", "price": 9.99, "stock": 12},
        ),
    ),
    (
        _failure(
            "/quotes",
            {
                "field": "symbol",
                "sent": "Microsoft",
                "tool_says": "Value error, symbol must be a stock ticker symbol",
            },
            "How are Microsoft shares doing?",
            {"symbol": "Microsoft"},
            422,
            {"body": _PYDANTIC_SYMBOL},
        ),
        _fixed(
            "The tool wants a stock ticker symbol, and Microsoft is the company's name: its "
            "ticker symbol is MSFT.",
            {"symbol": "MSFT"},
        ),
    ),
    (
        _failure(
            "/orders",
            {
                "field": "size",
                "sent": "Large",
                "tool_says": "size must be one of: small, medium, large",
            },
            "Order a large latte",
            {"drink": "latte", "size": "Large"},
            400,
            _envelope("INVALID_SIZE", "INPUT_ERROR", "size must be one of: small, medium, large"),
        ),
        _fixed(
            "The tool wants one of small, medium, large; Large means the same as large, as "
            "the user asked.",
            {"drink": "latte", "size": "large"},
        ),
    ),
    (
        _failure(
            "/jobs/retry",
            {
                "field": "delay_ms",
                "sent": "2 s",
                "tool_says": "Input should be a valid integer, unable to parse string as an "
                "integer",
                "schema": {"type": "integer", "description": "delay in milliseconds"},
            },
            "Retry the backup in 2 seconds",
            {"job": "backup", "delay_ms": "2 s"},
            422,
            {"body": _PYDANTIC_DELAY},
        ),
        _fixed(
            "The tool wants an integer number of milliseconds, as the schema says; 2 s is 2000 ms.",
            {"job": "backup", "delay_ms": 2000},
        ),
    ),
)


def _turns() -> tuple[ChatCompletionMessageParam, ...]:
    turns: list[ChatCompletionMessageParam] = []
    for document, answer in _EXAMPLES:
        turns.append({"role": "user", "content": orjson.dumps(document).decode()})
        turns.append({"role": "assistant", "content": orjson.dumps(answer).decode()})
    return tuple(turns)


# The worked examples, each as a user turn and the assistant's answer.
EXAMPLE_TURNS = _turns()
