-- Whether a projection's tables are maintained right now. A projection being rebuilt (its
-- code version changed) or no longer registered stands still; read-your-writes waits only on
-- those that move.
ALTER TABLE suzumio.projection_checkpoints ADD COLUMN serving boolean NOT NULL DEFAULT false;
UPDATE suzumio.projection_checkpoints SET serving = (version > 0);
