package testenv

import (
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
	if !isSet(t, EnvKafkaSASL, EnvKafkaSASLUser, EnvKafkaSASLPassword, EnvKafkaCAFile) {
		return SASLBroker{}, false
	}
	b.Addrs = strings.Split(os.Getenv(EnvKafkaSASL), ",")
	b.User, b.Password, b.CAFile = os.Getenv(EnvKafkaSASLUser), os.Getenv(EnvKafkaSASLPassword), os.Getenv(EnvKafkaCAFile)
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

// Broker returns the SASL_SSL listener as a Broker (Name Real) whose
// CreateTopic and ReadAll connect with Dialer.
func (b SASLBroker) Broker(t testing.TB) Broker {
	t.Helper()
	return Broker{Name: Real, Addrs: b.Addrs, dialer: b.Dialer(t)}
}

// CreateTopic creates topic with partitions over the SASL_SSL listener and
// waits until every partition has a leader.
func (b SASLBroker) CreateTopic(t testing.TB, topic string, partitions int) {
	t.Helper()
	b.Broker(t).CreateTopic(t, topic, partitions, nil)
}

// ReadAll consumes topic from the start of every partition over the
// SASL_SSL listener until want records were read or timeout passed, and
// returns them in per-partition order (partitions ascending).
func (b SASLBroker) ReadAll(t testing.TB, topic string, want int, timeout time.Duration) []kafka.Message {
	t.Helper()
	return b.Broker(t).ReadAll(t, topic, want, timeout)
}
