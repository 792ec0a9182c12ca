-- Reverts 000003_lease_fillfactor (PostgreSQL): pages of the leases table
-- fill up again; nothing else changes.
ALTER TABLE outbox_leases RESET (fillfactor);
