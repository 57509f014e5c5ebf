"""The session service: owner of the aggregates (project, agent, session, ...), the single
writer of their events, and host of the projector that keeps Postgres up to date."""
