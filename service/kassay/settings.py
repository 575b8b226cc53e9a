"""All of kassay's settings in one pydantic-settings class (env prefix KASSAY_).

Bad values fail at start-up with the variable named, not at first use.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, FilePath, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

# A list setting read from the environment as "a,b,c" (or a JSON list).
CommaList = Annotated[list[str], NoDecode]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KASSAY_", extra="ignore")

    # --- engine ---
    max_cases: int = Field(10_000, gt=0, description="hard cap on cases per job")
    enable_mutants: bool = Field(False, description="offer the self-test mutants to jobs")
    enable_test_impls: bool = Field(False, description="offer crash/hang/raise test impls")

    # --- worker ---
    worker_listen: str = "127.0.0.1:50051"
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N")
    case_timeout_s: float = Field(300.0, gt=0)
    executor_start_timeout_s: float = Field(120.0, gt=0)
    worker_id: str | None = Field(None, description="name in results; default host:port")
    reference_cache_bytes: int = Field(
        8 * 2**30,
        ge=0,
        description="host memory a worker may keep float64 references in (inputs are made "
        "again from their seed), so a repeated job pays only for its impls (0: off)",
    )
    reference_cache_pinned: bool = Field(
        True,
        description="on CUDA, page-lock the cached references (cudaHostRegister) so they copy "
        "to and from the device ~6x faster; locked memory cannot be swapped out",
    )
    worker_metrics_listen: str | None = Field(
        None,
        description="HOST:PORT where the worker serves Prometheus /metrics (e.g. 0.0.0.0:9400); "
        "unset: no metrics endpoint",
    )
    worker_shutdown_grace_s: float = Field(
        30.0, gt=0, description="on SIGTERM, how long the running case may take to finish"
    )

    log_format: Literal["text", "json"] = Field(
        "text",
        description="how the api, serve and worker processes log to stderr: text for people, "
        "json (one object per line) for a log pipeline",
    )
    access_log: bool = Field(
        True, description="the API logs one line per HTTP request (method, path, status, ms)"
    )
    login_max_failures: int = Field(
        10,
        gt=0,
        description="failed sign-ins (POST /login) one address may make within "
        "login_window_s before it must wait (429 with Retry-After); counted per API replica",
    )
    login_window_s: float = Field(60.0, gt=0, description="the window of login_max_failures")
    grpc_keepalive_s: float = Field(
        10.0,
        ge=0.1,
        le=3600,
        description="the API pings each worker this often while a group runs (finding a "
        "silent worker within it + 5 s); a worker accepts pings every half of it. Set it alike "
        "on the API and its workers",
    )

    # --- worker link: who may talk to a worker (see README "Security") ---
    worker_token: SecretStr | None = Field(
        None,
        description="shared secret of the API and its workers: the worker refuses "
        "kassay.v1.Worker calls without 'authorization: Bearer <it>', the API sends it",
    )
    worker_allow_unauthenticated: bool = Field(
        False,
        description="let a worker with no token and no mTLS listen on a non-loopback address",
    )
    worker_tls_cert: FilePath | None = Field(None, description="worker: server certificate (PEM)")
    worker_tls_key: FilePath | None = Field(None, description="worker: its private key (PEM)")
    worker_tls_client_ca: FilePath | None = Field(
        None, description="worker: require client certificates signed by this CA (mTLS)"
    )
    worker_tls_ca: FilePath | None = Field(
        None, description="API: talk TLS to the workers, trusting this CA (PEM)"
    )
    worker_tls_client_cert: FilePath | None = Field(
        None, description="API: client certificate shown to the workers (mTLS)"
    )
    worker_tls_client_key: FilePath | None = Field(None, description="API: its private key")
    worker_tls_server_name: str | None = Field(
        None,
        max_length=253,
        description="API: the name the workers' certificates are checked against (default: "
        "the host of each worker address)",
    )
    # --- worker: its own limits on what one Run may ask (the API's requests are capped too) ---
    max_run_groups: int = Field(64, ge=1, le=10_000, description="groups in one Run call")
    max_queued_groups: int = Field(
        4096, ge=1, description="groups a worker holds queued at once, over all Run calls"
    )
    max_group_impls: int = Field(65, ge=1, le=1000, description="impls in one group")
    max_timing_budget_s: float = Field(
        60.0, gt=0, description="a case's timing budget is cut to this on the worker"
    )

    # --- api ---
    database_url: str = "sqlite:///.kassay/kassay.db"
    workers: CommaList = Field(
        default_factory=list,
        description="the workers: addresses host:port, and dns:///NAME:PORT names whose every "
        "address (A/AAAA record) is a worker, e.g. a Kubernetes headless Service",
    )
    worker_resolve_s: float = Field(
        30.0, gt=0, description="how often dns:/// worker names are resolved again"
    )
    api_tokens: CommaList = Field(default_factory=list, description="tokens allowed to write")
    read_tokens: CommaList = Field(default_factory=list, description="read-only tokens")
    open_reads: bool = Field(True, description="reads need no token even when tokens are set")
    session_hours: float = Field(
        12.0,
        gt=0,
        le=24 * 30,
        description="how long a browser stays signed in (/login: a cookie that grants reads)",
    )
    max_body_bytes: int = Field(1_000_000, gt=0)
    lease_s: float = Field(
        10.0,
        gt=0,
        description="a dispatcher renews the lease of each group it runs every lease_s/4 "
        "seconds (at most 5 s); a group whose lease ran out (its API died) is requeued, so a "
        "replacement API takes over a dead one's groups within about this long",
    )
    max_job_s: float = Field(
        6 * 3600.0,
        gt=0,
        description="no job runs longer than this from submission (a spec may ask for less "
        "with max_duration_s); its unfinished cases end as timeout",
    )
    stall_s: float = Field(
        900.0,
        gt=0,
        description="a worker that sends nothing on a running group for this long is lost",
    )
    max_attempts: int = Field(3, ge=1)
    worker_poll_s: float = Field(2.0, gt=0, description="how often workers are described")
    dispatch_batch: int = Field(
        4,
        ge=1,
        le=64,
        description=(
            "groups of one job sent to a worker in one Run call (fewer round trips); with "
            "several workers up, at most a worker's fair share of the job's pending groups"
        ),
    )
    dispatch_depth: int = Field(
        2,
        ge=1,
        le=16,
        description="groups sent to one worker ahead of its results; the worker still runs one "
        "at a time, the next one waits in its queue so the device never idles on bookkeeping",
    )
    data_dir: Path = Path(".kassay")

    # --- code jobs (artifacts: a wheel or a module a job brings) ---
    code_tokens: CommaList = Field(
        default_factory=list,
        description="tokens allowed to upload artifacts and submit jobs that name them (the "
        "`code` scope); they may also do what a write token does",
    )
    allow_code: bool = Field(
        False,
        description="accept code from any caller allowed to write, without a code token "
        "(`kassay serve` on one machine sets it; a deployment leaves it off)",
    )
    max_artifact_bytes: int = Field(64 * 2**20, gt=0, description="largest artifact accepted")
    worker_artifacts: bool = Field(
        True, description="a worker runs groups that name artifacts (sandboxed)"
    )
    artifact_dir: Path | None = Field(
        None, description="the worker's artifact cache (default: <data_dir>/artifacts)"
    )
    sandbox_uid: int = Field(
        2_100_000_000,
        ge=1,
        lt=2**31 - 2**16,
        description="a worker running as root runs each sandbox's code as a user of its own, "
        "from this uid up (one per sandbox running at once), so that the process limit "
        "(sandbox_nproc, counted per user across the host) of one job's code cannot be "
        "spent by another's; no account needs to exist for them",
    )
    sandbox_cpu_s: int = Field(3600, gt=0, description="CPU seconds of one sandboxed executor")
    sandbox_nofile: int = Field(4096, ge=64, description="open files of a sandboxed executor")
    sandbox_nproc: int = Field(
        512, ge=16, description="processes and threads of a sandboxed executor"
    )
    sandbox_memory_bytes: int = Field(
        0,
        ge=0,
        description="host memory (private writable: RLIMIT_DATA) of a sandboxed executor; "
        "0: half of the host's memory",
    )

    @field_validator("workers", "api_tokens", "read_tokens", "code_tokens", mode="before")
    @classmethod
    def _comma_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            text = v.strip()
            if text.startswith("["):
                return json.loads(text)
            return [item.strip() for item in text.split(",") if item.strip()]
        return v

    @field_validator("workers")
    @classmethod
    def _worker_entries(cls, v: list[str]) -> list[str]:
        from kassay.contract.addresses import parse_entry

        for entry in v:
            parse_entry(entry)  # ValueError names the entry
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v not in ("auto", "cpu", "cuda") and not (v.startswith("cuda:") and v[5:].isdigit()):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {v!r}")
        return v

    @field_validator("worker_token")
    @classmethod
    def _worker_token(cls, v: SecretStr | None) -> SecretStr | None:
        if v is None:
            return None
        text = v.get_secret_value()
        # It travels as gRPC metadata: printable ASCII, no spaces; long enough not to guess.
        if len(text) < 16 or len(text) > 4096:
            raise ValueError("worker_token must be 16 to 4096 characters long")
        if not all("!" <= ch <= "~" for ch in text):
            raise ValueError("worker_token must be printable ASCII without spaces")
        return v

    @model_validator(mode="after")
    def _tls_pairs(self) -> Settings:
        pairs = (
            ("worker_tls_cert", "worker_tls_key"),
            ("worker_tls_client_cert", "worker_tls_client_key"),
        )
        for a, b in pairs:
            if (getattr(self, a) is None) != (getattr(self, b) is None):
                raise ValueError(f"{a} and {b} go together: set both or neither")
        if self.worker_tls_client_ca is not None and self.worker_tls_cert is None:
            raise ValueError("worker_tls_client_ca (mTLS) needs worker_tls_cert and worker_tls_key")
        if self.worker_tls_client_cert is not None and self.worker_tls_ca is None:
            raise ValueError("worker_tls_client_cert (mTLS) needs worker_tls_ca")
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
