package kafkapub_test

// Configuration checks of New, which need no broker (the tests that
// publish are in internal/tests/kafkapub: they need an in-process broker).

import (
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/kafkapub"
)

func TestNewKafkaPublisher_rejects_invalid_config(t *testing.T) {
	tests := []struct {
		name  string
		cfg   kafkapub.Config
		field string
	}{
		{"no_brokers", kafkapub.Config{}, "Brokers"},
		{"empty_broker", kafkapub.Config{Brokers: []string{"a:9092", " "}}, "Brokers[1]"},
		{"negative_batch_bytes", kafkapub.Config{Brokers: []string{"a:9092"}, BatchBytes: -1}, "BatchBytes"},
		{"negative_max_batch_records", kafkapub.Config{Brokers: []string{"a:9092"}, MaxBatchRecords: -1}, "MaxBatchRecords"},
		{"negative_publish_timeout", kafkapub.Config{Brokers: []string{"a:9092"}, PublishTimeout: -time.Second}, "PublishTimeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := kafkapub.New(tt.cfg)
			if err == nil {
				p.Close()
				t.Fatalf("New(%+v) = nil error; want one naming %s", tt.cfg, tt.field)
			}
			if !strings.Contains(err.Error(), tt.field) || !strings.HasPrefix(err.Error(), "kafkapub: ") {
				t.Errorf("New error = %q; want it to start with \"kafkapub: \" and name %s", err, tt.field)
			}
		})
	}
}

func TestNewKafkaPublisher_rejects_invalid_transactions(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  kafkapub.Config
		want string
	}{
		{"empty_outbox", kafkapub.Config{Transactions: &kafkapub.Transactions{}}, "Transactions.Outbox"},
		{"negative_timeout", kafkapub.Config{Transactions: &kafkapub.Transactions{Outbox: "o", Timeout: -1}}, "Transactions.Timeout"},
		{"timeout_not_above_publish_timeout", kafkapub.Config{PublishTimeout: 10 * time.Second, Transactions: &kafkapub.Transactions{Outbox: "o", Timeout: 10 * time.Second}}, "Transactions.Timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Brokers = []string{"127.0.0.1:1"}
			_, err := kafkapub.New(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v; want an error naming %s", err, tc.want)
			}
		})
	}
}

func TestKafkaTransactions_TransactionalID(t *testing.T) {
	for _, tc := range []struct {
		cfg    kafkapub.Transactions
		bucket int
		want   string
	}{
		{kafkapub.Transactions{Outbox: "orders"}, 3, "outbox-orders-3"},
		{kafkapub.Transactions{Outbox: "orders", IDPrefix: "billing."}, 0, "billing.orders-0"},
	} {
		if got := tc.cfg.TransactionalID(tc.bucket); got != tc.want {
			t.Errorf("TransactionalID(%d) = %q; want %q", tc.bucket, got, tc.want)
		}
	}
}
