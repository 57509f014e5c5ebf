"""Sandbox backends behind one interface (`base.Backend`)."""
