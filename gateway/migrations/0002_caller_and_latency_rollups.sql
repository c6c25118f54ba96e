-- 0002: rollups per caller and latency histograms per workspace and server, in place of stored
-- percentiles (tool_call_latency_hourly). The new tables are derived data: they are filled here
-- from what the database already holds, as `mcp-gateway rollups rebuild` would.

DROP TABLE tool_call_latency_hourly;

CREATE FUNCTION histogram_subtract(a integer[], b integer[]) RETURNS integer[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (WITH d AS (SELECT i, coalesce(x, 0) - coalesce(y, 0) AS n
                       FROM unnest(a, b) WITH ORDINALITY AS t (x, y, i))
            SELECT coalesce(array_agg(n ORDER BY i), '{}') FROM d
            WHERE i <= (SELECT max(i) FROM d WHERE n <> 0));

CREATE TABLE tool_call_caller_hourly (
    workspace_id  uuid NOT NULL,  -- deleted with its servers, as in tool_calls
    caller_agent  text NOT NULL,
    tool_name     text NOT NULL,
    server_id     uuid NOT NULL REFERENCES servers (id) ON DELETE CASCADE,
    hour          timestamptz NOT NULL,
    call_count    bigint NOT NULL,
    error_count   bigint NOT NULL,
    PRIMARY KEY (workspace_id, caller_agent, tool_name, server_id, hour)
        INCLUDE (call_count, error_count)
);
CREATE INDEX tool_call_caller_hourly_server_idx ON tool_call_caller_hourly (server_id);

CREATE TABLE latency_hourly (
    scope              uuid NOT NULL,
    workspace_id       uuid NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    hour               timestamptz NOT NULL,
    latency_histogram  integer[] NOT NULL,
    PRIMARY KEY (scope, hour)
);
CREATE INDEX latency_hourly_workspace_idx ON latency_hourly (workspace_id);

CREATE FUNCTION delete_server_latency() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM FROM latency_hourly AS w
    WHERE w.scope = OLD.workspace_id
      AND w.hour IN (SELECT hour FROM latency_hourly WHERE scope = OLD.id)
    ORDER BY w.hour
    FOR UPDATE;
    UPDATE latency_hourly AS w
    SET latency_histogram = histogram_subtract(w.latency_histogram, s.latency_histogram)
    FROM latency_hourly AS s
    WHERE s.scope = OLD.id AND w.scope = OLD.workspace_id AND w.hour = s.hour;
    DELETE FROM latency_hourly
    WHERE scope = OLD.workspace_id AND cardinality(latency_histogram) = 0;
    DELETE FROM latency_hourly WHERE scope = OLD.id;
    RETURN OLD;
END $$;
CREATE TRIGGER servers_delete_latency AFTER DELETE ON servers
    FOR EACH ROW EXECUTE FUNCTION delete_server_latency();

INSERT INTO tool_call_caller_hourly (workspace_id, caller_agent, tool_name, server_id, hour,
                                     call_count, error_count)
SELECT workspace_id, caller_agent, tool_name, server_id,
       date_bin('1 hour', created_at, '2000-01-01 00:00:00+00'),
       count(*), count(*) FILTER (WHERE status = 'error')
FROM tool_calls
WHERE caller_agent IS NOT NULL
GROUP BY 1, 2, 3, 4, 5;

-- A scope's histogram of an hour is the sum of its tools' histograms in tool_call_hourly.
INSERT INTO latency_hourly (scope, workspace_id, hour, latency_histogram)
SELECT workspace_id, workspace_id, hour, histogram_sum(latency_histogram)
FROM tool_call_hourly
WHERE duration_count > 0
GROUP BY workspace_id, hour
UNION ALL
SELECT server_id, workspace_id, hour, histogram_sum(latency_histogram)
FROM tool_call_hourly
WHERE duration_count > 0
GROUP BY server_id, workspace_id, hour;
