// Package relay publishes committed outbox rows through a Publisher: the
// engine of the outbox, which calls no database API and imports no Kafka
// library.
//
// A Relay owns a fair share of the outbox's buckets through leases kept in
// the Store, reads each owned bucket's rows oldest first, hands them to a
// Publisher (kafkapub.New: kafka-go with acks=all) and deletes only the
// contiguous prefix the broker acknowledged. Several relays, in one process
// or many, share the work; a relay that dies or stalls loses its buckets to
// a peer when its leases expire. The Store (gormstore for GORM) does the
// SQL; the Publisher classifies the broker's errors into the sentinels the
// engine acts on (ErrUnpublishable, ErrFenced, ErrPublisherAuth).
package relay
