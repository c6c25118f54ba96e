"""Settings from the environment, and the secrets of the embedded default."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from gateway.config import ENV_VARIABLES, ConfigError, Settings, with_local_secrets

FERNET_KEY = Fernet.generate_key().decode()
JWT_SECRET = "s" * 40


def test_defaults() -> None:
    settings = Settings.from_env({})
    assert settings.database_url is None
    assert settings.host == "127.0.0.1"
    assert settings.port == 8080
    assert settings.access_token_ttl_seconds == 900
    assert settings.refresh_token_ttl_days == 30
    assert settings.max_body_bytes == 4 * 1024 * 1024
    assert settings.auth_rate_limit == "10/minute"
    assert settings.probe_interval_seconds == 60
    assert settings.probe_timeout_seconds == 10
    assert settings.degraded_latency_ms == 1000
    assert settings.alert_eval_interval_seconds == 60
    assert settings.tools_cache_seconds == 300
    assert settings.analytics_cache_seconds == 300
    assert settings.data_dir == Path.home() / ".local/share/mcp-gateway"
    assert settings.base_url == "http://127.0.0.1:8080"
    assert settings.access_log is False


def test_every_variable_is_read() -> None:
    env = {
        "DATABASE_URL": "postgresql://gw:pw@db:5432/gateway",
        "REDIS_URL": "redis://cache:6379/0",
        "PUBLIC_URL": "https://gateway.example.com/",
        "SMTP_URL": "smtp://mailer:secret@mail:587",
        "GATEWAY_DATA_DIR": "/var/lib/gw",
        "GATEWAY_HOST": "0.0.0.0",
        "GATEWAY_PORT": "9000",
        "GATEWAY_JWT_SECRET": JWT_SECRET,
        "GATEWAY_SECRET_KEYS": f"{FERNET_KEY}, {Fernet.generate_key().decode()}",
        "GATEWAY_ACCESS_TOKEN_TTL_SECONDS": "600",
        "GATEWAY_REFRESH_TOKEN_TTL_DAYS": "7",
        "GATEWAY_MAX_BODY_BYTES": "1024",
        "GATEWAY_AUTH_RATE_LIMIT": "5/second",
        "GATEWAY_PROBE_INTERVAL_SECONDS": "30",
        "GATEWAY_PROBE_TIMEOUT_SECONDS": "2.5",
        "GATEWAY_DEGRADED_LATENCY_MS": "500",
        "GATEWAY_ALERT_EVAL_INTERVAL_SECONDS": "15",
        "GATEWAY_TOOLS_CACHE_SECONDS": "60",
        "GATEWAY_ANALYTICS_CACHE_SECONDS": "120",
        "GATEWAY_PROXY_TIMEOUT_SECONDS": "90",
        "GATEWAY_RUN_WORKERS": "false",
        "GATEWAY_ACCESS_LOG": "true",
        "GATEWAY_WORKERS": "3",
    }
    settings = Settings.from_env(env)
    assert settings.database_url == env["DATABASE_URL"]
    assert settings.redis_url == env["REDIS_URL"]
    assert settings.smtp_url == env["SMTP_URL"]
    assert settings.base_url == "https://gateway.example.com"
    assert settings.data_dir == Path("/var/lib/gw")
    assert (settings.host, settings.port) == ("0.0.0.0", 9000)
    assert settings.jwt_secret == JWT_SECRET
    assert len(settings.secret_keys) == 2 and settings.secret_keys[0] == FERNET_KEY
    assert settings.access_token_ttl_seconds == 600
    assert settings.refresh_token_ttl_days == 7
    assert settings.max_body_bytes == 1024
    assert settings.auth_rate_limit == "5/second"
    assert settings.probe_interval_seconds == 30
    assert settings.probe_timeout_seconds == 2.5
    assert settings.degraded_latency_ms == 500
    assert settings.alert_eval_interval_seconds == 15
    assert settings.tools_cache_seconds == 60
    assert settings.analytics_cache_seconds == 120
    assert settings.proxy_timeout_seconds == 90
    assert settings.run_workers is False
    assert settings.access_log is True
    assert settings.workers == 3
    assert set(env) <= set(ENV_VARIABLES)


@pytest.mark.parametrize(("raw", "port"), [("1", 1), ("8080", 8080), ("65535", 65535)])
def test_a_port_is_1_to_65535(raw: str, port: int) -> None:
    assert Settings.from_env({"GATEWAY_PORT": raw}).port == port


def test_empty_values_mean_the_default() -> None:
    assert Settings.from_env({"GATEWAY_PORT": "", "DATABASE_URL": "  "}) == Settings.from_env({})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DATABASE_URL", "mysql://db/gateway"),
        ("DATABASE_URL", "db.example.com"),
        ("REDIS_URL", "http://cache"),
        ("PUBLIC_URL", "gateway.example.com"),
        ("SMTP_URL", "mail.example.com:25"),
        ("GATEWAY_PORT", "http"),
        ("GATEWAY_PORT", "70000"),
        ("GATEWAY_PORT", "0"),
        ("GATEWAY_PORT", "-5"),
        ("GATEWAY_PORT", "65536"),
        ("GATEWAY_WORKERS", "many"),
        ("GATEWAY_WORKERS", "0"),
        ("GATEWAY_ACCESS_LOG", "loud"),
        ("GATEWAY_JWT_SECRET", "too-short"),
        ("GATEWAY_SECRET_KEYS", "not-a-fernet-key"),
        ("GATEWAY_ACCESS_TOKEN_TTL_SECONDS", "15m"),
        ("GATEWAY_REFRESH_TOKEN_TTL_DAYS", "-1"),
        ("GATEWAY_MAX_BODY_BYTES", "4MB"),
        ("GATEWAY_AUTH_RATE_LIMIT", "lots"),
        ("GATEWAY_AUTH_RATE_LIMIT", "0/minute"),
        ("GATEWAY_PROBE_INTERVAL_SECONDS", "0"),
        ("GATEWAY_PROBE_TIMEOUT_SECONDS", "soon"),
        ("GATEWAY_DEGRADED_LATENCY_MS", "-5"),
        ("GATEWAY_ALERT_EVAL_INTERVAL_SECONDS", "nan"),
        ("GATEWAY_TOOLS_CACHE_SECONDS", "x"),
        ("GATEWAY_ANALYTICS_CACHE_SECONDS", "x"),
        ("GATEWAY_PROXY_TIMEOUT_SECONDS", "x"),
        ("GATEWAY_RUN_WORKERS", "maybe"),
        ("GATEWAY_TRACE_URL", "https://tempo.example/trace/"),
        ("GATEWAY_TRACE_URL", "tempo.example/trace/{trace_id}"),
        ("GATEWAY_TRACE_URL", "https://tempo.example/{trace_id}/{span_id}"),
    ],
)
def test_a_bad_value_fails_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as error:
        Settings.from_env({name: value})
    assert str(error.value).startswith(f"{name}: ")
    assert len(str(error.value)) > len(name) + 10  # says what is wrong, too


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"},
            False,
        ),
        ({"OTEL_SERVICE_NAME": "gateway"}, False),
    ],
)
def test_tracing_is_on_only_with_an_otlp_endpoint(env: dict[str, str], on: bool) -> None:
    assert Settings.from_env(env).tracing is on


def test_a_trace_url_template_is_kept() -> None:
    template = "https://tempo.example/explore?trace={trace_id}"
    assert Settings.from_env({"GATEWAY_TRACE_URL": template}).trace_url == template


def test_every_variable_is_documented_in_the_readme() -> None:
    readme = (Path(__file__).parents[1] / "docs" / "configuration.md").read_text()
    undocumented = [name for name in ENV_VARIABLES if f"`{name}`" not in readme]
    assert not undocumented, f"add to docs/configuration.md's table: {undocumented}"


# -- secrets of the embedded default --------------------------------------------------------


def test_local_secrets_are_generated_once_and_reused(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    first = with_local_secrets(settings)
    assert len(first.jwt_secret) >= 32
    [key] = first.secret_keys
    Fernet(key)  # a usable key
    path = tmp_path / "data" / "secrets.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    second = with_local_secrets(settings)
    assert (second.jwt_secret, second.secret_keys) == (first.jwt_secret, first.secret_keys)


def test_explicit_secrets_win_over_generated_ones(tmp_path: Path) -> None:
    with_local_secrets(Settings(data_dir=tmp_path))
    mixed = with_local_secrets(Settings(data_dir=tmp_path, jwt_secret=JWT_SECRET))
    assert mixed.jwt_secret == JWT_SECRET
    assert mixed.secret_keys == tuple(
        json.loads((tmp_path / "secrets.json").read_text())["secret_keys"]
    )
    both = Settings(data_dir=tmp_path / "unused", jwt_secret=JWT_SECRET, secret_keys=(FERNET_KEY,))
    assert with_local_secrets(both) is both
    assert not (tmp_path / "unused").exists()


def test_a_database_url_without_secrets_is_refused(tmp_path: Path) -> None:
    dsn = "postgresql://db/gateway"
    with pytest.raises(ConfigError, match=r"^GATEWAY_JWT_SECRET: must be set"):
        with_local_secrets(Settings(database_url=dsn, data_dir=tmp_path))
    with pytest.raises(ConfigError, match=r"^GATEWAY_SECRET_KEYS: must be set"):
        with_local_secrets(Settings(database_url=dsn, data_dir=tmp_path, jwt_secret=JWT_SECRET))
    assert not (tmp_path / "secrets.json").exists()


def test_a_damaged_secrets_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "secrets.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"^GATEWAY_DATA_DIR: .*secrets\.json"):
        with_local_secrets(Settings(data_dir=tmp_path))
