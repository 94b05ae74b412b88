"""Which repair layer runs when: coercion, then the tool's suggestions, then the LLM.

Each layer runs only when the one before changed nothing, and a payload already tried is
never proposed again, so a repair can never loop.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sidecar.config.values import RepairLevel
from sidecar.repair.adjustments import adjust
from sidecar.repair.coercion import coerce
from sidecar.repair.payload import Payload, fingerprint
from sidecar.repair.redact import sent_secrets
from sidecar.repair.schemas import SchemaStore
from sidecar.telemetry import Hooks
from sidecar.tool.envelopes import Reply
from sidecar.transport.exchange import UpstreamRequest

if TYPE_CHECKING:
    # The LLM layer's modules load with the first repairer (``serve.app``): a sidecar
    # without a model never holds them.
    from sidecar.repair.llm import LlmRepairer
    from sidecar.repair.llm_prompt import LlmRequest


@dataclass(frozen=True, slots=True)
class RepairJob:
    """One failed attempt that calls for a repair."""

    route: str
    request: UpstreamRequest  # the call as the agent made it: its headers and query too
    path: str
    payload: Payload
    reply: Reply
    attempt: int
    level: RepairLevel
    intent: str | None
    tried: Collection[str]
    llm_repairs_left: int  # model calls (a cached answer counts as one) it may still use
    time_left_s: float

    @property
    def method(self) -> str:
        return self.request.method


@dataclass(frozen=True, slots=True)
class Proposal:
    payload: Payload | None = None  # a new payload to send
    layer: str | None = None  # the layer that made it
    retry_same: bool = False  # the model judged the failure transient
    llm_repairs: int = 0  # of the request's LLM repairs, those it used


class Repairs:
    def __init__(self, schemas: SchemaStore, llm: LlmRepairer | None, hooks: Hooks) -> None:
        self._schemas = schemas
        self._llm = llm
        self._hooks = hooks

    def path_template(self, route: str, method: str, path: str) -> str | None:
        """The OpenAPI path template ``method path`` matched in the route's schema, if any."""
        return self._schemas.path_template(route, method, path)

    def prepare(self, route: str, method: str, path: str, payload: Payload, level: str) -> Payload:
        """The agent's payload coerced to the route's schema before the first attempt."""
        if level == "off":
            return payload
        schema = self._schemas.body_schema(route, method, path)
        # Asked first: without a schema the body is never parsed on a call that succeeds.
        if schema is None or payload.value is None:
            return payload
        coerced, changed = coerce(payload.value, schema)
        if not changed:
            return payload
        self._hooks.payload_repaired(route, "coercion", changed)
        return payload.repaired(coerced, "coercion")

    async def propose(self, job: RepairJob) -> Proposal:
        """The payload to send after ``job``'s failure, from the first layer that makes one
        not yet tried; an empty proposal when none does."""
        value = job.payload.value
        if job.level == "off" or value is None:
            return Proposal()
        schema = self._schemas.body_schema(job.route, job.method, job.path)
        failure = job.reply.failure

        if schema is not None:
            coerced, changed = coerce(value, schema)
            if changed and fingerprint(coerced) not in job.tried:
                self._hooks.payload_repaired(job.route, "coercion", changed)
                return Proposal(job.payload.repaired(coerced, "coercion"), "coercion")

        # The tool's suggestions and the model work on a JSON object (a top-level array is
        # coerced, nothing more).
        document = job.payload.document
        if document is None:
            return Proposal()

        if failure is not None:
            adjusted, changed = adjust(document, failure)
            if changed and fingerprint(adjusted) not in job.tried:
                self._hooks.payload_repaired(job.route, "adjustment", changed)
                return Proposal(job.payload.repaired(adjusted, "adjustment"), "adjustment")

        if job.level != "auto" or self._llm is None or job.llm_repairs_left <= 0:
            return Proposal()
        return await self._ask_llm(self._llm, job, document, schema)

    async def _ask_llm(
        self,
        llm: LlmRepairer,
        job: RepairJob,
        document: dict[str, Any],
        schema: dict[str, Any] | None,
    ) -> Proposal:
        """The model's correction of ``document`` as a proposal, or its decline."""
        from sidecar.repair.llm_prompt import MAX_PROMPT_PAYLOAD_BYTES

        if len(job.payload.body) > MAX_PROMPT_PAYLOAD_BYTES:
            self._hooks.repair_refused(job.route, "llm", "prompt_too_large")
            return Proposal()
        request = self._llm_request(job, document, schema)
        asked = await llm.repair(request, job.time_left_s, job.llm_repairs_left)
        # Each model call is one of the request's LLM repairs, and so is a cached answer: the
        # cap bounds how often the layer is consulted, not only what it costs.
        used = max(asked.calls, 1)
        answer = asked.answer
        if answer is None:
            if asked.refused is not None:
                why = asked.refused.kind
                self._hooks.repair_refused(job.route, "llm", why, asked.out_of_scope)
            else:
                self._hooks.repair_result(job.route, "llm", "failed")
            return Proposal(llm_repairs=used)
        if answer.corrected is None or not answer.can_fix:
            self._hooks.repair_result(job.route, "llm", "declined")
            return Proposal(retry_same=answer.is_transient, llm_repairs=used)
        changed = sorted(
            key
            for key in answer.corrected.keys() | document.keys()
            if answer.corrected.get(key) != document.get(key)
        )
        self._hooks.payload_repaired(job.route, "llm", changed)
        # The conversation goes with the payload: should the tool refuse it, the model is
        # told so as the next turn, not as a stranger to its own answer.
        payload = job.payload.repaired(answer.corrected, "llm", asked.conversation)
        return Proposal(payload, "llm", llm_repairs=used)

    def _llm_request(
        self, job: RepairJob, document: dict[str, Any], schema: dict[str, Any] | None
    ) -> LlmRequest:
        """What the model is told about ``job``'s failure of ``document``."""
        from sidecar.repair.llm_prompt import LlmRequest

        return LlmRequest(
            method=job.method,
            route=job.route,
            path=job.path,
            path_template=self.path_template(job.route, job.method, job.path) or job.path,
            status=job.reply.status,
            failure=job.reply.failure,
            body_text=job.reply.text,
            payload=document,
            schema=schema,
            attempt=job.attempt,
            intent=job.intent,
            tried=job.tried,
            earlier=job.payload.conversation,
            sent_secrets=sent_secrets(job.request.headers, job.request.url.query),
        )
