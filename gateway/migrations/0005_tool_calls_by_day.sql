-- Version 5: tool_calls partitioned by UTC day, so retention drops whole days (the same cost
-- whatever a day held, nobody blocked); indexes by age for the batched retention deletes of
-- the rollups and of alert events.
--
-- The table as it was is not rewritten (at hundreds of millions of rows that would take
-- hours): it becomes the first partition, tool_calls_before_YYYYMMDD, holding everything
-- before the UTC day after its newest call (tomorrow at the earliest), and is dropped whole
-- once that day has left the retention. Paid once, while writers wait (the call log queues
-- their calls; readers of the other tables go on): one scan for the newest call, one for
-- ATTACH to check the bound, and building the new key (id, created_at). The days after it get
-- their partitions from gateway/db/partitions.py as soon as the migration commits.

ALTER TABLE tool_calls RENAME TO tool_calls_old;
ALTER TABLE tool_calls_old DROP CONSTRAINT tool_calls_pkey;
-- Out of the way while the new table's check gets its usual name; ATTACH wants it back.
ALTER TABLE tool_calls_old RENAME CONSTRAINT tool_calls_status_check TO tool_calls_old_status_check;
-- Kept and taken over by the partitioned table's indexes at ATTACH (same definitions).
ALTER INDEX tool_calls_workspace_idx RENAME TO tool_calls_old_workspace_idx;
ALTER INDEX tool_calls_server_idx RENAME TO tool_calls_old_server_idx;
ALTER INDEX tool_calls_tool_idx RENAME TO tool_calls_old_tool_idx;
ALTER INDEX tool_calls_caller_idx RENAME TO tool_calls_old_caller_idx;
ALTER INDEX tool_calls_errors_idx RENAME TO tool_calls_old_errors_idx;

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
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
CREATE INDEX tool_calls_workspace_idx ON tool_calls (workspace_id, created_at DESC, id DESC);
CREATE INDEX tool_calls_server_idx ON tool_calls (server_id, created_at DESC, id DESC);
CREATE INDEX tool_calls_tool_idx ON tool_calls (workspace_id, tool_name, created_at DESC, id DESC);
CREATE INDEX tool_calls_caller_idx ON tool_calls (workspace_id, caller_agent, created_at DESC, id DESC)
    WHERE caller_agent IS NOT NULL;
CREATE INDEX tool_calls_errors_idx ON tool_calls (workspace_id, created_at DESC, id DESC)
    WHERE status = 'error';

ALTER TABLE tool_calls_old RENAME CONSTRAINT tool_calls_old_status_check TO tool_calls_status_check;

DO $$
DECLARE
    bound date;
BEGIN
    IF NOT EXISTS (SELECT FROM tool_calls_old) THEN
        DROP TABLE tool_calls_old;
        RETURN;
    END IF;
    SELECT greatest((now() AT TIME ZONE 'UTC')::date, max(created_at AT TIME ZONE 'UTC')::date) + 1
    INTO bound
    FROM tool_calls_old;
    EXECUTE format(
        'ALTER TABLE tool_calls ATTACH PARTITION tool_calls_old FOR VALUES FROM (MINVALUE) TO (%L)',
        bound::text || ' 00:00:00+00'
    );
    EXECUTE format('ALTER TABLE tool_calls_old RENAME TO %I',
                   'tool_calls_before_' || to_char(bound, 'YYYYMMDD'));
END $$;

CREATE INDEX tool_call_hourly_retention_idx ON tool_call_hourly (hour);
CREATE INDEX tool_call_caller_hourly_retention_idx ON tool_call_caller_hourly (hour);
CREATE INDEX latency_hourly_retention_idx ON latency_hourly (hour);
CREATE INDEX alert_events_retention_idx ON alert_events (created_at);
