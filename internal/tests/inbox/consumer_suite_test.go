package inbox_test

import (
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/internal/testenv/consumertest"
)

// TestConsumerBehaviour runs the consumer suite, which
// internal/tests/inbox/franz runs on franz-go too, on the kafka-go Consumer
// with a ReadCommitted Reader.
func TestConsumerBehaviour(t *testing.T) {
	consumertest.Run(t, kafkaGo)
}

// kafkaGo is the suite's view of this consumer.
var kafkaGo = consumertest.Client{
	Name: "kafka-go",
	New: func(t testing.TB, b testenv.Broker, ib *inbox.Inbox, group, topic, handler string, fn consumertest.HandlerFunc, opts inbox.ConsumerOptions) consumertest.Consumer {
		cfg := groupReaderConfig(b.Addrs, topic, group)
		cfg.IsolationLevel = kafka.ReadCommitted
		r := kafka.NewReader(cfg)
		t.Cleanup(func() { _ = r.Close() })
		if opts.DeadLetterTopic != "" {
			w := &kafka.Writer{Addr: kafka.TCP(b.Addrs...), RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, Transport: &kafka.Transport{}}
			t.Cleanup(func() { _ = w.Close() })
			opts.DeadLetter = w
		}
		c, err := inbox.NewConsumer(ib, r, handler, func(tx *gorm.DB, m kafka.Message) error {
			return fn(tx, consumertest.Record{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, Headers: m.Headers})
		}, opts)
		if err != nil {
			t.Fatal(err)
		}
		return kafkaGoConsumer{c, r}
	},
}

// kafkaGoConsumer is a Consumer and its Reader, closed by Close.
type kafkaGoConsumer struct {
	*inbox.Consumer
	r *kafka.Reader
}

func (c kafkaGoConsumer) Close() { _ = c.r.Close() }

// BenchmarkConsumerVsBareTransaction: see consumertest.Bench.
func BenchmarkConsumerVsBareTransaction(b *testing.B) {
	consumertest.Bench(b, kafkaGo)
}

// TestEffectsAudit: see consumertest.RunEffects.
func TestEffectsAudit(t *testing.T) {
	consumertest.RunEffects(t, kafkaGo)
}
