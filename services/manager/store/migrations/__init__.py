"""Alembic migrations of the manager's store (run by ``services.manager.store.migrate``)."""
