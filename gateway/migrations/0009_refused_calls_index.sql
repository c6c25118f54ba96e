-- Version 9: an index of refused tool calls (status error, error_message 'refused:...'), for
-- GET /tool-calls?refused=true and its exact total, which the hourly rollups cannot give.
-- Made on the partitioned table, so on every day's partition and on those made later. It
-- holds only the refusals, so building it reads each partition once and writes little; the
-- call log queues calls while it does.
CREATE INDEX tool_calls_refused_idx ON tool_calls (workspace_id, created_at DESC, id DESC)
    WHERE status = 'error' AND error_message LIKE 'refused:%';
