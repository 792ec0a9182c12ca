-- gorm-outbox schema version 3, PostgreSQL only: the leases table leaves 60 %
-- of each page free, so that a renewal — one UPDATE of every lease a relay
-- owns — writes each new row version beside the old one (a heap-only tuple,
-- no index entry) instead of on a new page with a new index entry. At 65,536
-- buckets a renewal then takes ~0.1 s and writes ~5 MB of WAL, against
-- ~0.5 s and ~14 MB. A storage parameter only: instant, no lock beyond a
-- moment's SHARE UPDATE EXCLUSIVE, nothing rewritten; rows move to roomier
-- pages as the next renewals rewrite them. MySQL, MariaDB and SQLite stay at
-- version 2 (they update a fixed-size column in place).
ALTER TABLE outbox_leases SET (fillfactor = 40);
