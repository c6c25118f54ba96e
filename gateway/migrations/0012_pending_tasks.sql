-- Version 12: the tasks proxied tools/calls turned into (2026-07-28's tasks extension), so
-- that such a call is logged once, when the reply that ends its task passes through any
-- gateway process (gateway/proxy/tasks.py). A new table: nothing existing is rewritten.
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
