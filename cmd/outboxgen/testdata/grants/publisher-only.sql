GRANT USAGE ON SCHEMA "public" TO "app";
GRANT INSERT, DELETE, SELECT (id, queue, timer_id, acquired_token) ON "public"."outbox" TO "app";
GRANT INSERT (queue, payload, headers, ordering_key, created_at, next_attempt_at), SELECT (id) ON "public"."outbox_ring" TO "app";
GRANT USAGE ON SEQUENCE "public"."outbox_id_seq" TO "app";
GRANT SELECT ON SEQUENCE "public"."outbox_ring_slot", "public"."outbox_sleep_horizon" TO "app";
GRANT EXECUTE ON FUNCTION "public"."outbox_ring_slot_now"() TO "app";
