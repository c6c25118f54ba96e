-- mcp-gateway: the canonical schema. A fresh database gets this file; an existing one gets the
-- numbered files in gateway/migrations/ above its recorded version (a test checks both agree).

CREATE TABLE schema_version (
    version     integer PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- Cache invalidation: every row change that an in-process cache may hold is announced on the
-- channel 'gateway_invalidate' as '<table>:<key>', where the key is the values of the columns
-- named in the trigger's arguments, joined with ':'. Every gateway process then drops it.
CREATE FUNCTION notify_invalidate() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    doc jsonb;
    col text;
    parts text[] := '{}';
BEGIN
    IF TG_OP = 'DELETE' THEN doc := to_jsonb(OLD); ELSE doc := to_jsonb(NEW); END IF;
    FOREACH col IN ARRAY TG_ARGV LOOP
        parts := parts || (doc ->> col);
    END LOOP;
    PERFORM pg_notify('gateway_invalidate', TG_TABLE_NAME || ':' || array_to_string(parts, ':'));
    RETURN NULL;
END $$;

-- == accounts and workspaces ==

CREATE TABLE users (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    email          text NOT NULL,
    name           text NOT NULL,
    password_hash  text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- Set once the user has opened a verification link the gateway emailed to the address (an
    -- invitation's token does not count: the inviter saw it too); until then no pending
    -- invitation's token is shown to them.
    email_verified_at  timestamptz,
    CONSTRAINT users_email_key UNIQUE (email)
);

CREATE TABLE workspaces (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name         text NOT NULL,
    slug         text NOT NULL,
    is_personal  boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT workspaces_slug_key UNIQUE (slug)
);

CREATE TABLE memberships (
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    user_id       uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role          text NOT NULL CHECK (role IN ('owner', 'admin', 'member')),
    joined_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, user_id)
);
CREATE INDEX memberships_user_idx ON memberships (user_id);
CREATE TRIGGER memberships_invalidate AFTER INSERT OR UPDATE OR DELETE ON memberships
    FOR EACH ROW EXECUTE FUNCTION notify_invalidate('workspace_id', 'user_id');

CREATE TABLE invites (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    email         text NOT NULL,
    role          text NOT NULL CHECK (role IN ('admin', 'member')),
    -- Of the token only a hash (SHA-256, hex), as for API keys: a copy of the database opens
    -- no workspace. The token itself is derived from the id with the server's secret, so the
    -- invitee can be shown it again (GET /auth/me).
    token_hash    text NOT NULL UNIQUE,
    status        text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'accepted', 'revoked')),
    invited_by    uuid REFERENCES users (id) ON DELETE SET NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    accepted_at   timestamptz
);
CREATE INDEX invites_workspace_idx ON invites (workspace_id, created_at DESC);
CREATE INDEX invites_pending_email_idx ON invites (email) WHERE status = 'pending';

-- Refresh tokens rotate on every use; all tokens descending from one login share a family,
-- so presenting an already-rotated token revokes the whole family.
CREATE TABLE refresh_tokens (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    family_id     uuid NOT NULL,
    user_id       uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    token_hash    text NOT NULL UNIQUE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    used_at       timestamptz,
    revoked_at    timestamptz
);
CREATE INDEX refresh_tokens_family_idx ON refresh_tokens (family_id);
-- A password change ends every session of its user.
CREATE INDEX refresh_tokens_user_idx ON refresh_tokens (user_id) WHERE revoked_at IS NULL;

-- Sign-ins of the dashboard: the browser holds the raw id in an HttpOnly cookie, only its hash
-- is stored, so logging out (deleting the row) ends the session in every process at once.
CREATE TABLE dashboard_sessions (
    id_hash       text PRIMARY KEY,
    user_id       uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    -- The workspace the pages show; null once it is deleted (the next page lands at home).
    workspace_id  uuid REFERENCES workspaces (id) ON DELETE SET NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);
CREATE INDEX dashboard_sessions_user_idx ON dashboard_sessions (user_id);
CREATE INDEX dashboard_sessions_expiry_idx ON dashboard_sessions (expires_at);

CREATE TABLE api_keys (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name          text NOT NULL,
    prefix        text NOT NULL,
    key_hash      text NOT NULL UNIQUE,
    created_by    uuid REFERENCES users (id) ON DELETE SET NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz,
    revoked_at    timestamptz,
    -- Governed access (gateway/policy): what the key may do. Null servers or tools: all of them.
    permissions   text[] NOT NULL DEFAULT '{proxy,ingest,read}',
    allowed_servers uuid[],
    allowed_tools text[],       -- tool name globs (* and ?)
    rate_limit    text          -- "N/second|minute|hour|day", the key's tools/calls
);
CREATE INDEX api_keys_workspace_idx ON api_keys (workspace_id, created_at DESC);
CREATE TRIGGER api_keys_invalidate AFTER INSERT OR UPDATE OR DELETE ON api_keys
    FOR EACH ROW EXECUTE FUNCTION notify_invalidate('key_hash');

-- == servers and health ==

CREATE TABLE servers (
    id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    workspace_id      uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name              text NOT NULL,
    url               text NOT NULL,
    description       text NOT NULL DEFAULT '',
    tags              text[] NOT NULL DEFAULT '{}',
    auth_type         text CHECK (auth_type IN ('bearer', 'api_key', 'basic')),
    -- Fernet token (MultiFernet over GATEWAY_SECRET_KEYS) of the credentials JSON object.
    credentials       bytea,
    status            text NOT NULL DEFAULT 'unknown'
                      CHECK (status IN ('unknown', 'healthy', 'degraded', 'down')),
    last_checked_at   timestamptz,
    last_latency_ms   double precision,
    -- From the latest check whose tools/list worked; tools_changed_at is when that list last
    -- differed from the one seen before (null until it first changes).
    tool_count        integer,
    tools_hash        text,
    tools_changed_at  timestamptz,
    -- The background prober claims rows whose time has come (FOR UPDATE SKIP LOCKED) and
    -- moves this forward by one interval, so no two gateway processes probe a server twice.
    next_probe_at     timestamptz NOT NULL DEFAULT now(),
    -- How many stored checks of each status: GET /health/checks reports its total from these
    -- instead of counting up to a year of rows per request.
    checks_healthy    bigint NOT NULL DEFAULT 0,
    checks_degraded   bigint NOT NULL DEFAULT 0,
    checks_down       bigint NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    -- Governed access: tool name globs nobody may call, and the limit of every caller's
    -- tools/calls together ("N/unit").
    disabled_tools    text[] NOT NULL DEFAULT '{}',
    rate_limit        text,
    -- Tool integrity: when true, a tool whose definition is not the approved one (server_tools)
    -- is refused and left out of tools/list. tool_definitions_hash is the hash of the tool
    -- definitions last seen (gateway/upstreams/fingerprints.py), so the same list seen again
    -- costs one comparison.
    pin_tools         boolean NOT NULL DEFAULT false,
    tool_definitions_hash  text,
    CONSTRAINT servers_workspace_id_name_key UNIQUE (workspace_id, name),
    CONSTRAINT servers_credentials_match CHECK ((auth_type IS NULL) = (credentials IS NULL))
);
CREATE INDEX servers_next_probe_idx ON servers (next_probe_at);
-- The name too: a toolset's tool names start with it (gateway/toolsets).
CREATE TRIGGER servers_invalidate
    AFTER UPDATE OF name, url, auth_type, credentials, disabled_tools, rate_limit, pin_tools
    OR DELETE
    ON servers
    FOR EACH ROW EXECUTE FUNCTION notify_invalidate('id');

-- Tool integrity, written only through gateway/db/server_tools.py. Each tool of a server as the
-- gateway last saw it (fingerprint: SHA-256 of the definition's canonical JSON), and the
-- fingerprint approved for it. A tool gone from the list keeps its row (fingerprint null) while
-- it has an approval, so that it comes back approved only unchanged; at most 2,000 current
-- tools per server (the tool list bound), and approving all drops the rows of gone tools.
CREATE TABLE server_tools (
    server_id    uuid NOT NULL REFERENCES servers (id) ON DELETE CASCADE,
    name         text NOT NULL,
    fingerprint  text,
    definition   jsonb,
    approved     text,
    seen_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (server_id, name)
);

-- The change history: one row per tool added, removed or changed, with the definitions before
-- and after. At most 1,000 per server (the oldest go first), and none older than the alert
-- retention (gateway/background/retention.py).
CREATE TABLE tool_changes (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    server_id     uuid NOT NULL REFERENCES servers (id) ON DELETE CASCADE,
    workspace_id  uuid NOT NULL,  -- the server's (deleted with it)
    tool_name     text NOT NULL,
    change        text NOT NULL CHECK (change IN ('added', 'removed', 'changed')),
    before        jsonb,
    after         jsonb,
    detected_at   timestamptz NOT NULL DEFAULT now()
);
-- Per server, newest first: the list endpoint and the tool_changes alert metric.
CREATE INDEX tool_changes_server_idx ON tool_changes (server_id, detected_at DESC, id DESC);
CREATE INDEX tool_changes_detected_idx ON tool_changes (detected_at);

-- Written only through gateway/db/health_checks.py, which keeps health_hourly and the
-- servers' counters in step in the same statement (record and prune).
CREATE TABLE health_checks (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    server_id     uuid NOT NULL REFERENCES servers (id) ON DELETE CASCADE,
    -- A copy of the server's (which never changes), so a workspace's newest checks are one
    -- index range rather than a merge over every server.
    workspace_id  uuid NOT NULL,
    status        text NOT NULL CHECK (status IN ('healthy', 'degraded', 'down')),
    latency_ms    double precision NOT NULL,
    error         text,
    tool_count    integer,
    tools_hash    text,
    checked_at    timestamptz NOT NULL DEFAULT now()
);
-- Per server, newest first; covers the uptime summary's partial hours and the alert metrics.
CREATE INDEX health_checks_server_idx ON health_checks (server_id, checked_at DESC)
    INCLUDE (status, latency_ms);
CREATE INDEX health_checks_workspace_idx ON health_checks (workspace_id, checked_at DESC);
CREATE INDEX health_checks_workspace_status_idx
    ON health_checks (workspace_id, status, checked_at DESC);
-- Retention deletes the oldest rows in small batches.
CREATE INDEX health_checks_checked_at_idx ON health_checks (checked_at);

-- Checks per server and UTC hour: the summary over N days reads N*24 rows per server here and
-- only the two partial hours at the window's edges from health_checks.
CREATE TABLE health_hourly (
    server_id    uuid NOT NULL REFERENCES servers (id) ON DELETE CASCADE,
    hour         timestamptz NOT NULL,
    healthy      integer NOT NULL,
    degraded     integer NOT NULL,
    down         integer NOT NULL,
    latency_sum  double precision NOT NULL,
    -- Covering, so the summary is an index-only scan: a year for 200 servers in ~0.1 s.
    PRIMARY KEY (server_id, hour) INCLUDE (healthy, degraded, down, latency_sum)
);

-- == toolsets ==

-- One MCP endpoint over several servers of a workspace (gateway/toolsets). Members are kept in
-- order: when two expose the same tool name, the first one's tool wins.
CREATE TABLE toolsets (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name          text NOT NULL,
    description   text NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT toolsets_workspace_id_name_key UNIQUE (workspace_id, name)
);
CREATE TRIGGER toolsets_invalidate AFTER INSERT OR UPDATE OR DELETE ON toolsets
    FOR EACH ROW EXECUTE FUNCTION notify_invalidate('id');

-- A deleted server leaves its toolsets (the cascade), which its trigger tells every process.
CREATE TABLE toolset_servers (
    toolset_id  uuid NOT NULL REFERENCES toolsets (id) ON DELETE CASCADE,
    server_id   uuid NOT NULL REFERENCES servers (id) ON DELETE CASCADE,
    position    integer NOT NULL,
    tools       text[],  -- tool name globs (* and ?); null: every tool
    prefix      text,    -- null: the server's name in [a-z0-9_] and '__'; '': none
    PRIMARY KEY (toolset_id, server_id)
);
CREATE INDEX toolset_servers_server_idx ON toolset_servers (server_id);
CREATE TRIGGER toolset_servers_invalidate AFTER INSERT OR UPDATE OR DELETE ON toolset_servers
    FOR EACH ROW EXECUTE FUNCTION notify_invalidate('toolset_id');

-- == tool calls ==

-- Latency histogram buckets (gateway/histograms.py has the Python twin and the inverse): integer
-- milliseconds below 50 get a bucket each; from 50 up, bucket widths grow by a factor 1.02, so a
-- value read back from a bucket is within 1% of any duration that fell into it.
-- Not STRICT (null still gives null): only then does PostgreSQL inline it into the calling
-- query instead of calling a SQL function per row (about ten times cheaper on 10M rows).
CREATE FUNCTION latency_bucket(duration_ms bigint) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN duration_ms < 50 THEN greatest(duration_ms, 0)::integer
                ELSE 50 + floor(ln(duration_ms::float8 / 50) / ln(1.02::float8))::integer END;

-- A histogram is a dense integer[]: element i (1-based) counts the durations in bucket i - 1.
-- Arrays only reach the highest bucket seen, so the sum pads the shorter one with zeros.
CREATE FUNCTION histogram_add(a integer[], b integer[]) RETURNS integer[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN a IS NULL OR cardinality(a) = 0 THEN b
                WHEN b IS NULL OR cardinality(b) = 0 THEN a
                ELSE (SELECT array_agg(coalesce(x, 0) + coalesce(y, 0) ORDER BY i)
                      FROM unnest(a, b) WITH ORDINALITY AS t (x, y, i)) END;

-- histogram_sum(latency_histogram): the merged histogram of many rollup rows.
CREATE AGGREGATE histogram_sum(integer[]) (
    SFUNC = histogram_add, STYPE = integer[], COMBINEFUNC = histogram_add, PARALLEL = SAFE
);

-- a minus b, without trailing zeros ('{}' when nothing is left): what a histogram is once the
-- durations counted in b are taken out of it (a server's calls out of its workspace's).
CREATE FUNCTION histogram_subtract(a integer[], b integer[]) RETURNS integer[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (WITH d AS (SELECT i, coalesce(x, 0) - coalesce(y, 0) AS n
                       FROM unnest(a, b) WITH ORDINALITY AS t (x, y, i))
            SELECT coalesce(array_agg(n ORDER BY i), '{}') FROM d
            WHERE i <= (SELECT max(i) FROM d WHERE n <> 0));

-- A histogram from parallel arrays of bucket numbers and counts (buckets may repeat).
CREATE FUNCTION histogram_of(buckets integer[], counts bigint[]) RETURNS integer[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (SELECT array_agg(coalesce(c.n, 0)::integer ORDER BY g.i)
            FROM generate_series(0, (SELECT max(b) FROM unnest(buckets) AS b)) AS g (i)
            LEFT JOIN (SELECT b, sum(n) AS n FROM unnest(buckets, counts) AS u (b, n) GROUP BY b) AS c
                   ON c.b = g.i);

-- Written only by gateway/calllog.py, which also keeps the rollups below (tool_call_hourly,
-- tool_call_caller_hourly, latency_hourly) in step in the same transaction: anything deleting
-- from one must delete from the others (except retention, which drops whole days of calls
-- and keeps their rollups longer: see gateway/workers/retention.py).
-- ids are time-ordered (UUIDv7) so inserts append to the primary key instead of scattering.
-- No foreign keys, on purpose: a per-row check would cost a tenth of the insert. The writer
-- locks each batch's servers (FOR KEY SHARE) and skips rows whose server is gone or in another
-- workspace; deleting a server (also through its workspace) deletes its calls by trigger below.
-- One partition per UTC day (tool_calls_YYYYMMDD), made ahead and dropped when expired by
-- gateway/db/partitions.py, so that retention costs the same whatever a day held. No DEFAULT
-- partition: it would rule out DETACH PARTITION ... CONCURRENTLY.
CREATE TABLE tool_calls (
    id                 uuid NOT NULL,
    workspace_id       uuid NOT NULL,
    server_id          uuid NOT NULL,
    tool_name          text NOT NULL,
    caller_agent       text,
    status             text NOT NULL CHECK (status IN ('success', 'error')),
    duration_ms        integer,
    input_tokens       integer,
    output_tokens      integer,
    output_size_bytes  bigint,
    error_message      text,
    created_at         timestamptz NOT NULL,
    -- The toolset the call came through (gateway/toolsets); null for the per-server proxy and
    -- ingested calls. No foreign key: a deleted toolset's calls keep saying where they came from.
    toolset_id         uuid,
    -- The call's OpenTelemetry trace (32 hex digits): the gateway's span when tracing is on
    -- (gateway/ops/tracing), or what an ingesting client sent; null otherwise.
    trace_id           text CHECK (trace_id ~ '^[0-9a-f]{32}$'),
    -- A partitioned table's unique keys must hold its partition key. The ids are unique by
    -- themselves (UUIDv7 made by the gateway, never by a client); a retried batch's rows come
    -- again with the same created_at, so this still refuses them twice.
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
-- Listing is newest first, by workspace, optionally narrowed by one of these.
CREATE INDEX tool_calls_workspace_idx ON tool_calls (workspace_id, created_at DESC, id DESC);
CREATE INDEX tool_calls_server_idx ON tool_calls (server_id, created_at DESC, id DESC);
CREATE INDEX tool_calls_tool_idx ON tool_calls (workspace_id, tool_name, created_at DESC, id DESC);
CREATE INDEX tool_calls_caller_idx ON tool_calls (workspace_id, caller_agent, created_at DESC, id DESC)
    WHERE caller_agent IS NOT NULL;
CREATE INDEX tool_calls_errors_idx ON tool_calls (workspace_id, created_at DESC, id DESC)
    WHERE status = 'error';
-- The log's "refused" filter: refusals are few beside the calls, and the rollups do not
-- count them, so its list and its exact total come from here.
CREATE INDEX tool_calls_refused_idx ON tool_calls (workspace_id, created_at DESC, id DESC)
    WHERE status = 'error' AND error_message LIKE 'refused:%';
-- The log's toolset filter: only the calls that came through a toolset.
CREATE INDEX tool_calls_toolset_idx ON tool_calls (workspace_id, toolset_id, created_at DESC, id DESC)
    WHERE toolset_id IS NOT NULL;

-- What the foreign key's cascade would do. The writer's FOR KEY SHARE lock makes a delete wait
-- for a batch in flight, so the batch's rows are committed, and deleted here, before it ends.
CREATE FUNCTION delete_server_calls() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM tool_calls WHERE server_id = OLD.id;
    RETURN OLD;
END $$;
CREATE TRIGGER servers_delete_calls AFTER DELETE ON servers
    FOR EACH ROW EXECUTE FUNCTION delete_server_calls();

-- Hourly rollups (hour in UTC) for analytics, alerts and exact list totals. Kept longer than
-- the raw calls (GATEWAY_ROLLUP_RETENTION_DAYS), so analytics outlive them.
-- toolset_id is a dimension of the key, as in tool_calls: null for calls that came through no
-- toolset, whose counts share one row per key (NULLS NOT DISTINCT, PostgreSQL 15). A key with
-- a null cannot be a primary key, hence a unique constraint (the upserts' arbiter).
CREATE TABLE tool_call_hourly (
    workspace_id       uuid NOT NULL,  -- deleted with its servers, as in tool_calls
    server_id          uuid NOT NULL REFERENCES servers (id) ON DELETE CASCADE,
    tool_name          text NOT NULL,
    hour               timestamptz NOT NULL,
    call_count         bigint NOT NULL,
    error_count        bigint NOT NULL,
    -- Calls that reported a duration (ingested calls may not), and the sum of their durations.
    duration_count     bigint NOT NULL,
    duration_sum_ms    bigint NOT NULL,
    latency_histogram  integer[] NOT NULL,
    -- No foreign key, as in tool_calls: a deleted toolset's calls still count where they went.
    toolset_id         uuid,
    CONSTRAINT tool_call_hourly_key
        UNIQUE NULLS NOT DISTINCT (workspace_id, tool_name, server_id, hour, toolset_id)
);
-- Covering: analytics and list totals sum the counters of a workspace's hours from the index
-- alone (30 days of 50 tools is ~35,000 rows; ~5 ms instead of ~30 ms through the heap), also
-- those of one toolset (toolset_id is checked in the index too).
CREATE INDEX tool_call_hourly_hour_idx ON tool_call_hourly (workspace_id, hour)
    INCLUDE (server_id, tool_name, call_count, error_count, duration_count, duration_sum_ms,
             toolset_id);
CREATE INDEX tool_call_hourly_server_idx ON tool_call_hourly (server_id, hour);
-- Retention deletes the oldest hours in small batches (in the three rollup tables).
CREATE INDEX tool_call_hourly_retention_idx ON tool_call_hourly (hour);

-- The same counts with the caller as a dimension (calls with a caller_agent only), so a
-- caller_agent-filtered list total is a sum over rollup rows too. Covering, like the above.
CREATE TABLE tool_call_caller_hourly (
    workspace_id  uuid NOT NULL,  -- deleted with its servers, as in tool_calls
    caller_agent  text NOT NULL,
    tool_name     text NOT NULL,
    server_id     uuid NOT NULL REFERENCES servers (id) ON DELETE CASCADE,
    hour          timestamptz NOT NULL,
    call_count    bigint NOT NULL,
    error_count   bigint NOT NULL,
    toolset_id    uuid,  -- as in tool_call_hourly
    CONSTRAINT tool_call_caller_hourly_key
        UNIQUE NULLS NOT DISTINCT (workspace_id, caller_agent, tool_name, server_id, hour, toolset_id)
        INCLUDE (call_count, error_count)
);
CREATE INDEX tool_call_caller_hourly_server_idx ON tool_call_caller_hourly (server_id);
CREATE INDEX tool_call_caller_hourly_retention_idx ON tool_call_caller_hourly (hour);

-- The merged latency histogram of each hour per scope: a whole workspace (scope =
-- workspace_id: all its servers), each server (scope = the server's id) and each toolset
-- (scope = the toolset's id: the calls that came through it), only for hours with timed calls.
-- The writer adds each batch's durations in the batch's transaction, so a latency series reads
-- at most days * 24 rows instead of merging the histograms of every tool.
-- Invariant: a workspace's histogram of an hour is the sum of its servers' histograms, and a
-- toolset's is the sum of its calls' histograms in tool_call_hourly.
CREATE TABLE latency_hourly (
    scope              uuid NOT NULL,
    workspace_id       uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    hour               timestamptz NOT NULL,
    latency_histogram  integer[] NOT NULL,
    PRIMARY KEY (scope, hour)
);
CREATE INDEX latency_hourly_workspace_idx ON latency_hourly (workspace_id);
CREATE INDEX latency_hourly_retention_idx ON latency_hourly (hour);

-- A deleted server's durations leave the histograms of its workspace and of each toolset its
-- calls came through (hours left without any are deleted), and its own rows go: the workspace
-- and the toolsets read exactly as if the calls had never been made. BEFORE the delete, so the
-- toolsets' part can still be read from the server's tool_call_hourly rows (their cascade
-- comes after); the delete has locked the server's row by then, so no batch of its calls is in
-- flight (writers hold it FOR KEY SHARE until they commit). The rows to change are locked in
-- (scope, hour) order first, the order in which call log writers upsert them, so a delete and
-- a batch in flight cannot deadlock.
CREATE FUNCTION delete_server_latency() RETURNS trigger
    LANGUAGE plpgsql AS $$
DECLARE
    scopes uuid[];
BEGIN
    -- Deleted with its workspace (by its cascade), whose latency rows all go anyway.
    IF NOT EXISTS (SELECT FROM workspaces WHERE id = OLD.workspace_id) THEN
        RETURN OLD;
    END IF;
    -- The scopes whose histograms hold the server's durations, besides its own.
    scopes := array_prepend(OLD.workspace_id, ARRAY(
        SELECT DISTINCT toolset_id FROM tool_call_hourly
        WHERE server_id = OLD.id AND toolset_id IS NOT NULL));
    PERFORM FROM latency_hourly AS l
    JOIN (SELECT OLD.workspace_id AS scope, hour FROM latency_hourly WHERE scope = OLD.id
          UNION
          SELECT toolset_id, hour FROM tool_call_hourly
          WHERE server_id = OLD.id AND toolset_id IS NOT NULL) AS p
      ON l.scope = p.scope AND l.hour = p.hour
    WHERE l.workspace_id = OLD.workspace_id
    ORDER BY l.scope, l.hour
    FOR UPDATE OF l;
    UPDATE latency_hourly AS l
    SET latency_histogram = histogram_subtract(l.latency_histogram, p.histogram)
    FROM (SELECT OLD.workspace_id AS scope, hour, latency_histogram AS histogram
          FROM latency_hourly WHERE scope = OLD.id
          UNION ALL
          SELECT toolset_id, hour, histogram_sum(latency_histogram)
          FROM tool_call_hourly
          WHERE server_id = OLD.id AND toolset_id IS NOT NULL
          GROUP BY toolset_id, hour) AS p
    WHERE l.scope = p.scope AND l.hour = p.hour AND l.workspace_id = OLD.workspace_id;
    DELETE FROM latency_hourly
    WHERE scope = ANY(scopes) AND cardinality(latency_histogram) = 0;
    DELETE FROM latency_hourly WHERE scope = OLD.id;
    RETURN OLD;
END $$;
CREATE TRIGGER servers_delete_latency BEFORE DELETE ON servers
    FOR EACH ROW EXECUTE FUNCTION delete_server_latency();

-- == alerts ==

CREATE TABLE alert_rules (
    id                 uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    workspace_id       uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    -- null: every server of the workspace, each evaluated on its own.
    server_id          uuid REFERENCES servers (id) ON DELETE CASCADE,
    name               text NOT NULL,
    metric             text NOT NULL CHECK (metric IN ('error_rate', 'avg_latency_ms',
                           'p95_latency_ms', 'call_count', 'server_down', 'tool_changes')),
    operator           text NOT NULL CHECK (operator IN ('>', '>=', '<', '<=', '==')),
    threshold          double precision NOT NULL,
    window_minutes     integer NOT NULL CHECK (window_minutes BETWEEN 1 AND 1440),
    slack_webhook_url  text,
    webhook_url        text,
    enabled            boolean NOT NULL DEFAULT true,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    -- The evaluator claims rules whose time has come (FOR UPDATE SKIP LOCKED) and moves this
    -- forward by one interval, so with several gateway processes a rule is evaluated once.
    next_eval_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX alert_rules_workspace_idx ON alert_rules (workspace_id, created_at);
CREATE INDEX alert_rules_server_idx ON alert_rules (server_id) WHERE server_id IS NOT NULL;
CREATE INDEX alert_rules_due_idx ON alert_rules (next_eval_at) WHERE enabled;

-- An incident is a FIRING event; it is open while resolved_at is null. Resolving it sets
-- resolved_at and adds a RESOLVED event carrying the incident's fired_at.
CREATE TABLE alert_events (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    rule_id       uuid NOT NULL REFERENCES alert_rules (id) ON DELETE CASCADE,
    server_id     uuid NOT NULL REFERENCES servers (id) ON DELETE CASCADE,
    event_type    text NOT NULL CHECK (event_type IN ('FIRING', 'RESOLVED')),
    metric_value  double precision NOT NULL,
    fired_at      timestamptz NOT NULL,
    resolved_at   timestamptz,
    -- When the event happened (fired_at of a FIRING, resolved_at of a RESOLVED): list order.
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT alert_events_resolved_has_time
        CHECK (event_type = 'FIRING' OR resolved_at IS NOT NULL)
);
-- The guard behind "at most one open incident per (rule, server)", whichever process fires.
CREATE UNIQUE INDEX alert_events_open_idx ON alert_events (rule_id, server_id)
    WHERE event_type = 'FIRING' AND resolved_at IS NULL;
CREATE INDEX alert_events_workspace_idx ON alert_events (workspace_id, created_at DESC, id DESC);
CREATE INDEX alert_events_rule_idx ON alert_events (rule_id, created_at DESC);
CREATE INDEX alert_events_server_idx ON alert_events (server_id, created_at DESC);
-- Retention deletes the oldest events in small batches.
CREATE INDEX alert_events_retention_idx ON alert_events (created_at);

-- The notification outbox: written in the event's transaction, sent by workers/notifier.py.
-- url and payload are fixed when the event happens, so a later edit of the rule does not
-- change what an already-queued notification says or where it goes.
CREATE TABLE alert_deliveries (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    event_id         uuid NOT NULL REFERENCES alert_events (id) ON DELETE CASCADE,
    -- The notifier shares its sending slots between workspaces (one tenant's dead webhooks
    -- cannot delay another's alerts).
    workspace_id     uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    -- Copies of the event's, so keeping one incident's notifications in order is one index range.
    rule_id          uuid NOT NULL,
    server_id        uuid NOT NULL,
    target           text NOT NULL CHECK (target IN ('webhook', 'slack')),
    url              text NOT NULL,
    payload          jsonb NOT NULL,
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'delivered', 'failed')),
    attempt_count    integer NOT NULL DEFAULT 0,
    -- While pending: when the notifier may (re)try. A claim pushes it past the send timeout,
    -- so a process that dies mid-send leaves the row to be retried, not lost.
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz
);
CREATE INDEX alert_deliveries_event_idx ON alert_deliveries (event_id);
CREATE INDEX alert_deliveries_due_idx
    ON alert_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX alert_deliveries_incident_idx
    ON alert_deliveries (rule_id, server_id, target, created_at) WHERE status = 'pending';
CREATE INDEX alert_deliveries_workspace_due_idx
    ON alert_deliveries (workspace_id, next_attempt_at) WHERE status = 'pending';

-- Every attempt to send a notification, so a user can see why one did not arrive.
CREATE TABLE alert_delivery_attempts (
    delivery_id   uuid NOT NULL REFERENCES alert_deliveries (id) ON DELETE CASCADE,
    attempt       integer NOT NULL,
    attempted_at  timestamptz NOT NULL,
    duration_ms   double precision NOT NULL,
    -- The HTTP status when the receiver answered, else null and error says what failed.
    status_code   integer,
    error         text,
    PRIMARY KEY (delivery_id, attempt)
);

-- Login and signup attempts, shared by every gateway process when there is no Redis
-- (gateway/db/rate_limits.py): one row per attempt, for the rate's window. UNLOGGED: no WAL
-- for a flood of attempts; a crash of PostgreSQL empties it, which only resets the windows.
CREATE UNLOGGED TABLE rate_limit_hits (
    key         text NOT NULL,  -- "LIMITS/auth/ip:..." or ".../email:..."
    at          timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX rate_limit_hits_key_idx ON rate_limit_hits (key, at);
-- The retention loop's sweep of keys nobody tried again.
CREATE INDEX rate_limit_hits_expiry_idx ON rate_limit_hits (expires_at);

-- Rate limits' budgets when there is no Redis (gateway/db/call_budgets.py): per limit and
-- window, the calls processes have taken leases on. UNLOGGED: a crash of PostgreSQL only
-- starts the current windows afresh.
CREATE UNLOGGED TABLE call_budgets (
    subject       text NOT NULL,  -- "key:<id>:<unit>" or "server:<id>:<unit>"
    window_start  timestamptz NOT NULL,
    used          integer NOT NULL,
    granted       integer NOT NULL,  -- what the latest take added (see db/call_budgets)
    expires_at    timestamptz NOT NULL,
    PRIMARY KEY (subject, window_start)
);
CREATE INDEX call_budgets_expiry_idx ON call_budgets (expires_at);

-- Tasks that proxied tools/calls turned into (the MCP tasks extension: the server answered the
-- call with a task handle, and the client polls tasks/get), followed until the reply that ends
-- one passes through any gateway process: then, or once expires_at has passed, the call
-- becomes its row of tool_calls (gateway/proxy/tasks.py). Nothing per ordinary call: a row is
-- written only when a call became a task, and a reply that ends one deletes it.
CREATE TABLE pending_tasks (
    server_id     uuid NOT NULL REFERENCES servers (id) ON DELETE CASCADE,
    task_id       text NOT NULL,  -- the server's, unique per server
    workspace_id  uuid NOT NULL,  -- the server's (deleted with it)
    tool_name     text NOT NULL,
    caller_agent  text,
    started_at    timestamptz NOT NULL,  -- when the tools/call reached the gateway
    expires_at    timestamptz NOT NULL,
    -- The toolset the tools/call came through (null: the server's own proxy URL), for the
    -- call's row; a toolset routes requests about the task to the member found here. No
    -- foreign key: a deleted toolset's call keeps its id, as in tool_calls.
    toolset_id    uuid,
    PRIMARY KEY (server_id, task_id)
);
-- A workspace follows a bounded number of tasks at once (counted here).
CREATE INDEX pending_tasks_workspace_idx ON pending_tasks (workspace_id);
-- The retention loop's sweep of tasks whose end never passed.
CREATE INDEX pending_tasks_expiry_idx ON pending_tasks (expires_at);

-- == OAuth 2.1 for MCP clients ==

-- The gateway is the authorization server for its own accounts (gateway/oauth). A client is
-- either registered here (RFC 7591, public clients: client_id is ours) or known by its client
-- ID metadata document (client_id is the document's https URL; the row caches the document).
CREATE TABLE oauth_clients (
    client_id      text PRIMARY KEY,
    client_name    text NOT NULL,
    redirect_uris  text[] NOT NULL,
    metadata       jsonb NOT NULL,   -- as registered, or the document as fetched
    registered     boolean NOT NULL, -- false: a metadata document, fetched again when stale
    created_at     timestamptz NOT NULL DEFAULT now(),
    fetched_at     timestamptz
);

-- What a member consented to: one client's access to one MCP URL (a server's proxy URL or a
-- toolset's) of one workspace, acting as that member. Made when its authorization code is
-- exchanged; deleting it (revocation in the dashboard or at /oauth/revoke, a refresh token
-- presented twice, the member leaving) ends its tokens at once in every process (NOTIFY).
CREATE TABLE oauth_grants (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    workspace_id  uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    user_id       uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    client_id     text NOT NULL REFERENCES oauth_clients (client_id) ON DELETE CASCADE,
    client_name   text NOT NULL,  -- as consented to; the call log's caller_agent
    resource      text NOT NULL,  -- the MCP URL (RFC 8707): its tokens are good there only
    server_id     uuid REFERENCES servers (id) ON DELETE CASCADE,
    toolset_id    uuid REFERENCES toolsets (id) ON DELETE CASCADE,
    scope         text NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz,    -- written in batches, not per call
    CHECK ((server_id IS NULL) <> (toolset_id IS NULL))
);
CREATE INDEX oauth_grants_member_idx ON oauth_grants (workspace_id, user_id);
CREATE INDEX oauth_grants_client_idx ON oauth_grants (client_id);
CREATE INDEX oauth_grants_server_idx ON oauth_grants (server_id);
CREATE INDEX oauth_grants_toolset_idx ON oauth_grants (toolset_id);
-- Not on UPDATE: last_used_at changes all the time and means nothing to a cache.
CREATE TRIGGER oauth_grants_invalidate AFTER DELETE ON oauth_grants
    FOR EACH ROW EXECUTE FUNCTION notify_invalidate('id');

-- A member who leaves a workspace (or is removed) takes their grants there with them.
CREATE FUNCTION memberships_end_grants() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM oauth_grants WHERE workspace_id = OLD.workspace_id AND user_id = OLD.user_id;
    RETURN NULL;
END $$;
CREATE TRIGGER memberships_end_grants AFTER DELETE ON memberships
    FOR EACH ROW EXECUTE FUNCTION memberships_end_grants();

-- Authorization codes: single use and short-lived; only their hash is kept. A code presented
-- a second time ends the grant it was exchanged for (RFC 9700 4.5: a stolen code).
CREATE TABLE oauth_codes (
    code_hash       text PRIMARY KEY,
    client_id       text NOT NULL REFERENCES oauth_clients (client_id) ON DELETE CASCADE,
    workspace_id    uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    user_id         uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    resource        text NOT NULL,
    server_id       uuid REFERENCES servers (id) ON DELETE CASCADE,
    toolset_id      uuid REFERENCES toolsets (id) ON DELETE CASCADE,
    redirect_uri    text NOT NULL,
    scope           text NOT NULL DEFAULT '',
    code_challenge  text NOT NULL,  -- PKCE, S256 only
    expires_at      timestamptz NOT NULL,
    used_at         timestamptz,
    grant_id        uuid REFERENCES oauth_grants (id) ON DELETE SET NULL  -- once exchanged
);
CREATE INDEX oauth_codes_expiry_idx ON oauth_codes (expires_at);

-- Refresh tokens, rotated on every use; only their hash is kept. One presented after it was
-- rotated (a copy, used by someone) ends its grant (RFC 9700 4.14.2).
CREATE TABLE oauth_refresh_tokens (
    token_hash  text PRIMARY KEY,
    grant_id    uuid NOT NULL REFERENCES oauth_grants (id) ON DELETE CASCADE,
    expires_at  timestamptz NOT NULL,
    rotated_at  timestamptz
);
CREATE INDEX oauth_refresh_tokens_grant_idx ON oauth_refresh_tokens (grant_id);
CREATE INDEX oauth_refresh_tokens_expiry_idx ON oauth_refresh_tokens (expires_at);

INSERT INTO schema_version (version) VALUES (15);
