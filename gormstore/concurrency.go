package gormstore

import "github.com/gorm-outbox/outbox/relay"

var _ relay.ConcurrentStore = (*Store)(nil)

// ConcurrentBuckets implements relay.ConcurrentStore: on PostgreSQL and
// MySQL/MariaDB a relay may serve several buckets at once (up to
// relay.Options.MaxConcurrentBuckets), each with its own statements on the
// pool's connections; the store's shared state (dialect, seeding, pruning,
// the latest clock reading) is under its mutex. Not on SQLite, whose single
// writer turns the overlap into lock waits.
func (s *Store) ConcurrentBuckets() bool { return s.db.Dialector.Name() != "sqlite" }

var _ relay.ByteBoundedFetcher = (*Store)(nil)
