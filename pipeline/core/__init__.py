"""The Self-Refine fold, job-agnostic: what one record's loop is, apart from any run.

::

    records       Record: one input record (id, line, fields)
    steps         Step, CallKind, Completion, Outcome: the record of each call
    jobs          Job, InputField: the job spec the loop reads
    metrics       MetricSpec: what a job declares of its evaluator's metrics (direction, source)
    loader        load_job: a job file read, the method's invariant enforced
    hooks         a job's evaluate and check run on an answer, held to their contract
    answer_kinds  AnswerKind, Selection: the protocol a kind of answer implements
    extraction    taking the artifact out of a reply; notes left in it
    strategies    the named extra calls a user opts into (samples, restart, copy-retry)
    prompts       each call's messages: a record's calls form one conversation
    feedback      tolerant parsing of the critic's JSON, and rendering it
    drafts        which answer each iteration goes on with
    choice        choosing the output: the default rule, or an answer kind's selection rule
    loop          plan -> next call -> make step -> finish; refine_record
    pyast         ast.parse that threads may share

Nothing here knows a particular job, a run directory, an HTTP client or a backend.
"""

from .answer_kinds import AnswerKind, Selection
from .choice import Choice, choose
from .jobs import InputField, Job, builtin_jobs, render
from .loader import load_job
from .loop import Call, Policy, Stop, StopReason, finish, make_step, next_call, refine_record
from .metrics import MetricSpec
from .records import Record
from .steps import CallKind, Completion, ModelClient, Outcome, Role, Step, StepSink, Try
from .strategies import Strategies

__all__ = [
    "AnswerKind",
    "Call",
    "CallKind",
    "Choice",
    "Completion",
    "InputField",
    "Job",
    "MetricSpec",
    "ModelClient",
    "Outcome",
    "Policy",
    "Record",
    "Role",
    "Selection",
    "Step",
    "StepSink",
    "Stop",
    "StopReason",
    "Strategies",
    "Try",
    "builtin_jobs",
    "choose",
    "finish",
    "load_job",
    "make_step",
    "next_call",
    "refine_record",
    "render",
]
