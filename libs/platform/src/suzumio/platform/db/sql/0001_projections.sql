-- Where each projection stands: the last stream sequence applied, and the projection code
-- version that built its tables. Updated in the same transaction as the projection's rows.
CREATE TABLE suzumio.projection_checkpoints (
    name        text PRIMARY KEY,
    position    bigint NOT NULL CHECK (position >= 0),
    version     integer NOT NULL,
    schema_name text NOT NULL,
    rebuilt_at  timestamptz,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
