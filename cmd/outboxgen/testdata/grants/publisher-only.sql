GRANT USAGE ON SCHEMA "public" TO "app";
GRANT INSERT, DELETE, SELECT (id, queue, timer_id, acquired_token) ON "public"."outbox" TO "app";
