package inbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox/inbox"
	"github.com/gorm-outbox/outbox/internal/metrictest"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

func TestOptionsValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		opts inbox.Options
		want string // in the error; "" for valid
	}{
		{"zero_is_valid", inbox.Options{}, ""},
		{"negative_retention", inbox.Options{Retention: -time.Second}, "Options.Retention"},
		{"negative_purge_interval", inbox.Options{PurgeInterval: -time.Second}, "Options.PurgeInterval"},
		{"negative_purge_batch", inbox.Options{PurgeBatchSize: -1}, "Options.PurgeBatchSize"},
		{"invalid_table", inbox.Options{Config: inbox.Config{Table: "a-b"}}, "Config.Table"},
		{"invalid_schema", inbox.Options{Config: inbox.Config{Schema: "x y"}}, "Config.Schema"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.opts.Validate()
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("Validate() = %v; want nil", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "inbox: ")):
				t.Fatalf("Validate() = %v; want an inbox error naming %s", err, c.want)
			}
		})
	}
}

func TestConsumerOptionsValidate(t *testing.T) {
	withTopic := &kafka.Writer{Topic: "dlq"}
	noTopic := &kafka.Writer{}
	for _, c := range []struct {
		name string
		opts inbox.ConsumerOptions
		want string
	}{
		{"zero_is_valid", inbox.ConsumerOptions{}, ""},
		{"dead_letter_with_its_writers_topic", inbox.ConsumerOptions{DeadLetter: withTopic}, ""},
		{"dead_letter_topic_with_a_topicless_writer", inbox.ConsumerOptions{DeadLetter: noTopic, DeadLetterTopic: "dlq", MaxAttempts: 2}, ""},
		{"max_attempts_without_dead_letter_would_skip", inbox.ConsumerOptions{MaxAttempts: 3}, "ConsumerOptions.MaxAttempts"},
		{"negative_max_attempts", inbox.ConsumerOptions{DeadLetter: withTopic, MaxAttempts: -1}, "ConsumerOptions.MaxAttempts"},
		{"negative_backoff", inbox.ConsumerOptions{RetryBackoff: -1}, "ConsumerOptions.RetryBackoff"},
		{"cap_below_backoff", inbox.ConsumerOptions{RetryBackoff: time.Minute, MaxRetryBackoff: time.Second}, "ConsumerOptions.MaxRetryBackoff"},
		{"negative_commit_timeout", inbox.ConsumerOptions{CommitTimeout: -1}, "ConsumerOptions.CommitTimeout"},
		{"topic_without_dead_letter", inbox.ConsumerOptions{DeadLetterTopic: "dlq"}, "ConsumerOptions.DeadLetterTopic"},
		{"no_topic_anywhere", inbox.ConsumerOptions{DeadLetter: noTopic}, "ConsumerOptions.DeadLetterTopic"},
		{"two_topics", inbox.ConsumerOptions{DeadLetter: withTopic, DeadLetterTopic: "other"}, "ConsumerOptions.DeadLetterTopic"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.opts.Validate()
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("Validate() = %v; want nil", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("Validate() = %v; want an error naming %s", err, c.want)
			}
		})
	}
}

// oracle is a dialect the inbox has no statements for.
type oracle struct{ *sqlite.Dialector }

func (oracle) Name() string { return "oracle" }

func TestNewAndNewConsumerRejectMisuse(t *testing.T) {
	db := testenv.Databases(t)[0].Open(t, nil)
	if _, err := inbox.New(nil, inbox.Options{}); err == nil {
		t.Error("New(nil) = nil error; want one")
	}
	if _, err := inbox.New(db, inbox.Options{Retention: -1}); err == nil || !strings.Contains(err.Error(), "Options.Retention") {
		t.Errorf("New(Retention -1) = %v; want an error naming Options.Retention", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	other, err := gorm.Open(oracle{&sqlite.Dialector{Conn: sqlDB}}, &gorm.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.New(other, inbox.Options{}); err == nil || !strings.Contains(err.Error(), `dialect "oracle" is not supported`) {
		t.Errorf("New(oracle) = %v; want not supported", err)
	}

	ib, _ := setup(t, db, inbox.Options{})
	noGroup := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{"127.0.0.1:1"}, Topic: "t"})
	defer noGroup.Close()
	fn := func(*gorm.DB, kafka.Message) error { return nil }
	for _, c := range []struct {
		name    string
		ib      *inbox.Inbox
		r       inbox.Reader
		handler string
		fn      inbox.HandlerFunc
		want    string
	}{
		{"reader_without_group", ib, noGroup, "h", fn, "no GroupID"},
		{"nil_reader", ib, nil, "h", fn, "nil Reader"},
		{"nil_inbox", nil, watchedReader{}, "h", fn, "nil *Inbox"},
		{"nil_func", ib, watchedReader{}, "h", nil, "nil HandlerFunc"},
		{"empty_handler", ib, watchedReader{}, "", fn, "handler name"},
	} {
		if _, err := inbox.NewConsumer(c.ib, c.r, c.handler, c.fn, inbox.ConsumerOptions{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: NewConsumer = %v; want an error containing %q", c.name, err, c.want)
		}
	}
}

// TestNilMeterProviderRecordsToTheGlobalProvider: with no MeterProvider
// the inbox's instruments come from the OpenTelemetry global, as the
// relay's do.
func TestNilMeterProviderRecordsToTheGlobalProvider(t *testing.T) {
	reader := metrictest.NewReader()
	prev := otel.GetMeterProvider()
	otel.SetMeterProvider(reader.MeterProvider())
	t.Cleanup(func() { otel.SetMeterProvider(prev) })
	db := testenv.Databases(t)[0].Open(t, nil)
	if err := inbox.AutoMigrate(db, inbox.Config{}); err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(db, inbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := ib.Handle(context.Background(), "global", record("orders", 0, 0, "g-1"), func(*gorm.DB) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	collect(t, reader).Check(t, readings{inbox.MetricProcessed: 1, inbox.MetricDuplicates: 1, inbox.MetricHandleDuration: 2})
	points, err := reader.Collect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range points {
		if p.Kind == metrictest.Counter && p.Name == inbox.MetricProcessed {
			if p.Scope != "github.com/gorm-outbox/outbox/inbox" || p.Attr(inbox.AttrHandler) != "global" {
				t.Fatalf("%s: scope %q, %s=%q; want the inbox's scope and global", p.Name, p.Scope, inbox.AttrHandler, p.Attr(inbox.AttrHandler))
			}
			return
		}
	}
	t.Fatalf("no %s data point", inbox.MetricProcessed)
}
