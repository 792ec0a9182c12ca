package relay_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/relay"
)

// hangBound is the generous bound on a Publish call against a hung broker
// with a 1 s PublishTimeout: no tight timing assertion, but far below
// kafka-go's own 10 attempts × 10 s.
const hangBound = 5 * time.Second

// hangProduce makes c hold every produce request it receives (the broker
// stops answering, as a SIGSTOPped one does) until the returned release is
// called; held produce requests are then handled as usual (appended). held
// counts the produce requests that were held. release is idempotent and is
// also called at cleanup, before the cluster closes.
func hangProduce(t *testing.T, c *kfake.Cluster) (release func(), held *atomic.Int64) {
	t.Helper()
	held = new(atomic.Int64)
	released := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(released) }) }
	c.ControlKey(kmsg.Produce.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		select {
		case <-released:
			return nil, nil, false
		default:
		}
		held.Add(1)
		c.SleepControl(func() { <-released })
		return nil, nil, false
	})
	t.Cleanup(release)
	return release, held
}

func boundTopic(t *testing.T, b testenv.Broker, partitions int) string {
	t.Helper()
	name := regexp.MustCompile(`[^a-zA-Z0-9._-]+`).ReplaceAllString(t.Name(), "_")
	topic := fmt.Sprintf("%s-%08x", name, rand.Uint32())
	b.CreateTopic(t, topic, partitions, nil)
	return topic
}

func boundPublisher(t *testing.T, b testenv.Broker, timeout time.Duration) *relay.KafkaPublisher {
	t.Helper()
	p, err := relay.NewKafkaPublisher(relay.KafkaConfig{Brokers: b.Addrs, PublishTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close = %v", err)
		}
	})
	return p
}

// TestKafkaPublisher_PublishTimeout_bounds_a_publish_to_a_hung_broker: with
// PublishTimeout 1s, a Publish against a broker that never answers produce
// requests returns, well within kafka-go's retry budget, an error wrapping
// context.DeadlineExceeded that names PublishTimeout, with nothing
// acknowledged; once the broker answers again the same batch is
// acknowledged.
func TestKafkaPublisher_PublishTimeout_bounds_a_publish_to_a_hung_broker(t *testing.T) {
	b := testenv.NewFake(t)
	topic := boundTopic(t, b, 4)
	p := boundPublisher(t, b, time.Second)
	// Warm up: metadata cached, connections open.
	warm := []*outbox.Message{{MessageID: outbox.NewUUID(), Topic: topic, Key: []byte("warm")}}
	if res := p.Publish(context.Background(), warm); res.Err != nil || res.Acknowledged != 1 {
		t.Fatalf("warm-up Publish = %+v", res)
	}

	release, held := hangProduce(t, b.Fake)
	var batch []*outbox.Message
	for i := range 20 {
		batch = append(batch, &outbox.Message{MessageID: outbox.NewUUID(), Topic: topic, Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")})
	}
	start := time.Now()
	res := p.Publish(context.Background(), batch)
	took := time.Since(start)
	t.Logf("Publish against a hung broker returned after %v: %+v", took, res)
	if took > hangBound {
		t.Errorf("Publish took %v against a hung broker; want about PublishTimeout (1s), < %v", took, hangBound)
	}
	if res.Acknowledged != 0 {
		t.Errorf("Acknowledged = %d; want 0 (the broker answered nothing)", res.Acknowledged)
	}
	if !errors.Is(res.Err, context.DeadlineExceeded) || !strings.Contains(fmt.Sprint(res.Err), "PublishTimeout") {
		t.Errorf("Err = %v; want one wrapping context.DeadlineExceeded and naming PublishTimeout", res.Err)
	}
	if held.Load() == 0 {
		t.Errorf("no produce request was held; the test did not hang the broker")
	}

	// The broker answers again: the retried batch is acknowledged (the held
	// requests may have been appended as well: duplicates, never losses).
	release()
	deadline := time.Now().Add(20 * time.Second)
	for {
		res = p.Publish(context.Background(), batch)
		if res.Err == nil && res.Acknowledged == len(batch) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Publish after the broker resumed = %+v; want all %d acknowledged", res, len(batch))
		}
		time.Sleep(100 * time.Millisecond)
	}
	recs := b.ReadAll(t, topic, 1+len(batch), 10*time.Second)
	seen := map[string]int{}
	for _, r := range recs {
		for _, h := range r.Headers {
			if h.Key == relay.DefaultMessageIDHeader {
				seen[string(h.Value)]++
			}
		}
	}
	for _, m := range batch {
		if seen[m.MessageID.String()] == 0 {
			t.Errorf("message %s lost", m.MessageID)
		}
	}
	t.Logf("%d records for %d messages (duplicates from the held requests: %d)", len(recs), 1+len(batch), len(recs)-1-len(batch))
}
