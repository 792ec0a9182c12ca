package testenv_test

import (
	"context"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/segmentio/kafka-go"
)

func TestBrokerProducesAndConsumesARecord(t *testing.T) {
	testenv.ForEachBroker(t, func(t *testing.T, b testenv.Broker) {
		topic := testenv.Unique("testenv-")
		b.CreateTopic(t, topic, 2, nil)
		w := &kafka.Writer{Addr: kafka.TCP(b.Addrs...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
		defer w.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := w.WriteMessages(ctx, kafka.Message{Key: []byte("k"), Value: []byte("hello")}); err != nil {
			t.Fatalf("WriteMessages = %v", err)
		}
		got := b.ReadAll(t, topic, 1, 30*time.Second)
		if len(got) != 1 || string(got[0].Value) != "hello" || string(got[0].Key) != "k" {
			t.Fatalf("read %d records (%v); want the one written", len(got), got)
		}
	})
}

func TestDatabasesAreFreshAndSeparate(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			a, b := o.Open(t, nil), o.Open(t, nil)
			testenv.MustExec(t, a, "CREATE TABLE probe (id integer)")
			if b.Migrator().HasTable("probe") {
				t.Fatalf("a table created in one database is visible in another")
			}
		})
	}
}
