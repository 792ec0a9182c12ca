// Package relay publishes committed outbox rows through a Publisher: the
// engine of the outbox, which calls no database API and imports no Kafka
// library.
//
// A Relay leases a fair share of the outbox's buckets in the Store
// (gormstore), reads each owned bucket's rows oldest first, hands them to a
// Publisher (kafkapub) and deletes only the prefix the broker acknowledged.
// Relays share the work; a relay that dies or stalls loses its buckets to a
// peer when its leases expire.
package relay
