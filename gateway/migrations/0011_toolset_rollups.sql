-- Version 11: the toolset a call came through (tool_calls.toolset_id, version 10) becomes a
-- dimension of the hourly rollups, so analytics and list totals can be narrowed to a toolset:
-- a column of tool_call_hourly and tool_call_caller_hourly, part of their unique keys (a null,
-- no toolset, counts as one value: NULLS NOT DISTINCT, PostgreSQL 15 or later), and a third
-- kind of latency_hourly scope, the toolset's id.
--
-- Nothing has written a toolset_id yet (the call log writes the column from this version on),
-- so every rollup row already stored is one of calls without a toolset: null is right for all.
-- Adding the columns rewrites nothing; the new keys and the covering index are built from the
-- rollup rows (a few per tool and hour), and the partial index of tool_calls reads each day's
-- partition once and holds nothing yet. Writers of the call log wait meanwhile (their calls
-- stay queued in memory).

ALTER TABLE tool_call_hourly ADD COLUMN toolset_id uuid;
ALTER TABLE tool_call_hourly
    DROP CONSTRAINT tool_call_hourly_pkey,
    ADD CONSTRAINT tool_call_hourly_key
        UNIQUE NULLS NOT DISTINCT (workspace_id, tool_name, server_id, hour, toolset_id);
DROP INDEX tool_call_hourly_hour_idx;
CREATE INDEX tool_call_hourly_hour_idx ON tool_call_hourly (workspace_id, hour)
    INCLUDE (server_id, tool_name, call_count, error_count, duration_count, duration_sum_ms,
             toolset_id);

ALTER TABLE tool_call_caller_hourly ADD COLUMN toolset_id uuid;
ALTER TABLE tool_call_caller_hourly
    DROP CONSTRAINT tool_call_caller_hourly_pkey,
    ADD CONSTRAINT tool_call_caller_hourly_key
        UNIQUE NULLS NOT DISTINCT (workspace_id, caller_agent, tool_name, server_id, hour, toolset_id)
        INCLUDE (call_count, error_count);

CREATE INDEX tool_calls_toolset_idx ON tool_calls (workspace_id, toolset_id, created_at DESC, id DESC)
    WHERE toolset_id IS NOT NULL;

-- A deleted server's durations also leave its toolsets' histograms, which are read from its
-- tool_call_hourly rows: the trigger now runs before the delete (and its cascade).
DROP TRIGGER servers_delete_latency ON servers;
CREATE OR REPLACE FUNCTION delete_server_latency() RETURNS trigger
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
