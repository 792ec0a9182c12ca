package relay_test

import (
	"context"
	"log"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/relay"
)

// recorder is a slog.Handler that keeps every record, for tests of what the
// relay logs.
type recorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recorder) WithGroup(string) slog.Handler            { return r }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec.Clone())
	return nil
}

// matching returns the records at level whose message contains substr.
func (r *recorder) matching(level slog.Level, substr string) []slog.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []slog.Record
	for _, rec := range r.records {
		if rec.Level == level && strings.Contains(rec.Message, substr) {
			out = append(out, rec)
		}
	}
	return out
}

// attr returns the value of rec's attribute key.
func attr(rec slog.Record, key string) (slog.Value, bool) {
	var v slog.Value
	var ok bool
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v, ok = a.Value, true
			return false
		}
		return true
	})
	return v, ok
}

// setDefaultLogger makes slog.Default record into a new recorder for the
// test; cleanup restores the previous default and the log package's output,
// which slog.SetDefault redirects.
func setDefaultLogger(t *testing.T) *recorder {
	t.Helper()
	prev, out, flags := slog.Default(), log.Writer(), log.Flags()
	rec := &recorder{}
	slog.SetDefault(slog.New(rec))
	t.Cleanup(func() {
		slog.SetDefault(prev)
		log.SetOutput(out)
		log.SetFlags(flags)
	})
	return rec
}

const pollingNotice = "commits are found by polling"

func TestNotifierWiring(t *testing.T) {
	// runOnce runs the harness's relay until it first idles, then stops it.
	runOnce := func(t *testing.T, h *harness) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- h.r.Run(ctx) }()
		h.waitIdle()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run = %v; want nil", err)
			}
		case <-time.After(waitLimit):
			t.Fatalf("Run did not return after cancel")
		}
	}

	t.Run("relay_without_a_notifier_logs_once_that_commits_are_found_by_polling", func(t *testing.T) {
		rec := &recorder{}
		h := newHarness(t, relay.Options{PollInterval: 3 * time.Second, Logger: slog.New(rec)}, nil)
		runOnce(t, h)
		runOnce(t, h)
		got := rec.matching(slog.LevelInfo, pollingNotice)
		if len(got) != 1 {
			t.Fatalf("INFO records about polling after two Runs = %d; want 1", len(got))
		}
		if v, ok := attr(got[0], "poll_interval"); !ok || v.Duration() != 3*time.Second {
			t.Errorf("poll_interval = %v (present %v); want 3s", v, ok)
		}
		if !strings.Contains(got[0].Message, "Options.Notifier") {
			t.Errorf("message %q does not say how to wire the notifier (Options.Notifier)", got[0].Message)
		}
	})

	t.Run("relay_with_a_notifier_logs_no_polling_notice", func(t *testing.T) {
		rec := &recorder{}
		h := newHarness(t, relay.Options{Notifier: relay.NewNotifier(), Logger: slog.New(rec)}, nil)
		runOnce(t, h)
		if got := rec.matching(slog.LevelInfo, pollingNotice); len(got) != 0 {
			t.Fatalf("polling notice with Options.Notifier set: %v; want none", got)
		}
	})

	t.Run("relay_whose_notifier_was_taken_logs_no_polling_notice", func(t *testing.T) {
		rec := &recorder{}
		h := newHarness(t, relay.Options{Logger: slog.New(rec)}, nil)
		_ = h.r.Notifier() // handed to outbox.Plugin
		runOnce(t, h)
		if got := rec.matching(slog.LevelInfo, pollingNotice); len(got) != 0 {
			t.Fatalf("polling notice after Relay.Notifier was taken: %v; want none", got)
		}
	})

	t.Run("relay_with_a_transport_logs_no_polling_notice", func(t *testing.T) {
		rec := &recorder{}
		h := newHarness(t, relay.Options{HintTransport: newHub().endpoint(), Logger: slog.New(rec)}, nil)
		runOnce(t, h)
		if got := rec.matching(slog.LevelInfo, pollingNotice); len(got) != 0 {
			t.Fatalf("polling notice with Options.HintTransport set: %v; want none", got)
		}
	})

	t.Run("unattached_notifier_warns_once_on_notifications", func(t *testing.T) {
		rec := setDefaultLogger(t)
		n := relay.NewNotifier()
		if got := rec.matching(slog.LevelWarn, "no relay"); len(got) != 0 {
			t.Fatalf("warnings before any notification: %d; want 0", len(got))
		}
		n.NotifyBucket(3)
		n.NotifyCommitted()
		n.NotifyBuckets([]int{1, 2})
		got := rec.matching(slog.LevelWarn, "no relay")
		if len(got) != 1 {
			t.Fatalf("WARN records after notifications to an unattached notifier = %d; want 1", len(got))
		}
		if !strings.Contains(got[0].Message, "Options.Notifier") {
			t.Errorf("message %q does not say how to attach the notifier (Options.Notifier)", got[0].Message)
		}
	})

	t.Run("attached_notifier_never_warns", func(t *testing.T) {
		rec := setDefaultLogger(t)
		n := relay.NewNotifier()
		newHarness(t, relay.Options{Notifier: n}, nil)
		n.NotifyBucket(3)
		n.NotifyCommitted()
		if got := rec.matching(slog.LevelWarn, "no relay"); len(got) != 0 {
			t.Fatalf("warnings from an attached notifier: %d; want 0", len(got))
		}
	})
}
