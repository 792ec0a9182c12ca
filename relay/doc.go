// Package relay publishes committed outbox rows through a Publisher: the
// engine of the outbox, which calls no database API and imports no Kafka
// library.
//
// A Relay owns a fair share of the outbox's buckets through leases kept in
// the Store, reads each owned bucket's rows oldest first, hands them to a
// Publisher (kafkapub.New: kafka-go with acks=all) and deletes only the
// contiguous prefix the broker acknowledged. Several relays, in one process
// or many, share the work; a relay that dies or stalls loses its buckets to
// a peer when its leases expire. The engine never calls a database API: the
// Store (gormstore for GORM) does. Nor does it read a broker's errors: the
// Publisher classifies them into the sentinels the engine acts on
// (ErrUnpublishable, ErrFenced, ErrPublisherAuth).
//
// Hot path: a relay renews its leases on its own timer while it works, so
// no amount of work lets a healthy relay's leases lapse; it serves up to
// Options.MaxConcurrentBuckets buckets at once when the store says it gains
// from it (Store.ConcurrentBuckets; each bucket with at most one batch in flight, in order,
// under the same lease checks); and it bounds each batch in bytes
// (Options.MaxBatchBytes) as well as rows.
package relay
