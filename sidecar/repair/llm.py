"""The last repair layer: ask an OpenAI-compatible model for a corrected payload.

The model sees the fields the tool refused and its words about them, the agent's intent,
the payload with every secret replaced by a placeholder, the schema when known, the tool's
whole answer, the call's method, route and path and the attempt number — never a header
(``llm_prompt``). Its answer is one JSON object::

    {"analysis": "...", "corrected_payload": {...}, "is_transient": false, "can_fix": true}

(the reasoning first, the decision last: a small model that must decide first mostly
declines, even beside a right payload), held to that shape by the endpoint where it can
(``llm_format``: ``corrected_payload`` constrained by the tool's schema).

It is refused unless ``corrected_payload`` is a JSON object that is new, fits the schema
and is at most four times the original's size (``llm_answer``). A refused answer is not
the end: the model is told exactly why, as the next turn of the same conversation, and
asked again while the request's LLM calls last; and when the tool refuses the payload it
wrote, the next ask goes on in that conversation too. The model can change the payload of
this call and nothing else: not its target, method or headers.

This module owns the conversation: the calls, their counts, the forms the endpoint takes,
and the answers remembered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from sidecar.repair.cache import SharedAnswers, TtlLru
from sidecar.repair.llm_answer import LlmAnswer, Refused, check, refusal
from sidecar.repair.llm_format import (
    ResponseFormats,
    answer_schema,
    refuses_format,
    response_format,
)
from sidecar.repair.llm_prompt import Conversation, LlmRequest, going_on, opening, reask
from sidecar.repair.redact import Redactor
from sidecar.telemetry import Hooks

if TYPE_CHECKING:
    import openai
    from openai.types.chat import ChatCompletionMessageParam

_CACHE_ENTRIES = 1024
_CACHE_TTL_S = 600.0


@dataclass(frozen=True, slots=True)
class LlmOutcome:
    """What asking the model came to."""

    answer: LlmAnswer | None  # a correction that passed every guard, or a decline
    calls: int  # model calls made; 0 when the cache answered
    refused: Refused | None = None  # why the last answer was refused, when none was accepted
    conversation: Conversation | None = None  # how the model came to the accepted answer


class LlmRepairer:
    def __init__(
        self,
        client: openai.AsyncOpenAI,
        model: str,
        hooks: Hooks,
        *,
        max_concurrency: int,
        clock: Callable[[], float] = time.monotonic,
        shared: Mapping[str, SharedAnswers] | None = None,
    ) -> None:
        self._client = client
        self._model = model
        self._hooks = hooks
        self._slots = asyncio.Semaphore(max_concurrency)
        # The client speaks to one endpoint: what it refused is remembered here.
        self._formats = ResponseFormats()
        self._cache: TtlLru[LlmAnswer] = TtlLru(_CACHE_ENTRIES, _CACHE_TTL_S, clock)
        # Each sharing route's answers, as every replica's model gave them: redacted.
        self._shared = shared or {}

    async def repair(self, request: LlmRequest, time_left_s: float, max_calls: int) -> LlmOutcome:
        """The model's accepted answer with secrets restored, from the cache when the
        failure repeats; a refused answer is sent back with its reason, up to ``max_calls``
        calls in all. A request whose payload the model wrote goes on with its conversation."""
        cache_key = request.cache_key()
        cached = self._cache.get(cache_key)
        if cached is not None and refusal(cached, None, request) is None:
            return LlmOutcome(cached, calls=0)
        earlier = request.earlier
        redactor = earlier.redactor if earlier is not None else Redactor()
        messages = going_on(earlier, request) if earlier else opening(request, redactor)
        remembered = await self._recalled(request, cache_key, redactor)
        if remembered is not None:
            return LlmOutcome(remembered, calls=0)
        schema = answer_schema(request.schema, redactor.redacted_names)
        deadline = time.monotonic() + time_left_s
        calls = 0
        refused: Refused | None = None
        while calls < max_calls and deadline > time.monotonic():
            started = time.monotonic()
            call = await self._complete(messages, schema, deadline - started)
            calls += 1
            content = call.content
            checked = check(content, redactor, request) if content is not None else None
            refused = checked.refused if checked is not None else None
            result = "invalid" if checked is not None and checked.unreadable else call.result
            # One count per call, and its tokens even when the answer was unusable: they were paid.
            self._hooks.llm_call_finished(
                result,
                time.monotonic() - started,
                prompt_tokens=getattr(call.usage, "prompt_tokens", 0) or 0,
                completion_tokens=getattr(call.usage, "completion_tokens", 0) or 0,
                failure=call.failure or (refused if result == "invalid" else None),
                response_format=call.form,
            )
            if checked is not None and checked.answer is not None and refused is None:
                assert content is not None
                await self._keep(request, cache_key, checked.answer, checked.written)
                answered = Conversation(
                    (*messages, {"role": "assistant", "content": content}), redactor
                )
                return LlmOutcome(checked.answer, calls, conversation=answered)
            if checked is None or content is None or refused is None or calls >= max_calls:
                break  # no answer to correct (an error, a timeout), or no call left
            self._hooks.llm_reask(request.route, refused.kind)
            messages += reask(content, str(refused), request, redactor, checked.written)
        return LlmOutcome(None, calls, refused)

    async def _recalled(
        self, request: LlmRequest, cache_key: Hashable, redactor: Redactor
    ) -> LlmAnswer | None:
        """An answer another replica's model gave to the same failure, with the secrets put
        back: ``redactor`` has seen the payload, so its placeholders are the ones stored."""
        shared = self._shared.get(request.route)
        stored = await shared.cached(_shared_key(cache_key)) if shared is not None else None
        if stored is None:
            return None
        remembered = LlmAnswer.from_json(stored).restored(redactor)
        if refusal(remembered, None, request) is not None:
            return None
        self._cache.put(cache_key, remembered)
        return remembered

    async def _keep(
        self,
        request: LlmRequest,
        cache_key: Hashable,
        answer: LlmAnswer,
        written: dict[str, Any] | None,
    ) -> None:
        """An accepted answer remembered here, and by the fleet when the route shares."""
        self._cache.put(cache_key, answer)
        shared = self._shared.get(request.route)
        if shared is not None:
            # Stored as the model wrote it: placeholders, never the secrets.
            as_written = LlmAnswer(answer.can_fix, answer.is_transient, written)
            await shared.cache(_shared_key(cache_key), as_written.to_json(), _CACHE_TTL_S)

    async def _complete(
        self,
        messages: list[ChatCompletionMessageParam],
        schema: dict[str, Any],
        time_left_s: float,
    ) -> _Completion:
        """One chat completion in the best form the endpoint takes, falling back at once
        past a form it refuses."""
        import openai  # loaded with the client; see ``app.llm_client_for``

        form = self._formats.current
        try:
            async with asyncio.timeout(time_left_s):
                async with self._slots:
                    while True:
                        try:
                            completion = await self._client.chat.completions.create(
                                model=self._model,
                                messages=messages,
                                temperature=0.1,
                                response_format=response_format(form, schema),
                            )
                            break
                        except openai.APIStatusError as exc:
                            if not refuses_format(exc) or not self._formats.refused(form):
                                raise
                            self._hooks.llm_format_refused(form, exc.status_code)
                            form = self._formats.current
            content = completion.choices[0].message.content
        except (TimeoutError, openai.APITimeoutError) as exc:
            return _Completion(form, "timeout", failure=exc)
        except openai.OpenAIError as exc:
            return _Completion(form, "error", failure=exc)
        except (AttributeError, IndexError, TypeError, ValueError) as exc:
            # A server that does not speak chat completions.
            return _Completion(form, "invalid", failure=exc)
        if not isinstance(content, str):
            return _Completion(form, "invalid", usage=completion.usage)
        return _Completion(form, "ok", content, completion.usage)


@dataclass(frozen=True, slots=True)
class _Completion:
    """One chat completion: the form it was asked in, its result (``ok``, ``error``,
    ``timeout``, ``invalid``), its content when there is one, the usage it reported, and
    what failed."""

    form: str
    result: str
    content: str | None = None
    usage: Any = None
    failure: BaseException | None = None


def _shared_key(cache_key: Hashable) -> str:
    # The same payload redacted the same way has the same placeholders on every replica.
    return orjson.dumps(cache_key).decode()
