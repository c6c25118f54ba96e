"""mcp-gateway: a multi-tenant gateway and monitoring service for MCP servers. This is the map.

Three ways in, one aiohttp application (app.create_app builds it, in dependency order):

- Agents call /api/v1/proxy/{server}/mcp: proxy/ forwards MCP byte for byte to the upstream
  server and puts each `tools/call` in the call log (calllog/). This is the hot path. Or they
  call /api/v1/toolsets/{id}/mcp: toolsets/ serves several servers as one, forwarding each
  `tools/call` (and each request about the task one became) through the proxy's exchange.
- REST clients call /api/v1/...: api/ holds one thin handler module per resource, which
  validate, call one SQL function (db/) and answer; api/routing declares each route's access.
- People use the dashboard at /: dashboard/ renders pages that call the api/ handlers under
  the same access rules.

Beside them, background loops (background/) probe upstreams, evaluate alerts, send their
notifications, apply retention and write when keys and OAuth grants were last used, in the
same event loop.

The packages (each opens with its job):

    proxy/       THE HOT PATH: handler, headers, admission, requests, replies, outcome, CORS,
                 governing (the proxy's side of policy: refusals, cut tool lists), and tasks
                 (calls that became tasks, logged when a reply in any process ends them)
    toolsets/    one MCP endpoint over several servers: the endpoint, the names it exposes
                 (names), sessions sealed inside their ids (sessions), the members' own
                 sessions (members), toolsets and their name index cached in-process
                 (registry)
    policy/      governed access: rules (permissions, tool globs, rate limits, pinned
                 tools), the decision per request (decisions), budgets shared by every
                 process, and tools/list filtering (tool_lists)
    calllog/     the rows every producer writes (records) and the batched writer (writer)
    upstreams/   registered servers as reached at run time (servers), their tool lists,
                 and tool integrity: every list seen fingerprinted per tool (fingerprints)
    accounts/    who is calling and what they may do (access), signup, rate limits, mailer
    caching/     in-process caches, the LISTEN loop that drops their entries, the shared cache
    oauth/       OAuth 2.1 for MCP clients: the authorization server (server: authlib's
                 components behind aiohttp; clients, registered or by metadata document;
                 consent, the authorize page; endpoints: register, token, revoke) and the
                 protected resources, every MCP URL, and the grants behind their tokens
                 (resources)
    api/         /api/v1: routing, models, one module per resource, the OpenAPI document,
                 and discovery (the OAuth metadata documents MCP clients look for)
    dashboard/   the pages, their templates and static files, the template filters, and
                 connect (the "Connect an agent" snippets)
    background/  the loops, each `async def run(app)`, started from one list in app.py
    ops/         serve --workers (supervisor), /healthz and /readyz (readiness), metrics
                 and the worker snapshots a scrape adds up (snapshots), the access log,
                 and OpenTelemetry traces (tracing: off unless an OTLP endpoint is set;
                 the middleware's SERVER spans, the exchanges' CLIENT spans, the exporter)
    mcp/         the gateway's own MCP client: client, errors, headers, tool list budget, probe
    security/    passwords, tokens, key values, sealed credentials, the outbound address
                 policy, untrusted JSON Schemas checked in worker processes
    db/          the pool, schema and migrations, one SQL module per resource, histograms,
                 what "the database is unavailable" means (unavailable)

The top level holds the assembly only: app, cli (and __main__), config (the only reader of
the environment), errors (the one error middleware), keys (the infrastructure AppKeys; every
other web.AppKey is declared by the module that owns what it holds).

Words:

- A *server* is the registered resource (db/servers, api/servers); an *upstream* is that
  server as the gateway reaches it at run time (upstreams/, with its URL and credentials).
- A *toolset* is several servers of a workspace as one MCP endpoint; they are its *members*.
  Its *session* is a 2025-era MCP client's (state sealed inside the Mcp-Session-Id); the
  dashboard's sign-in sessions are *dashboard sessions*.
- A *worker* is a gateway process (`serve --workers N`, ops/supervisor); a *loop* is
  background work inside one (background/). GATEWAY_RUN_WORKERS says whether a process runs
  the loops.
- A *rate limit* is a rule ("100/minute"); a *budget* is one window's allowance of calls
  under it, shared by every process; a *lease* is the part of a budget one process holds.
- A tool's *definition* is what its fingerprint covers (name, title, description, inputSchema,
  outputSchema, annotations); a server that *pins* its tools serves only those whose definition
  is the approved one.
- A *refusal* is a request the rules stop before it is forwarded; its calls are logged with
  an error message starting "refused:".
- *Health* is an upstream's (probes, /health); *readiness* is this process's (/readyz).
- A *tool call* is a row of the call log; a `tools/call` is the MCP request it records, once
  it ended: an interim answer (`input_required`, a task handle) is no row of its own.
- A *workspace* is a tenant: every row belongs to one, and every bound is counted per one.
- *Metrics* are this process's Prometheus counters (ops/metrics, served by api/metrics);
  an alert rule's *metric* is what db/alert_metrics computes from the call log. Likewise a
  latency *histogram* in db/histograms is the bucket array stored in the hourly rollups, not
  a Prometheus one.
- One resource, one name: api/tool_calls, db/tool_calls and dashboard/tool_calls are the
  same resource's handlers, SQL and page (the same for servers and alerts).

Hot-path conventions (the proxy's every call pays for each line; bench/proxy_cost.py counts):

- Cached lookups have `peek()` beside `get()`: peek answers a hit without a coroutine, and
  only a miss awaits get(), which loads and caches.
- No database round trip per proxied request: API keys, memberships and servers come from
  in-process caches that LISTEN/NOTIFY keeps fresh; call log rows are queued, never awaited.
- What a request needs is looked up once (proxy.handler.Proxying), not by app[key] per use.
- Refusals come before anything is forwarded: a call the gateway could not log, or could read
  differently from the server, never reaches it.
- Tracing off costs one test (Proxying.tracing is None): its middleware is not installed.
"""
