"""Every span, attribute, event and metric name replan emits, in one place.

Span names are constant (Jaeger shows the raw name and groups by it); ids
and other variable values go in attributes. ``gen_ai.*`` names follow the
OpenTelemetry GenAI semantic conventions; ``replan.*`` names are our own.
"""

from __future__ import annotations

from typing import Final

LIBRARY: Final = "replan"
"""The instrumentation scope of every tracer and meter."""

# Span names -------------------------------------------------------------------

SPAN_RUN: Final = "invoke_workflow replan"
SPAN_PLAN: Final = "plan planner"
SPAN_REPLAN: Final = "replan"
SPAN_GATE: Final = "await approval"
SPAN_AGENT_PREFIX: Final = "invoke_agent "
"""``invoke_agent executor|reviewer|ranker|evolver``."""
SPAN_CHAT_PREFIX: Final = "chat "
"""``chat <model>``: one model call, kind CLIENT."""
SPAN_TOOL_PREFIX: Final = "execute_tool "
"""``execute_tool <tool>``: one tool call the executor made, kind INTERNAL."""
SPAN_EXPLORE_CYCLE: Final = "explore cycle"
"""One generate-review-rank-evolve cycle of an explore run."""

# GenAI semantic-convention attributes ----------------------------------------

GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
"""The run id, on every span of a run: search Jaeger by it."""
GEN_AI_WORKFLOW_NAME: Final = "gen_ai.workflow.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_OUTPUT_TYPE: Final = "gen_ai.output.type"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
GEN_AI_TOOL_DESCRIPTION: Final = "gen_ai.tool.description"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
"""With content capture on only, as the model wrote them."""
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
"""With content capture on only, as the model reads it."""

EVENT_EVALUATION: Final = "gen_ai.evaluation.result"
GEN_AI_EVALUATION_NAME: Final = "gen_ai.evaluation.name"
GEN_AI_EVALUATION_SCORE_VALUE: Final = "gen_ai.evaluation.score.value"
GEN_AI_EVALUATION_SCORE_LABEL: Final = "gen_ai.evaluation.score.label"
GEN_AI_EVALUATION_EXPLANATION: Final = "gen_ai.evaluation.explanation"

OP_INVOKE_WORKFLOW: Final = "invoke_workflow"
OP_INVOKE_AGENT: Final = "invoke_agent"
OP_PLAN: Final = "plan"
OP_CHAT: Final = "chat"
OP_EXECUTE_TOOL: Final = "execute_tool"

# replan attributes --------------------------------------------------------------

RUN_KIND: Final = "replan.run.kind"
"""``plan`` or ``explore``."""
RUN_PATTERN: Final = "replan.run.pattern"
"""A plan run's pattern (``contract``, ``discovery``, ``hybrid``)."""
RUN_OUTCOME: Final = "replan.run.outcome"
"""The run's final status (``completed``, ``aborted``...) or ``suspended``."""
RUN_STOP_REASON: Final = "replan.run.stop_reason"
RUN_REPLANS_APPLIED: Final = "replan.run.replans_applied"
RUN_REPLANS_REFUSED: Final = "replan.run.replans_refused"
RUN_TASKS_COMPLETED: Final = "replan.run.tasks_completed"
RUN_USAGE_INPUT_TOKENS: Final = "replan.run.usage.input_tokens"
RUN_USAGE_OUTPUT_TOKENS: Final = "replan.run.usage.output_tokens"
RUN_SEGMENT: Final = "replan.run.segment"
"""1 for a run's first trace; each resumption after a suspension adds one."""
LIMIT_PREFIX: Final = "replan.limits."
"""``replan.limits.max_replans`` and the other set limits on the root span."""

TASK_ID: Final = "replan.task.id"
TASK_ATTEMPT: Final = "replan.task.attempt"
TASK_OUTCOME: Final = "replan.task.outcome"
"""``completed``, ``failed``, ``transient_failure`` or ``crashed``."""
PURPOSE: Final = "replan.purpose"
"""What a role was asked (``plan``, ``replan``, ``execute``, ``milestone``...)."""
CANDIDATE_INDEX: Final = "replan.candidate.index"
ACTOR_ROLE: Final = "replan.actor.role"
ACTOR_OUTCOME: Final = "replan.actor.outcome"
"""On a span that did not answer normally: ``crashed`` or ``cancelled``."""
ERROR_TYPE: Final = "error.type"
"""The class of the error a failed span ended with (OTel's general attribute)."""

REPLAN_VERSION: Final = "replan.version"
"""The plan version in force after the decision: the new one when applied,
the unchanged one when refused."""
REPLAN_PROPOSED_VERSION: Final = "replan.proposed_version"
REPLAN_TRIGGER: Final = "replan.trigger"
REPLAN_OUTCOME: Final = "replan.outcome"
"""A ``ReplanOutcome`` value, or one of the span outcomes below."""
REPLAN_REASON: Final = "replan.reason"
"""Why a replan was refused (or the reason recorded with an applied one)."""
REPLAN_CONFIDENCE: Final = "replan.confidence"
REPLAN_RATIONALE: Final = "replan.rationale"
REPLAN_TASKS_REMOVED: Final = "replan.tasks.removed"
REPLAN_TASKS_ADDED: Final = "replan.tasks.added"
REPLAN_TASKS_PRESERVED: Final = "replan.tasks.preserved"
REPLAN_REPLANS_REMAINING: Final = "replan.replans.remaining"
REPLAN_USAGE_INPUT_TOKENS: Final = "replan.usage.input_tokens"
REPLAN_USAGE_OUTPUT_TOKENS: Final = "replan.usage.output_tokens"
REPLAN_APPROVED_BY: Final = "replan.approved_by"
REPLAN_DECISION: Final = "replan.decision"
REPLAN_DECIDED_BY: Final = "replan.decision.by"
MILESTONE_INDEX: Final = "replan.milestone.index"

GATE_ID: Final = "replan.gate.id"
GATE_REASON: Final = "replan.gate.reason"
GATE_DECISION: Final = "replan.gate.decision"
GATE_DECIDED_BY: Final = "replan.gate.by"
GATE_TIMEOUT_S: Final = "replan.gate.timeout_s"
GATE_OUTCOME: Final = "replan.gate.outcome"
"""``resolved``, ``timed_out`` or ``suspended`` (see below)."""

TOOL_SIDE_EFFECT: Final = "replan.tool.side_effect"
TOOL_IDEMPOTENCY_KEY: Final = "replan.tool.idempotency_key"
TOOL_OUTCOME: Final = "replan.tool.outcome"
"""``ran``, ``failed`` (the tool raised), ``reused`` (a side-effect call
that had run before: its recorded result, the tool not run again) or
``cancelled`` (the attempt was cut short while the tool ran)."""

SUSPEND_REASON: Final = "replan.suspend.reason"
LIMIT_NAME: Final = "replan.limit"
"""On ``replan.limit_reached``: which limit ended the run."""
LINK_KIND: Final = "replan.link"
"""On a root span's links: ``resumes`` (the suspended trace this one
continues) or ``submitted_by`` (the span that submitted the run)."""

# The daemon's SERVER spans: OpenTelemetry's HTTP attributes ------------------

HTTP_REQUEST_METHOD: Final = "http.request.method"
HTTP_REQUEST_METHOD_ORIGINAL: Final = "http.request.method_original"
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
HTTP_ROUTE: Final = "http.route"
URL_PATH: Final = "url.path"
URL_SCHEME: Final = "url.scheme"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
CLIENT_ADDRESS: Final = "client.address"
USER_AGENT_ORIGINAL: Final = "user_agent.original"
NETWORK_PROTOCOL_VERSION: Final = "network.protocol.version"
HTTP_STREAMING: Final = "replan.http.streaming"
"""True on the span of a response that streams (Server-Sent Events): the
span ended once the headers were sent."""

# Span outcomes that are not run statuses or replan decisions ------------------

SUSPENDED: Final = "suspended"
"""The span ended because the run waits without bound (a gate with no
timeout, a daemon stop); the run goes on in a new trace linked to this one."""
INTERRUPTED: Final = "interrupted"
"""A replan cut short by the end of its run before any decision."""
RESOLVED: Final = "resolved"
"""A gate someone answered (``replan.gate.outcome``)."""
TIMED_OUT: Final = "timed_out"
"""A gate that expired unanswered: the policy's default applied."""

# Span events --------------------------------------------------------------------

EVENT_DECISION: Final = "replan.decision"
EVENT_LIMIT_REACHED: Final = "replan.limit_reached"
EVENT_STOPPED: Final = "replan.stopped"
EVENT_GATE_RESOLVED: Final = "replan.gate.resolved"

# Metrics --------------------------------------------------------------------------

METRIC_RUNS: Final = "replan.runs"
"""Counter of finished runs by ``replan.run.outcome``."""
METRIC_REPLANS: Final = "replan.replans"
"""Counter of replan decisions by ``replan.trigger`` and ``replan.outcome``."""
METRIC_TOKENS: Final = "replan.usage.tokens"
"""Counter of model tokens by ``gen_ai.agent.name`` and ``gen_ai.token.type``.
Not ``gen_ai.client.token.usage``, which a model client's own
instrumentation may emit for the same calls."""
METRIC_TASK_DURATION: Final = "replan.task.duration"
"""Histogram of task attempt durations (s) by ``replan.task.outcome``."""
METRIC_GATE_WAIT: Final = "replan.gate.wait"
"""Histogram of how long gates waited for an answer (s) by decision."""
METRIC_MAILBOX_DEPTH: Final = "replan.actor.mailbox.depth"
"""Gauge of requests waiting in each role's mailbox, by ``replan.actor.role``."""

TOKEN_INPUT: Final = "input"
TOKEN_OUTPUT: Final = "output"


# Explore runs -----------------------------------------------------------------

EVENT_EXPLORE_COMPARISON: Final = "replan.explore.comparison"
"""A span event per tournament comparison, on the cycle's span."""
EXPLORE_ITERATION: Final = "replan.explore.iteration"
EXPLORE_DECISION: Final = "replan.explore.decision"
EXPLORE_CANDIDATES: Final = "replan.explore.candidates"
EXPLORE_QUALIFYING: Final = "replan.explore.qualifying"
EXPLORE_HYPOTHESIS: Final = "replan.explore.hypothesis"
"""The hypothesis a reviewer's ``critique`` span is about."""
EXPLORE_A: Final = "replan.explore.a"
EXPLORE_B: Final = "replan.explore.b"
EXPLORE_WINNER: Final = "replan.explore.winner"
EXPLORE_ROUND: Final = "replan.explore.round"
EXPLORE_RATING_A: Final = "replan.explore.rating_a"
EXPLORE_RATING_B: Final = "replan.explore.rating_b"
EXPLORE_BRIEF_STATUS: Final = "replan.explore.brief.status"
"""On an explore run's root at its end: its brief's status (``needs_review``
where the run's outcome says only ``completed``)."""
EXPLORE_HUMAN: Final = "replan.explore.human"
"""True on the ``explore cycle`` span that plays the hypotheses a person
added at the review gate."""
