GRANT USAGE ON SCHEMA "public" TO "app";
GRANT INSERT, DELETE, SELECT (id, queue, timer_id, acquired_token) ON "public"."outbox" TO "app";
GRANT USAGE ON SCHEMA "public" TO "worker";
GRANT SELECT, INSERT, UPDATE, DELETE ON "public"."outbox" TO "worker";
GRANT SELECT, INSERT, UPDATE, DELETE ON "public"."outbox_dlq" TO "worker";
GRANT SELECT, INSERT, UPDATE, DELETE ON "public"."outbox_sleepers", "public"."outbox_locks" TO "worker";
GRANT SELECT ON "public"."outbox_handoff" TO "worker";
GRANT EXECUTE ON FUNCTION "public"."outbox_hand_off"(text[], integer) TO "worker";
