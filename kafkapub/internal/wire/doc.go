// Package wire holds the parts of the Kafka protocol that kafkapub encodes
// and sends itself, beside kafka-go's Writer: v2 record batches with a
// producer id, epoch and sequence numbers (EncodeRecordBatch), the
// transaction calls (InitProducerID, AddPartitionsToTxn, EndTxn), a raw
// produce request of such batches (Produce), and the metadata lookups
// (Partitions, Leaders), all on the writer's kafka.RoundTripper.
//
// It knows the protocol, not the relay: which errors a request may be sent
// again for (CoordinatorRetriable, ProduceRetriable) and which say that a
// producer was fenced (ProducerFenced), but not what the publisher does
// about them.
package wire
