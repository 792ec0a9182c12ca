// Package relay publishes committed outbox rows to Kafka.
//
// A Relay owns a fair share of the outbox's buckets through leases kept in
// the Store, reads each owned bucket's rows oldest first, hands them to a
// Publisher (NewKafkaPublisher: kafka-go with acks=all) and deletes only the
// contiguous prefix the broker acknowledged. Several relays, in one process
// or many, share the work; a relay that dies or stalls loses its buckets to
// a peer when its leases expire. The engine never calls a database API: the
// Store (gormstore for GORM) does.
package relay
