package main

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"gorm.io/driver/sqlite"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// sampleValue returns the value of metric's sample labelled with the
// default outbox name, or -1 when there is none.
func sampleValue(body, metric string) float64 {
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, metric+"{") && strings.Contains(line, `outbox_name="outbox"`) {
			if i := strings.LastIndexByte(line, ' '); i > 0 {
				if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
					return v
				}
			}
		}
	}
	return -1
}

// TestWorkerSASLSSL runs the built worker against the real broker's
// SASL_SSL listener with -kafka-tls-ca and -kafka-sasl-mechanism
// scram-sha-512. First with a wrong password (OUTBOX_KAFKA_SASL_PASSWORD):
// the WARN log lines name the SASL authentication failure,
// outbox_publish_failures_total rises, no row is acknowledged or deleted,
// /healthz is 503 naming the failure, and SIGTERM still exits 0. Then, with
// the right password, every row reaches a consumer over SASL_SSL and the
// table empties: nothing was lost.
func TestWorkerSASLSSL(t *testing.T) {
	b, ok := testenv.RealSASLBroker(t)
	if !ok {
		t.Skipf("no SASL_SSL broker: set %s and the rest (scripts/services.sh start prints them)", testenv.EnvKafkaSASL)
	}
	bin := buildWorker(t)

	dsn := sqliteFile(t)
	db := openOutboxDB(t, sqlite.Open(dsn), outbox.Config{BucketCount: 4})
	topic := testenv.Unique("worker-sasl-")
	b.CreateTopic(t, topic, 4)
	const rows = 120
	msgs := make([]*outbox.Message, rows)
	ids := map[string]bool{}
	for i := range msgs {
		msgs[i] = outbox.NewStringMessage(topic, fmt.Sprintf("key-%d", i%13), fmt.Sprintf("value-%d", i))
	}
	if err := outbox.Enqueue(db, msgs...); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		ids[m.MessageID.String()] = true // (assigned by Enqueue)
	}
	pending := func() int64 {
		var n int64
		if err := db.Table(outbox.DefaultMessagesTable).Count(&n).Error; err != nil {
			t.Fatalf("count: %v", err)
		}
		return n
	}

	args := []string{"-db-driver", "sqlite", "-db-dsn", dsn, "-listen", "127.0.0.1:0", "-log-format", "json",
		"-bucket-count", "4", "-poll-interval", "50ms", "-error-backoff", "50ms", "-metrics-interval", "50ms",
		"-lease-renew-interval", "500ms", "-lease-duration", "5s",
		"-kafka-brokers", strings.Join(b.Addrs, ","), "-kafka-tls-ca", b.CAFile,
		"-kafka-sasl-mechanism", "scram-sha-512", "-kafka-sasl-username", b.User}

	t.Run("wrong_password", func(t *testing.T) {
		w := startWorker(t, bin, args, "OUTBOX_KAFKA_SASL_PASSWORD="+b.Password+"-wrong")
		base := "http://" + w.addr
		var body string
		eventually(t, "a WARN line naming the SASL authentication failure and outbox_publish_failures_total ≥ 3", metricsDump{w.logs, &body}, func() bool {
			_, body = get(base + "/metrics")
			return strings.Contains(w.logs.String(), "SASL Authentication Failed") && sampleValue(body, "outbox_publish_failures_total") >= 3
		})
		var warn string
		for _, line := range strings.Split(w.logs.String(), "\n") {
			if strings.Contains(line, "SASL Authentication Failed") {
				warn = line
				break
			}
		}
		if !strings.Contains(warn, `"level":"WARN"`) || !strings.Contains(warn, "publish failed") ||
			!strings.Contains(warn, "invalid credentials with SASL mechanism SCRAM-SHA-512") {
			t.Errorf("log line %s; want a WARN publish failure naming the invalid SCRAM-SHA-512 credentials", warn)
		}
		t.Logf("log line: %s", warn)
		if v := sampleValue(body, "outbox_publish_acknowledged_total"); v > 0 {
			t.Errorf("outbox_publish_acknowledged_total = %v with a wrong password; want 0", v)
		}
		t.Logf("/metrics: outbox_publish_failures_total %v, outbox_pending_messages %v",
			sampleValue(body, "outbox_publish_failures_total"), sampleValue(body, "outbox_pending_messages"))
		checkWorkerWrongPasswordHealth(t, w.logs, base)
		if n := pending(); n != rows {
			t.Fatalf("%d rows in the outbox with a wrong password; want all %d kept", n, rows)
		}
		w.terminate(t)
		if n := pending(); n != rows {
			t.Fatalf("%d rows in the outbox after SIGTERM; want all %d kept", n, rows)
		}
	})

	t.Run("right_password", func(t *testing.T) {
		w := startWorker(t, bin, args, "OUTBOX_KAFKA_SASL_PASSWORD="+b.Password)
		got := b.ReadAll(t, topic, rows, time.Minute)
		seen := map[string]bool{}
		for _, rec := range got {
			for _, h := range rec.Headers {
				if h.Key == "x-outbox-message-id" {
					if !ids[string(h.Value)] {
						t.Fatalf("record with message id %q matches no row", h.Value)
					}
					seen[string(h.Value)] = true
				}
			}
		}
		if len(seen) != rows {
			t.Fatalf("consumed %d distinct rows over SASL_SSL; want %d\n%s", len(seen), rows, w.logs)
		}
		eventually(t, "the messages table is empty", w.logs, func() bool { return pending() == 0 })
		eventually(t, "/healthz is 200", w.logs, func() bool {
			code, _ := get("http://" + w.addr + "/healthz")
			return code == http.StatusOK
		})
		w.terminate(t)
	})
}

// checkWorkerWrongPasswordHealth checks /healthz while every publish fails
// to authenticate: 503 with the reason (relay.Health reports an
// authentication failure, unlike other publish failures).
// (Until the first cycle completes, /healthz says that first.)
func checkWorkerWrongPasswordHealth(t *testing.T, logs fmt.Stringer, base string) {
	t.Helper()
	var code int
	var body string
	eventually(t, "/healthz is 503 naming the SASL authentication failure", logs, func() bool {
		code, body = get(base + "/healthz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "cannot authenticate to Kafka") && strings.Contains(body, "SASL Authentication Failed")
	})
	t.Logf("/healthz: %d %s", code, strings.TrimSpace(body))
}
