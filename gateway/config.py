"""Settings read from the environment: the only place environment variables are read."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet
from limits import parse as parse_rate_limit

from gateway.security.outbound import Network, OutboundPolicy, parse_networks

log = logging.getLogger(__name__)

MiB = 1024 * 1024


class ConfigError(Exception):
    """A setting is missing or malformed; the message names the variable."""


@dataclass(frozen=True, slots=True)
class Settings:
    database_url: str | None = None
    redis_url: str | None = None
    public_url: str | None = None
    smtp_url: str | None = None
    data_dir: Path = field(default_factory=lambda: Path.home() / ".local/share/mcp-gateway")
    host: str = "127.0.0.1"
    port: int = 8080
    jwt_secret: str = ""
    secret_keys: tuple[str, ...] = ()
    access_token_ttl_seconds: int = 900
    refresh_token_ttl_days: int = 30
    max_body_bytes: int = 4 * MiB
    # How long a request's body may take to arrive once its headers have (408 after that).
    body_timeout_seconds: float = 30.0
    probe_interval_seconds: float = 60.0
    probe_timeout_seconds: float = 10.0
    # How many probes one gateway process runs at once.
    probe_concurrency: int = 50
    degraded_latency_ms: float = 1000.0
    alert_eval_interval_seconds: float = 60.0
    # Alert notifications: timeout per attempt, attempts before giving up, and the wait after
    # the first failed attempt (it doubles after each further one).
    alert_webhook_timeout_seconds: float = 10.0
    alert_webhook_max_attempts: int = 8
    alert_webhook_backoff_seconds: float = 15.0
    tools_cache_seconds: float = 300.0
    analytics_cache_seconds: float = 300.0
    proxy_timeout_seconds: float = 60.0
    health_retention_days: int = 90
    # Raw tool calls are kept this long, their hourly rollups (analytics) longer; alert events
    # with their deliveries as long as configured here.
    tool_call_retention_days: int = 30
    rollup_retention_days: int = 400
    alert_retention_days: int = 400
    invite_ttl_days: int = 7
    # A dashboard session ends after this long without a page view, and after 7 days anyway.
    dashboard_session_hours: float = 12.0
    # Bounds on every wait on PostgreSQL (a frozen database answers 503, not silence): for a
    # pooled connection, and for each statement.
    db_acquire_timeout_seconds: float = 5.0
    db_statement_timeout_seconds: float = 10.0
    # Outbound connections (gateway.security.outbound): addresses refused on top of the
    # link-local and metadata ones always refused, and exceptions to those.
    outbound_deny: tuple[Network, ...] = ()
    outbound_allow: tuple[Network, ...] = ()
    # Proxies whose X-Forwarded-For is believed (for the per-address login rate limit).
    trusted_proxies: tuple[Network, ...] = ()
    # Who may sign up: anyone (open), only with an invitation (invite), nobody (closed).
    signup: str = "open"
    # Rate limit for login and signup, per client address and per email.
    auth_rate_limit: str = "10/minute"
    # Background loops (prober, alert evaluator, ...); tests switch them off to drive them by hand.
    run_workers: bool = True
    # Gateway processes sharing the port (serve --workers); this process's number among them
    # (0 when it runs alone), for the metrics and the log.
    workers: int = 1
    worker_id: int = 0
    # Where the workers leave their metrics for each other (made by the parent; None alone).
    metrics_dir: Path | None = None
    # Label the proxy's request counter with server ids (fine for tens of servers, not more).
    metrics_per_server: bool = False
    # One log line per HTTP request (gateway.ops.access_log): off, it costs nothing per request.
    access_log: bool = False
    # What one workspace may create or hold open (gateway/quotas in docs/SECURITY.md): so that
    # with open signup, where everyone owns a workspace, no tenant can exhaust the others.
    max_servers_per_workspace: int = 500
    max_alert_rules_per_workspace: int = 500
    max_toolsets_per_workspace: int = 100
    max_api_keys_per_workspace: int = 100
    max_pending_invites_per_workspace: int = 200
    # Invitation emails a workspace may send per hour (each is an email to a stranger).
    invites_per_hour: int = 50
    # Proxied requests of one workspace in flight at once in one process (every stream is one).
    max_streams_per_workspace: int = 1000
    max_workspaces_per_user: int = 50
    # How long checking arguments against an upstream's inputSchema may take before the check
    # is given up (the call goes on unchecked, and the answer says so).
    schema_check_seconds: float = 1.0
    # Background probes (and alert notifications) one workspace may have in flight at once in
    # one process: its dead servers (or webhooks) cannot take every slot from the others.
    probes_per_workspace: int = 5
    notifier_concurrency: int = 20
    notifications_per_workspace: int = 4
    # OAuth for MCP clients (gateway/oauth): on unless GATEWAY_OAUTH=off, and then only with an
    # https (or loopback) PUBLIC_URL.
    oauth: bool = True
    # OpenTelemetry traces (gateway/ops/tracing): on when an OTLP endpoint is set (the SDK reads
    # the other OTEL_* variables itself), and a link from each logged call to its trace.
    tracing: bool = False
    trace_url: str | None = None

    @property
    def outbound(self) -> OutboundPolicy:
        return OutboundPolicy(deny=self.outbound_deny, allow=self.outbound_allow)

    @property
    def base_url(self) -> str:
        """Where users reach this service; used in invitation links."""
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for name, (attr, parse) in _VARIABLES.items():
            raw = env.get(name)
            if raw is None or raw.strip() == "":
                continue
            try:
                values[attr] = parse(raw.strip())
            except ValueError as exc:
                raise ConfigError(f"{name}: {exc}") from None
        values["tracing"] = _tracing(env)
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


def _positive_int(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"expected a whole number, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"must be greater than 0, got {value}")
    return value


def _positive_float(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"expected a number, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"must be greater than 0, got {raw}")
    return value


def parse_port(raw: str) -> int:
    """A TCP port to listen on. 0 (any free port) is refused: the port a gateway listens on is
    where its users, its PUBLIC_URL and its workers find it, so it is chosen, not drawn."""
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"expected a port from 1 to 65535, got {raw!r}") from None
    if value == 0:
        raise ValueError("expected a port from 1 to 65535, got 0 (any free port is not offered)")
    if not 1 <= value <= 65535:
        raise ValueError(f"expected a port from 1 to 65535, got {value}")
    return value


def _url(*schemes: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        scheme = raw.partition("://")[0]
        if scheme not in schemes or "://" not in raw:
            raise ValueError(f"expected a URL starting with {' or '.join(schemes)}://")
        return raw

    return parse


def _secret_keys(raw: str) -> tuple[str, ...]:
    keys = tuple(k.strip() for k in raw.split(",") if k.strip())
    for key in keys:
        try:
            Fernet(key)
        except ValueError:
            raise ValueError(
                "expected comma-separated Fernet keys (32 url-safe base64-encoded bytes each)"
            ) from None
    return keys


def _jwt_secret(raw: str) -> str:
    if len(raw) < 32:
        raise ValueError("must be at least 32 characters")
    return raw


def _rate_limit(raw: str) -> str:
    try:
        item = parse_rate_limit(raw)
    except ValueError:
        item = None
    if item is None or item.amount <= 0:
        raise ValueError(f"expected a rate such as '10/minute' or '100/hour', got {raw!r}")
    return raw


def _networks(raw: str) -> tuple[Network, ...]:
    try:
        return parse_networks(raw)
    except ValueError as exc:
        raise ValueError(
            f"expected comma-separated CIDR ranges such as 10.0.0.0/8: {exc}"
        ) from None


def _signup(raw: str) -> str:
    if raw not in ("open", "invite", "closed"):
        raise ValueError(f"expected open, invite or closed, got {raw!r}")
    return raw


def _flag(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"expected true or false, got {raw!r}")


def _tracing(env: Mapping[str, str]) -> bool:
    """OpenTelemetry's own switches: an OTLP endpoint turns traces on, OTEL_SDK_DISABLED off."""
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    disabled = env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    return bool(endpoint and endpoint.strip()) and not disabled


def _trace_url(raw: str) -> str:
    """A link template for a call's trace: an http(s) URL with {trace_id} where the id goes."""
    _url("http", "https")(raw)
    if "{trace_id}" not in raw:
        raise ValueError("expected a URL with {trace_id} where the trace id goes")
    try:
        raw.format(trace_id="0" * 32)
    except (KeyError, IndexError, ValueError):
        raise ValueError("expected no other {...} than {trace_id}") from None
    return raw


def parse_workers(raw: str) -> int:
    if raw.strip() == "auto":
        return os.cpu_count() or 1
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"expected a number of processes or auto, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"expected a number of processes (at least 1) or auto, got {value}")
    return value


_VARIABLES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "DATABASE_URL": ("database_url", _url("postgresql", "postgres")),
    "REDIS_URL": ("redis_url", _url("redis", "rediss")),
    "PUBLIC_URL": ("public_url", _url("http", "https")),
    "SMTP_URL": ("smtp_url", _url("smtp", "smtps")),
    "GATEWAY_DATA_DIR": ("data_dir", lambda raw: Path(raw).expanduser()),
    "GATEWAY_HOST": ("host", str),
    "GATEWAY_PORT": ("port", parse_port),
    "GATEWAY_JWT_SECRET": ("jwt_secret", _jwt_secret),
    "GATEWAY_SECRET_KEYS": ("secret_keys", _secret_keys),
    "GATEWAY_ACCESS_TOKEN_TTL_SECONDS": ("access_token_ttl_seconds", _positive_int),
    "GATEWAY_REFRESH_TOKEN_TTL_DAYS": ("refresh_token_ttl_days", _positive_int),
    "GATEWAY_MAX_BODY_BYTES": ("max_body_bytes", _positive_int),
    "GATEWAY_BODY_TIMEOUT_SECONDS": ("body_timeout_seconds", _positive_float),
    "GATEWAY_PROBE_INTERVAL_SECONDS": ("probe_interval_seconds", _positive_float),
    "GATEWAY_PROBE_TIMEOUT_SECONDS": ("probe_timeout_seconds", _positive_float),
    "GATEWAY_PROBE_CONCURRENCY": ("probe_concurrency", _positive_int),
    "GATEWAY_DEGRADED_LATENCY_MS": ("degraded_latency_ms", _positive_float),
    "GATEWAY_ALERT_EVAL_INTERVAL_SECONDS": ("alert_eval_interval_seconds", _positive_float),
    "GATEWAY_ALERT_WEBHOOK_TIMEOUT_SECONDS": ("alert_webhook_timeout_seconds", _positive_float),
    "GATEWAY_ALERT_WEBHOOK_MAX_ATTEMPTS": ("alert_webhook_max_attempts", _positive_int),
    "GATEWAY_ALERT_WEBHOOK_BACKOFF_SECONDS": ("alert_webhook_backoff_seconds", _positive_float),
    "GATEWAY_TOOLS_CACHE_SECONDS": ("tools_cache_seconds", _positive_float),
    "GATEWAY_ANALYTICS_CACHE_SECONDS": ("analytics_cache_seconds", _positive_float),
    "GATEWAY_PROXY_TIMEOUT_SECONDS": ("proxy_timeout_seconds", _positive_float),
    "GATEWAY_HEALTH_RETENTION_DAYS": ("health_retention_days", _positive_int),
    "GATEWAY_TOOL_CALL_RETENTION_DAYS": ("tool_call_retention_days", _positive_int),
    "GATEWAY_ROLLUP_RETENTION_DAYS": ("rollup_retention_days", _positive_int),
    "GATEWAY_ALERT_RETENTION_DAYS": ("alert_retention_days", _positive_int),
    "GATEWAY_AUTH_RATE_LIMIT": ("auth_rate_limit", _rate_limit),
    "GATEWAY_SIGNUP": ("signup", _signup),
    "GATEWAY_DASHBOARD_SESSION_HOURS": ("dashboard_session_hours", _positive_float),
    "GATEWAY_DB_ACQUIRE_TIMEOUT_SECONDS": ("db_acquire_timeout_seconds", _positive_float),
    "GATEWAY_DB_STATEMENT_TIMEOUT_SECONDS": ("db_statement_timeout_seconds", _positive_float),
    "GATEWAY_OUTBOUND_DENY": ("outbound_deny", _networks),
    "GATEWAY_OUTBOUND_ALLOW": ("outbound_allow", _networks),
    "GATEWAY_TRUSTED_PROXIES": ("trusted_proxies", _networks),
    "GATEWAY_RUN_WORKERS": ("run_workers", _flag),
    "GATEWAY_WORKERS": ("workers", parse_workers),
    "GATEWAY_METRICS_PER_SERVER": ("metrics_per_server", _flag),
    "GATEWAY_ACCESS_LOG": ("access_log", _flag),
    "GATEWAY_OAUTH": ("oauth", _flag),
    "GATEWAY_TRACE_URL": ("trace_url", _trace_url),
    "GATEWAY_MAX_SERVERS_PER_WORKSPACE": ("max_servers_per_workspace", _positive_int),
    "GATEWAY_MAX_ALERT_RULES_PER_WORKSPACE": ("max_alert_rules_per_workspace", _positive_int),
    "GATEWAY_MAX_TOOLSETS_PER_WORKSPACE": ("max_toolsets_per_workspace", _positive_int),
    "GATEWAY_MAX_API_KEYS_PER_WORKSPACE": ("max_api_keys_per_workspace", _positive_int),
    "GATEWAY_MAX_PENDING_INVITES_PER_WORKSPACE": (
        "max_pending_invites_per_workspace",
        _positive_int,
    ),
    "GATEWAY_INVITES_PER_HOUR": ("invites_per_hour", _positive_int),
    "GATEWAY_MAX_STREAMS_PER_WORKSPACE": ("max_streams_per_workspace", _positive_int),
    "GATEWAY_MAX_WORKSPACES_PER_USER": ("max_workspaces_per_user", _positive_int),
    "GATEWAY_SCHEMA_CHECK_SECONDS": ("schema_check_seconds", _positive_float),
    "GATEWAY_PROBES_PER_WORKSPACE": ("probes_per_workspace", _positive_int),
    "GATEWAY_NOTIFIER_CONCURRENCY": ("notifier_concurrency", _positive_int),
    "GATEWAY_NOTIFICATIONS_PER_WORKSPACE": ("notifications_per_workspace", _positive_int),
}

ENV_VARIABLES = tuple(_VARIABLES)


def _read_secrets(path: Path) -> dict[str, Any]:
    try:
        stored = json.loads(path.read_text())
        valid = isinstance(stored["jwt_secret"], str) and isinstance(stored["secret_keys"], list)
    except (ValueError, KeyError, TypeError):
        valid = False
    if not valid:
        raise ConfigError(
            f"GATEWAY_DATA_DIR: {path} is not a secrets file written by mcp-gateway; "
            "restore it, or set GATEWAY_JWT_SECRET and GATEWAY_SECRET_KEYS"
        )
    result: dict[str, Any] = stored
    return result


def with_local_secrets(settings: Settings) -> Settings:
    """Fill in missing secrets from (or into) a file under the data dir.

    Only the embedded default does this: several processes sharing a real database must
    share their secrets, so with DATABASE_URL both secrets have to be set explicitly.
    """
    if settings.jwt_secret and settings.secret_keys:
        return settings
    if settings.database_url is not None:
        missing = "GATEWAY_JWT_SECRET" if not settings.jwt_secret else "GATEWAY_SECRET_KEYS"
        raise ConfigError(f"{missing}: must be set when DATABASE_URL is set")
    path = settings.data_dir / "secrets.json"
    if path.exists():
        stored = _read_secrets(path)
    else:
        stored = {
            "jwt_secret": secrets.token_urlsafe(48),
            "secret_keys": [Fernet.generate_key().decode()],
        }
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(json.dumps(stored))
    log.warning(
        "using secrets generated in %s; production deployments must set "
        "GATEWAY_JWT_SECRET and GATEWAY_SECRET_KEYS",
        path,
    )
    return settings.replace(
        jwt_secret=settings.jwt_secret or stored["jwt_secret"],
        secret_keys=settings.secret_keys or tuple(stored["secret_keys"]),
    )
