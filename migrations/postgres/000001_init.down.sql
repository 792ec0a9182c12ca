-- Reverts 000001_init: drops the outbox tables (and every pending row).
DROP TABLE outbox_relays;
DROP TABLE outbox_leases;
DROP TABLE outbox_messages;
