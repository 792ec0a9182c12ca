package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// TestEndToEndGormToKafka moves GORM-enqueued rows through the relay and the
// Kafka publisher to a consumer: every committed row arrives with its
// message-id header, key, value and headers; no rolled-back row does; the
// table empties. SQLite, PostgreSQL and MySQL with the in-process broker,
// and PostgreSQL with the real broker when the environment names both.
func TestEndToEndGormToKafka(t *testing.T) {
	forEachDBAndBroker(t, func(t *testing.T, dbo testenv.Opener, b testenv.Broker) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		topic := testenv.Unique("e2e-")
		b.CreateTopic(t, topic, 4, nil)

		db := dbo.Open(t, nil)
		n := relay.NewNotifier()
		store := e2eStore(t, db, n)
		_, done := startKafkaRelay(ctx, t, db, store, n, kafkapub.Config{Brokers: b.Addrs})

		committed, rolledBack := writeTransactions(ctx, t, db, topic, 1, 60)
		checkRecords(t, b.ReadAll(t, topic, len(committed), time.Minute), committed, rolledBack)
		waitOutboxEmpty(ctx, t, db)
		stopRelay(t, cancel, done)
	})
}
