// Package kafkapub is the Kafka publisher of the outbox relay: a
// relay.Publisher built on kafka-go (a Writer holds its settings, its
// Client sends the produce requests), so that a relay built with
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
// rejected (see Publisher). It classifies the broker's errors for the
// engine: a row that will never be accepted as stored wraps
// relay.ErrUnpublishable (the relay may park it), refused credentials wrap
// relay.ErrPublisherAuth (the relay's Health reports them).
//
// With Config.Transactions the publisher is transactional (fenced
// publishing, opt-in): one Kafka transactional producer per bucket the relay
// owns, told through relay.Publisher.OwnedBuckets, so that a relay that
// stalled past its lease cannot make its records visible to read_committed
// consumers; its publishes fail with relay.ErrFenced. See Transactions.
//
// Each Publish call records an OpenTelemetry PRODUCER span linked to the
// writers' trace contexts (Config.TracerProvider, Config.Propagator).
//
// The package is named kafkapub, not kafka, so that it sits beside
// kafka-go's package kafka in one file: Config.Transport and Config.Configure
// take kafka-go's types.
package kafkapub
