// Package franz runs package inbox's consumer loop on franz-go: a
// consumer group's records, each handled with its effect and its message
// id in one database transaction, the offset committed after it.
//
// It is the same loop as inbox.Consumer (retries with backoff, dead
// letters with the original headers, outages never dead-lettered, a stop
// that still commits a committed record's offset), over a *kgo.Client that
// reads with read_committed: the records of aborted transactions are never
// handed to the handler, and transaction markers never reach it. It is a
// module of its own, github.com/gorm-outbox/outbox/inbox/franz, so that
// franz-go stays out of the library's module graph:
//
//	c, err := franz.NewConsumer(ib, "shipping", func(tx *gorm.DB, r *kgo.Record) error {
//		return tx.Create(&Shipment{OrderID: string(r.Key)}).Error
//	}, inbox.ConsumerOptions{DeadLetterTopic: "orders.dlq"},
//		kgo.SeedBrokers(brokers...), kgo.ConsumerGroup("shipping"), kgo.ConsumeTopics("orders"))
//	if err != nil { ... }
//	defer c.Close()
//	err = c.Run(ctx) // until ctx is done
package franz
