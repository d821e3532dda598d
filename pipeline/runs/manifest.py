"""The manifest: what a run directory holds a run of, and with which settings.

``manifest.json`` is written when a run starts and updated when it stops. It records the
job (name, content hash), the models, the endpoint (never a key or a password), the
input and its fingerprint, the settings in force and the run's state. ``identity()``
names what makes two invocations the same run; everything else may change between them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from importlib import metadata
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import RunDirError
from .settings import Settings, settings_from_json

__all__ = [
    "EndpointUse",
    "InputInfo",
    "JobInfo",
    "Manifest",
    "clean_url",
    "identity_change",
    "now_iso",
    "package_version",
    "refuse_different",
]

# Settings that change what a run computes: a different value on an existing RUN_DIR is
# refused. The rest (pace, timeouts, concurrency, budget, where the endpoint is) may change.
IDENTITY_SETTINGS = (
    "max_iters",
    "min_iters",
    "checks",
    "strategy",
    "repair",
    "select",
    "id_field",
    "batch",
    "shard",
)


def now_iso() -> str:
    """The current UTC time, ISO 8601, second precision."""
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def package_version() -> str:
    """The installed version of refine."""
    try:
        return metadata.version("refine")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def clean_url(url: str | None) -> str | None:
    """A base URL fit for the manifest: credentials and query strings in it are dropped."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


@dataclass(frozen=True, slots=True)
class JobInfo:
    """Which job: its name, the hash of its files, and where it was loaded from."""

    name: str
    hash: str
    source: str


@dataclass(frozen=True, slots=True)
class InputInfo:
    """Which input: its path and fingerprint (the head of its content)."""

    path: str
    fingerprint: dict[str, Any]


@dataclass(frozen=True, slots=True)
class EndpointUse:
    """Where a run's calls went from one invocation on: one entry of its endpoint history.

    ``base_url`` is the generator's endpoints (several replicas, or ``local`` for the
    embedded model), ``feedback_base_url`` the critic's when it has its own; URLs as the
    manifest keeps them (credentials and query strings dropped).
    """

    base_url: tuple[str, ...]
    feedback_base_url: str | None
    since_run: int  # the invocation (``runs``) that first used them
    at: str  # when

    def same_place(self, other: EndpointUse) -> bool:
        """Whether both send calls to the same endpoints."""
        return (self.base_url, self.feedback_base_url) == (other.base_url, other.feedback_base_url)

    def describe(self) -> str:
        """The endpoints, for people."""
        text = ", ".join(self.base_url)
        if self.feedback_base_url:
            text += f" (critic: {self.feedback_base_url})"
        return text

    def to_json(self) -> dict[str, Any]:
        """The manifest's form."""
        return {
            "base_url": list(self.base_url),
            "feedback_base_url": self.feedback_base_url,
            "since_run": self.since_run,
            "at": self.at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EndpointUse:
        """Read the manifest's form."""
        return cls(
            tuple(str(u) for u in data["base_url"]),
            data.get("feedback_base_url"),
            int(data["since_run"]),
            str(data["at"]),
        )


@dataclass(frozen=True, slots=True)
class Manifest:
    """A run directory's record of its run."""

    job: JobInfo
    input: InputInfo
    model: str  # the generator as called; ``local:NAME`` for the embedded model
    feedback_model: str | None  # the critic, when it is another model
    base_url: str | None  # the generator's (first) endpoint, credentials dropped
    settings: Settings  # the values in force (resolved: max_iters, timeout)
    local_model: dict[str, Any] | None = None  # the embedded generator's file and origin
    feedback_local_model: dict[str, Any] | None = None  # the embedded critic's, if another
    # for a job that runs programs: the isolation they got (mode, layers, Landlock ABI)
    sandbox: dict[str, Any] | None = None
    version: str = field(default_factory=package_version)
    created_at: str = field(default_factory=now_iso)
    updated_at: str = field(default_factory=now_iso)
    runs: int = 1
    state: str = "running"
    exit_code: int | None = None
    endpoints: tuple[EndpointUse, ...] = ()  # where the calls went, each change appended

    @property
    def critic(self) -> str:
        """The model that gives feedback."""
        return self.feedback_model or self.model

    def identity(self) -> dict[str, Any]:
        """What makes two invocations the same run, by the name shown when they differ."""
        ident: dict[str, Any] = {
            "job.name": self.job.name,
            "job.hash": self.job.hash,
            "model": self.model,
            "feedback_model": self.feedback_model,
        }
        for name in IDENTITY_SETTINGS:
            ident[name] = getattr(self.settings, name)
        return ident

    def continued_by(self, new: Manifest) -> Manifest:
        """``new`` as the next invocation of this run: its creation time, one more run."""
        return replace(new, created_at=self.created_at, runs=self.runs + 1)

    def finished(self, state: str, exit_code: int) -> Manifest:
        """This manifest with the run's final state."""
        return replace(self, state=state, exit_code=exit_code, updated_at=now_iso())

    def to_json(self) -> dict[str, Any]:
        """The manifest.json object."""
        settings = asdict(self.settings)
        base = self.settings.base_url
        if isinstance(base, tuple):
            settings["base_url"] = [clean_url(u) for u in base]
        else:
            settings["base_url"] = clean_url(base)
        settings["feedback_base_url"] = clean_url(self.settings.feedback_base_url)
        return {
            "package": "refine",
            "version": self.version,
            "job": asdict(self.job),
            "model": self.model,
            "feedback_model": self.feedback_model,
            "base_url": clean_url(self.base_url),
            "input": asdict(self.input),
            "settings": settings,
            **({"local_model": self.local_model} if self.local_model else {}),
            **(
                {"feedback_local_model": self.feedback_local_model}
                if self.feedback_local_model
                else {}
            ),
            **({"sandbox": self.sandbox} if self.sandbox else {}),
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "runs": self.runs,
            "state": self.state,
            "exit_code": self.exit_code,
            "endpoints": [e.to_json() for e in self.endpoints],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "manifest.json") -> Manifest:
        """Read a manifest.json object (also the layout of earlier versions)."""
        try:
            stored = dict(data.get("settings") or {})
            # Earlier versions kept these at the top level.
            for key in ("max_iters", "min_iters", "checks", "id_field"):
                if key in data and key not in stored:
                    stored[key] = data[key]
            if "base_url" not in stored and not stored.get("local"):
                stored["base_url"] = data.get("base_url")
            job, inp = data["job"], data["input"]
            return cls(
                job=JobInfo(str(job["name"]), str(job["hash"]), str(job["source"])),
                input=InputInfo(str(inp["path"]), dict(inp["fingerprint"])),
                model=str(data["model"]),
                feedback_model=data.get("feedback_model"),
                base_url=data.get("base_url"),
                settings=settings_from_json(stored),
                local_model=data.get("local_model"),
                feedback_local_model=data.get("feedback_local_model"),
                sandbox=data.get("sandbox"),
                version=str(data.get("version", "0+unknown")),
                created_at=str(data.get("created_at") or now_iso()),
                updated_at=str(data.get("updated_at") or now_iso()),
                runs=int(data.get("runs", 1)),
                state=str(data.get("state", "unknown")),
                exit_code=data.get("exit_code"),
                endpoints=tuple(EndpointUse.from_json(e) for e in data.get("endpoints") or ()),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise RunDirError(f"{where}: not a manifest of this program ({err!r})") from err


def identity_change(old: Manifest, new: Manifest) -> tuple[str, Any, Any] | None:
    """The first part of the run's identity ``new`` changes: (name, old value, new value)."""
    before, after = old.identity(), new.identity()
    for key, value in before.items():
        if after[key] != value:
            return key, value, after[key]
    return None


def refuse_different(old: Manifest, new: Manifest, where: str) -> None:
    """Raise RunDirError when ``new`` is not a continuation of the run ``old`` records."""
    change = identity_change(old, new)
    if change is not None:
        key, value, asked = change
        raise RunDirError(
            f"{where} holds a run with {key}={value!r}, not {asked!r}, and that run has "
            f"made model calls. To start over with {key}={asked!r}, give another --out (or "
            f"delete {where}); to go on with {key}={value!r}, run its own command again or "
            f"`refine resume {where}`"
        )
