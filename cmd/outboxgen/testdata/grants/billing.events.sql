GRANT USAGE ON SCHEMA "billing" TO "App Role";
GRANT INSERT, DELETE, SELECT (id, queue, timer_id, acquired_token) ON "billing"."events" TO "App Role";
GRANT USAGE ON SCHEMA "billing" TO "wor""ker";
GRANT SELECT, INSERT, UPDATE, DELETE ON "billing"."events" TO "wor""ker";
GRANT SELECT, INSERT, UPDATE, DELETE ON "billing"."events_dlq" TO "wor""ker";
GRANT SELECT, INSERT, UPDATE, DELETE ON "billing"."events_sleepers", "billing"."events_locks" TO "wor""ker";
GRANT SELECT ON "billing"."events_handoff" TO "wor""ker";
GRANT EXECUTE ON FUNCTION "billing"."events_hand_off"(text[], integer) TO "wor""ker";
