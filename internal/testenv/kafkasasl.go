package testenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// Environment variables of the real broker's SASL_SSL listener, printed by
// scripts/services.sh start.
const (
	// EnvKafkaSASL names the SASL_SSL bootstrap addresses, e.g. 127.0.0.1:59094.
	EnvKafkaSASL = "OUTBOX_TEST_KAFKA_SASL_BROKERS"
	// EnvKafkaSASLUser is the SCRAM-SHA-512 (and PLAIN) user.
	EnvKafkaSASLUser = "OUTBOX_TEST_KAFKA_SASL_USER"
	// EnvKafkaSASLPassword is that user's password.
	EnvKafkaSASLPassword = "OUTBOX_TEST_KAFKA_SASL_PASSWORD"
	// EnvKafkaCAFile is a PEM file of the CA that signed the listener's certificate.
	EnvKafkaCAFile = "OUTBOX_TEST_KAFKA_CA_FILE"
)

// SASLBroker is a real broker's SASL_SSL listener: TLS verified with the CA
// of CAFile, SASL SCRAM-SHA-512 or PLAIN as User with Password.
type SASLBroker struct {
	// Addrs are the SASL_SSL bootstrap addresses.
	Addrs []string
	// User and Password are the credentials the broker knows.
	User, Password string
	// CAFile is the PEM file of the CA that verifies the broker.
	CAFile string
	// RootCAs holds the certificates of CAFile.
	RootCAs *x509.CertPool
}

// RealSASLBroker returns the SASL_SSL listener of the environment, or ok
// false when one of its variables is not set (a failure under
// OUTBOX_TEST_REQUIRE_ALL). An unreadable CA file always fails t.
func RealSASLBroker(t testing.TB) (b SASLBroker, ok bool) {
	t.Helper()
	var missing []string
	get := func(name string) string {
		v := os.Getenv(name)
		if v == "" {
			missing = append(missing, name)
		}
		return v
	}
	addrs := get(EnvKafkaSASL)
	b.User = get(EnvKafkaSASLUser)
	b.Password = get(EnvKafkaSASLPassword)
	b.CAFile = get(EnvKafkaCAFile)
	if len(missing) > 0 {
		if RequireAll() {
			t.Fatalf("testenv: %s not set and %s=1 (scripts/services.sh start prints them)", strings.Join(missing, ", "), EnvRequireAll)
		}
		return SASLBroker{}, false
	}
	b.Addrs = strings.Split(addrs, ",")
	pem, err := os.ReadFile(b.CAFile)
	if err != nil {
		t.Fatalf("testenv: %s: %v", EnvKafkaCAFile, err)
	}
	b.RootCAs = x509.NewCertPool()
	if !b.RootCAs.AppendCertsFromPEM(pem) {
		t.Fatalf("testenv: %s %s: no PEM certificate", EnvKafkaCAFile, b.CAFile)
	}
	return b, true
}

// TLSConfig returns a client TLS configuration that verifies the broker
// with the CA of CAFile.
func (b SASLBroker) TLSConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: b.RootCAs}
}

// SCRAM returns the SCRAM-SHA-512 mechanism for b.User with password.
func (b SASLBroker) SCRAM(t testing.TB, password string) sasl.Mechanism {
	t.Helper()
	m, err := scram.Mechanism(scram.SHA512, b.User, password)
	if err != nil {
		t.Fatalf("testenv: scram mechanism: %v", err)
	}
	return m
}

// Plain returns the PLAIN mechanism for b.User with password.
func (b SASLBroker) Plain(password string) sasl.Mechanism {
	return plain.Mechanism{Username: b.User, Password: password}
}

// Transport returns a kafka-go Transport over TLS (verified with the CA)
// that authenticates with mech; its idle connections are closed at cleanup.
func (b SASLBroker) Transport(t testing.TB, mech sasl.Mechanism) *kafka.Transport {
	t.Helper()
	tr := &kafka.Transport{TLS: b.TLSConfig(), SASL: mech, DialTimeout: 10 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// Dialer returns a kafka-go Dialer over TLS that authenticates with the
// right SCRAM-SHA-512 credentials, for readers and admin connections.
func (b SASLBroker) Dialer(t testing.TB) *kafka.Dialer {
	t.Helper()
	return &kafka.Dialer{Timeout: 10 * time.Second, DualStack: true, TLS: b.TLSConfig(), SASLMechanism: b.SCRAM(t, b.Password)}
}

// CreateTopic creates topic with partitions over the SASL_SSL listener and
// waits until every partition has a leader.
func (b SASLBroker) CreateTopic(t testing.TB, topic string, partitions int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr := b.Transport(t, b.SCRAM(t, b.Password))
	c := &kafka.Client{Addr: kafka.TCP(b.Addrs...), Transport: tr}
	res, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}}})
	if err != nil {
		t.Fatalf("testenv: create topic %s over SASL_SSL: %v", topic, err)
	}
	if err := res.Errors[topic]; err != nil {
		t.Fatalf("testenv: create topic %s over SASL_SSL: %v", topic, err)
	}
	for {
		md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == partitions {
			ready := true
			for _, p := range md.Topics[0].Partitions {
				if p.Leader.Host == "" || p.Error != nil {
					ready = false
				}
			}
			if ready {
				return
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("testenv: topic %s has no leaders after 30s (last error %v)", topic, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ReadAll consumes topic from the start of every partition over the
// SASL_SSL listener until want records were read or timeout passed, and
// returns them in per-partition order (partitions ascending).
func (b SASLBroker) ReadAll(t testing.TB, topic string, want int, timeout time.Duration) []kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	d := b.Dialer(t)
	conn, err := d.DialContext(ctx, "tcp", b.Addrs[0])
	if err != nil {
		t.Fatalf("testenv: dial %s over SASL_SSL: %v", b.Addrs[0], err)
	}
	ps, err := conn.ReadPartitions(topic)
	conn.Close()
	if err != nil {
		t.Fatalf("testenv: read partitions of %s: %v", topic, err)
	}
	var out []kafka.Message
	for len(out) < want && ctx.Err() == nil {
		out = out[:0]
		for _, p := range ps {
			lc, err := d.DialLeader(ctx, "tcp", b.Addrs[0], topic, p.ID)
			if err != nil {
				t.Fatalf("testenv: dial leader of %s/%d: %v", topic, p.ID, err)
			}
			last, err := lc.ReadLastOffset()
			lc.Close()
			if err != nil {
				t.Fatalf("testenv: last offset of %s/%d: %v", topic, p.ID, err)
			}
			if last == 0 {
				continue
			}
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: b.Addrs, Dialer: d, Topic: topic, Partition: p.ID, MaxWait: 50 * time.Millisecond})
			for {
				m, err := r.ReadMessage(ctx)
				if err != nil {
					break
				}
				out = append(out, m)
				if m.Offset+1 >= last {
					break
				}
			}
			r.Close()
		}
		if len(out) < want {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return out
}
