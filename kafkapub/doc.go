// Package kafkapub is the Kafka publisher of the outbox relay: a
// relay.Publisher built on kafka-go, so that a relay built with
//
//	pub, err := kafkapub.New(kafkapub.Config{Brokers: brokers})
//	…
//	r, err := relay.New(store, pub, relay.Options{})
//
// sends each batch with acks=all (the batches of several buckets in one
// round of produce requests), places each row by its explicit partition or
// the Java client's murmur2 of its key, stamps the row's message id in a
// header (DefaultMessageIDHeader) so that consumers can deduplicate, and
// keeps each partition's records in submission order even when a row is
// rejected (see Publisher). Its errors tell the engine which rows will
// never be accepted as stored (relay.ErrUnpublishable) and when the broker
// refused its credentials (relay.ErrPublisherAuth).
//
// With Config.Transactions the publisher is transactional (fenced
// publishing, opt-in): a relay that stalled past its lease cannot make its
// records visible to read_committed consumers. See Transactions.
//
// The package is named kafkapub, not kafka, so that it sits beside
// kafka-go's package kafka in one file: Config.Transport and Config.Configure
// take kafka-go's types.
package kafkapub
