package franz_test

import (
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/inbox/franz"
	"github.com/gorm-outbox/outbox/internal/consumertest"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// TestConsumerBehaviour runs the consumer suite of package inbox's
// kafka-go Consumer on the franz-go Consumer.
func TestConsumerBehaviour(t *testing.T) {
	consumertest.Run(t, franzGo)
}

// franzGo is the suite's view of this consumer.
var franzGo = consumertest.Client{
	Name:         "franz-go",
	SkipsAborted: true,
	New: func(t testing.TB, b testenv.Broker, ib *inbox.Inbox, group, topic, handler string, fn consumertest.HandlerFunc, opts inbox.ConsumerOptions) consumertest.Consumer {
		c, err := franz.NewConsumer(ib, handler, func(tx *gorm.DB, r *kgo.Record) error {
			rec := consumertest.Record{Topic: r.Topic, Partition: int(r.Partition), Offset: r.Offset, Key: r.Key, Value: r.Value}
			for _, h := range r.Headers {
				rec.Headers = append(rec.Headers, kafka.Header{Key: h.Key, Value: h.Value})
			}
			return fn(tx, rec)
		}, opts,
			kgo.SeedBrokers(b.Addrs...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
			kgo.FetchMaxWait(50*time.Millisecond), kgo.HeartbeatInterval(200*time.Millisecond),
			kgo.SessionTimeout(6*time.Second), kgo.RebalanceTimeout(6*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	},
}

// BenchmarkConsumerVsBareTransaction: see consumertest.Bench.
func BenchmarkConsumerVsBareTransaction(b *testing.B) {
	consumertest.Bench(b, franzGo)
}

// TestEffectsAudit: see consumertest.RunEffects.
func TestEffectsAudit(t *testing.T) {
	consumertest.RunEffects(t, franzGo)
}
