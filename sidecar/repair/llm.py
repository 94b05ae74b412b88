"""The last repair layer: ask an OpenAI-compatible model for a corrected payload.

The model sees the fields the tool refused and its words about them, the agent's intent,
the payload with every secret replaced by a placeholder, the schema when known, the tool's
whole answer, the call's method, route and path and the attempt number — never a header
(``llm_prompt``). Its answer is one JSON object::

    {"analysis": "...", "corrected_payload": {...}, "is_transient": false, "can_fix": true}

(the reasoning first, the decision last: a small model that must decide first mostly
declines, even beside a right payload), held to that shape by the endpoint where it can
(``llm_format``: ``corrected_payload`` constrained by the tool's schema).

It is refused, first and for good, when it touches a field the tool's answer did not name
(``scope``); and unless ``corrected_payload`` is a JSON object that is new, fits the schema
and is at most four times the original's size (``llm_answer``). A refusal of that kind is not
the end: the model is told exactly why, as the next turn of the same conversation, and
asked again while the request's LLM calls last; and when the tool refuses the payload it
wrote, the next ask goes on in that conversation too. The model can change the payload of
this call and nothing else: not its target, method or headers.

Each call carries a ``max_tokens`` sized for its payload, and its answer is read and inflated
to a bound (``llm_http``) within ``SIDECAR_LLM_TIMEOUT_MS``; past either, the repair is given
up. Prompts are built on worker threads, off the event loop.

This module owns the conversation: the calls, their counts, the forms the endpoint takes,
and the answers remembered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from sidecar.repair.cache import SharedAnswers, TtlLru
from sidecar.repair.llm_answer import Checked, LlmAnswer, Refused, check, refusal
from sidecar.repair.llm_format import (
    ResponseFormats,
    answer_schema,
    answer_tokens,
    refuses_format,
    response_format,
)
from sidecar.repair.llm_http import AnswerTooLarge, AnswerUnreadable, too_large_cause
from sidecar.repair.llm_prompt import Conversation, LlmRequest, going_on, opening, reask
from sidecar.repair.redact import Redactor
from sidecar.repair.scope import OUT_OF_SCOPE, Scope
from sidecar.telemetry import Hooks

if TYPE_CHECKING:
    import openai
    from openai.types.chat import ChatCompletionMessageParam

_Made = TypeVar("_Made")
Messages = list["ChatCompletionMessageParam"]
# The repair given up on the model's answer: past SIDECAR_LLM_MAX_ANSWER_BYTES, or cut at
# its max_tokens. Counted as ``sidecar_repairs_total{layer="llm",result=<kind>}``.
ANSWER_TOO_LARGE = Refused("answer_too_large", "the answer is past SIDECAR_LLM_MAX_ANSWER_BYTES")
ANSWER_CUT = Refused("answer_cut", "the answer ran to its max_tokens and was cut")
_CACHE_ENTRIES = 1024
_CACHE_TTL_S = 600.0


@dataclass(frozen=True, slots=True)
class LlmOutcome:
    """What asking the model came to."""

    answer: LlmAnswer | None  # a correction that passed every guard, or a decline
    calls: int  # model calls made; 0 when the cache answered
    refused: Refused | None = None  # why the last answer was refused, when none was accepted
    conversation: Conversation | None = None  # how the model came to the accepted answer
    out_of_scope: tuple[str, ...] = ()  # the fields an answer touched outside the tool's scope


class LlmRepairer:
    def __init__(
        self,
        client: openai.AsyncOpenAI,
        model: str,
        hooks: Hooks,
        *,
        max_concurrency: int,
        max_answer_tokens: int = 4096,
        call_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        shared: Mapping[str, SharedAnswers] | None = None,
    ) -> None:
        self._client = client
        self._model = model
        self._hooks = hooks
        self._slots = asyncio.Semaphore(max_concurrency)
        # The client speaks to one endpoint: what it refused is remembered here.
        self._formats = ResponseFormats(clock)
        self._max_answer_tokens = max_answer_tokens
        # The client's own timeout bounds each read, not the call: an answer that trickles
        # in could outlast it many times over.
        self._call_timeout_s = call_timeout_s
        self._cache: TtlLru[LlmAnswer] = TtlLru(_CACHE_ENTRIES, _CACHE_TTL_S, clock)
        # Each sharing route's answers, as every replica's model gave them: redacted.
        self._shared = shared or {}
        # Prompts are built here, as many at once as calls may be in flight.
        self._workers = ThreadPoolExecutor(max_concurrency, thread_name_prefix="llm-prompt")

    async def repair(self, request: LlmRequest, time_left_s: float, max_calls: int) -> LlmOutcome:
        """The model's accepted answer with secrets restored, from the cache when the
        failure repeats; a refused answer is sent back with its reason, up to ``max_calls``
        calls in all. A request whose payload the model wrote goes on with its conversation."""
        # A payload's fingerprint and its prompt cost time linear in its size, which can be
        # megabytes: worked out off the event loop, which other agents' calls need.
        cache_key = await self._off_loop(request.cache_key)
        cached = await self._cached(request, cache_key)
        if cached is not None:
            return cached
        ask = await self._off_loop(lambda: _Ask.of(request, self._max_answer_tokens))
        redactor, messages, scope = ask.redactor, ask.messages, ask.scope
        remembered = await self._recalled(request, cache_key, ask)
        if remembered is not None:
            return LlmOutcome(remembered, calls=0)
        deadline = time.monotonic() + time_left_s
        calls = 0
        refused: Refused | None = None
        outside: tuple[str, ...] = ()
        while calls < max_calls and deadline > time.monotonic():
            started = time.monotonic()
            call = await self._complete(messages, ask, deadline - started)
            calls += 1
            content = call.content
            checked = check(content, redactor, request) if content is not None else None
            refused = checked.refused if checked is not None else None
            self._count(call, checked, started)
            if call.given_up is not None:
                return LlmOutcome(None, calls, call.given_up)
            # Before any other guard: an answer out of scope is refused, and asked again told
            # what it may change (a model that only added a field gets it right; one that
            # obeys the tool's text is refused again, each answer checked the same way).
            outside = scope.outside(checked.written if checked is not None else None)
            if outside:
                refused = scope.refusal(outside)
            elif checked is not None and checked.answer is not None and refused is None:
                assert content is not None
                await self._keep(request, cache_key, checked.answer, checked.written)
                answered = Conversation(
                    (*messages, {"role": "assistant", "content": content}), redactor
                )
                return LlmOutcome(checked.answer, calls, conversation=answered)
            if checked is None or content is None or refused is None or calls >= max_calls:
                break  # no answer to correct (an error, a timeout), or no call left
            self._hooks.llm_reask(request.route, refused.kind)
            turns = partial(reask, content, str(refused), request, redactor, checked.written)
            messages += await self._off_loop(turns)
        return LlmOutcome(None, calls, refused, out_of_scope=outside)

    def _count(self, call: _Completion, checked: Checked | None, started: float) -> None:
        """One count per call, and its tokens even when the answer was unusable: they were
        paid."""
        refused = checked.refused if checked is not None else None
        result = "invalid" if checked is not None and checked.unreadable else call.result
        self._hooks.llm_call_finished(
            result,
            time.monotonic() - started,
            prompt_tokens=getattr(call.usage, "prompt_tokens", 0) or 0,
            completion_tokens=getattr(call.usage, "completion_tokens", 0) or 0,
            failure=call.failure or (refused if result == "invalid" else None),
            response_format=call.form,
        )

    def close(self) -> None:
        """Let the worker threads go; a prompt being built is not waited for."""
        self._workers.shutdown(wait=False, cancel_futures=True)

    async def _off_loop(self, work: Callable[[], _Made]) -> _Made:
        """``work()`` run on one of the repairer's worker threads."""
        return await asyncio.get_running_loop().run_in_executor(self._workers, work)

    async def _cached(self, request: LlmRequest, cache_key: Hashable) -> LlmOutcome | None:
        """This process's answer to the same failure, if it passes the guards and the scope
        this answer of the tool's sets (the details, which the key leaves out, may name
        other fields)."""
        cached = self._cache.get(cache_key)
        if cached is None or refusal(cached, None, request) is not None:
            return None
        outside = await self._off_loop(partial(_outside_scope, request, cached))
        if outside:
            return LlmOutcome(None, 0, OUT_OF_SCOPE, out_of_scope=outside)
        return LlmOutcome(cached, calls=0)

    async def _recalled(
        self, request: LlmRequest, cache_key: Hashable, ask: _Ask
    ) -> LlmAnswer | None:
        """An answer another replica's model gave to the same failure, with the secrets put
        back: ``ask.redactor`` has seen the payload, so its placeholders are the ones
        stored; one out of this failure's scope is not taken."""
        shared = self._shared.get(request.route)
        stored = await shared.cached(_shared_key(cache_key)) if shared is not None else None
        if stored is None:
            return None
        written = LlmAnswer.from_json(stored)
        try:
            remembered = written.restored(ask.redactor)
        except Refused:
            return None
        if refusal(remembered, None, request) is not None or ask.scope.outside(written.corrected):
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

    async def _complete(self, messages: Messages, ask: _Ask, time_left_s: float) -> _Completion:
        """One chat completion in the best form the endpoint takes, falling back at once
        past a form it refuses; the answer cut at ``ask.max_tokens``."""
        import openai  # loaded with the client; see ``app.llm_client_for``

        form = self._formats.current
        try:
            # The whole call, its answer read and inflated, within SIDECAR_LLM_TIMEOUT_MS
            # and the time the request has left.
            async with asyncio.timeout(min(time_left_s, self._call_timeout_s)):
                async with self._slots:
                    while True:
                        try:
                            completion = await self._client.chat.completions.create(
                                model=self._model,
                                messages=messages,
                                temperature=0.1,
                                max_tokens=ask.max_tokens,
                                response_format=response_format(form, ask.schema),
                            )
                            break
                        except openai.APIStatusError as exc:
                            if not refuses_format(exc) or not self._formats.refused(form):
                                raise
                            self._hooks.llm_format_refused(form, exc.status_code)
                            form = self._formats.current
            choice = completion.choices[0]
            content = choice.message.content
        except (TimeoutError, openai.APITimeoutError) as exc:
            return _Completion(form, "timeout", failure=exc)
        except (openai.OpenAIError, AnswerTooLarge, AnswerUnreadable) as exc:
            too_large = too_large_cause(exc)
            if too_large is not None:
                return _Completion(form, "error", failure=too_large, given_up=ANSWER_TOO_LARGE)
            return _Completion(form, "error", failure=exc)
        except (AttributeError, IndexError, TypeError, ValueError) as exc:
            # A server that does not speak chat completions.
            return _Completion(form, "invalid", failure=exc)
        if choice.finish_reason == "length":
            cut = AnswerCut(f"the answer reached max_tokens ({ask.max_tokens})")
            return _Completion(
                form, "invalid", usage=completion.usage, failure=cut, given_up=ANSWER_CUT
            )
        if not isinstance(content, str):
            return _Completion(form, "invalid", usage=completion.usage)
        return _Completion(form, "ok", content, completion.usage)


@dataclass(frozen=True, slots=True)
class _Ask:
    """What one request's first call is made of: the placeholders for its secrets, the
    conversation's turns, the answer's schema and the scope its answer must keep to."""

    redactor: Redactor
    messages: Messages
    schema: dict[str, Any]
    scope: Scope
    max_tokens: int

    @classmethod
    def of(cls, request: LlmRequest, max_answer_tokens: int) -> _Ask:
        earlier = request.earlier
        redactor = earlier.redactor if earlier is not None else Redactor(request.sent_secrets)
        messages = going_on(earlier, request) if earlier else opening(request, redactor)
        schema = answer_schema(request.schema, redactor.redacted_names)
        scope = Scope.of(request, redactor)
        max_tokens = answer_tokens(len(orjson.dumps(scope.shown, default=str)), max_answer_tokens)
        return cls(redactor, messages, schema, scope, max_tokens)


class AnswerCut(Exception):
    """The model's answer ran to ``max_tokens`` and was cut there."""


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
    given_up: Refused | None = None  # the answer past its bound: the repair ends here


def _outside_scope(request: LlmRequest, answer: LlmAnswer) -> tuple[str, ...]:
    """The fields a remembered ``answer`` touches outside the scope of ``request``'s failure:
    its secrets made placeholders again by the redactor that shows the payload, so one
    copied to another field shows as a placeholder moved."""
    if answer.corrected is None:
        return ()
    earlier = request.earlier
    redactor = earlier.redactor if earlier is not None else Redactor(request.sent_secrets)
    scope = Scope.of(request, redactor)
    return scope.outside(redactor.redact(answer.corrected))


def _shared_key(cache_key: Hashable) -> str:
    # The same payload redacted the same way has the same placeholders on every replica.
    return orjson.dumps(cache_key).decode()
