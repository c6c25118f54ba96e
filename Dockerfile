# mcp-gateway service image. Expects DATABASE_URL, GATEWAY_JWT_SECRET and GATEWAY_SECRET_KEYS
# (see README); the embedded PostgreSQL is for local use only and is not started here.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml setup.cfg README.md schema.sql ./
COPY gateway ./gateway
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --create-home --uid 10001 gateway
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER gateway
ENV GATEWAY_HOST=0.0.0.0 \
    GATEWAY_PORT=8080 \
    GATEWAY_DATA_DIR=/home/gateway/data
EXPOSE 8080
# Ready: PostgreSQL answers, the schema is current, the call log has room (GET /readyz).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s CMD python -c "import urllib.request,os; urllib.request.urlopen(f'http://127.0.0.1:{os.environ[\"GATEWAY_PORT\"]}/readyz', timeout=2)"
# Applies the schema at start (idempotent, safe with several replicas), then serves with
# GATEWAY_WORKERS processes (default 1; auto: one per core).
CMD ["mcp-gateway", "serve"]
