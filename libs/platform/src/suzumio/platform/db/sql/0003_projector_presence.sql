-- Which projection versions a running projector can build, and when it last said so (each
-- projector, before each try at the lead). A leader leaves a projection that a later release
-- built to that release while one is around, and builds it down to its own version once none
-- has been seen for a while: the later release was rolled back.
CREATE TABLE suzumio.projector_presence (
    name    text NOT NULL,
    version integer NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);
