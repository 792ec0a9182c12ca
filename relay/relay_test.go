package relay_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

func TestNew(t *testing.T) {
	mem := relaytest.NewMemStore(8, nil)
	pub := relaytest.NewPublisher()
	cases := []struct {
		name  string
		store relay.Store
		opts  relay.Options
		want  string // substring naming the option
		mis   bool   // wraps ErrMisconfigured
	}{
		{"negative_batch_size", mem, relay.Options{BatchSize: -1}, "BatchSize", false},
		{"negative_bucket_count", mem, relay.Options{BucketCount: -1}, "BucketCount", false},
		{"bucket_count_disagrees_with_store", mem, relay.Options{BucketCount: 16}, "BucketCount", true},
		{"negative_poll_interval", mem, relay.Options{PollInterval: -time.Second}, "PollInterval", false},
		{"negative_error_backoff", mem, relay.Options{ErrorBackoff: -time.Second}, "ErrorBackoff", false},
		{"negative_lease_duration", mem, relay.Options{LeaseDuration: -time.Second}, "LeaseDuration", false},
		{"renew_interval_not_below_lease", mem, relay.Options{LeaseDuration: 10 * time.Second, LeaseRenewInterval: 10 * time.Second}, "LeaseRenewInterval", false},
		{"negative_metrics_interval", mem, relay.Options{MetricsInterval: -1}, "MetricsInterval", false},
		{"negative_metrics_timeout", mem, relay.Options{MetricsTimeout: -1}, "MetricsTimeout", false},
		{"bucket_zero_only_without_metrics_backlog", mem, relay.Options{MetricsBucketZeroOnly: true}, "MetricsBacklog", false},
		{"negative_stop_timeout", mem, relay.Options{StopTimeout: -1}, "StopTimeout", false},
		{"negative_max_publish_duration", mem, relay.Options{MaxPublishDuration: -1}, "MaxPublishDuration", false},
		{"negative_publish_failure_window", mem, relay.Options{PublishFailureWindow: -1}, "PublishFailureWindow", false},
		{"relay_id_too_long", mem, relay.Options{RelayID: strings.Repeat("x", 129)}, "RelayID", false},
		{"blank_metrics_name", mem, relay.Options{MetricsName: "   "}, "MetricsName", false},
		{"metrics_name_too_long", mem, relay.Options{MetricsName: strings.Repeat("m", 65)}, "MetricsName", false},
		{"max_publish_duration_must_fit_in_lease", mem, relay.Options{MaxPublishDuration: 25 * time.Second}, "MaxPublishDuration", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := relay.New(tc.store, pub, tc.opts)
			if err == nil {
				t.Fatalf("New(%+v) = %v, nil; want an error naming %s", tc.opts, r, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New error = %q; want it to name %s", err, tc.want)
			}
			if got := errors.Is(err, relay.ErrMisconfigured); got != tc.mis {
				t.Fatalf("errors.Is(%v, ErrMisconfigured) = %v; want %v", err, got, tc.mis)
			}
			// It reads once: one "relay: " prefix, "misconfigured" at most once.
			if msg := err.Error(); strings.Count(msg, "relay: ") != 1 || !strings.HasPrefix(msg, "relay: ") || strings.Count(msg, "misconfigured") > 1 {
				t.Fatalf("New error = %q; want one \"relay: \" prefix and no repeated words", msg)
			}
		})
	}
	t.Run("zero_options_are_valid_defaults", func(t *testing.T) {
		r, err := relay.New(relaytest.NewMemStore(8, nil), pub, relay.Options{})
		if err != nil {
			t.Fatalf("New(zero Options) = %v; want nil", err)
		}
		if id := r.ID(); id == "" || len(id) > relay.MaxRelayIDLength {
			t.Fatalf("ID() = %q; want a non-empty id of at most %d bytes", id, relay.MaxRelayIDLength)
		}
		if r.Notifier() == nil {
			t.Fatalf("Notifier() = nil; want the relay's notifier")
		}
	})
	t.Run("notifier_serves_one_relay", func(t *testing.T) {
		n := relay.NewNotifier()
		r, err := relay.New(relaytest.NewMemStore(8, nil), pub, relay.Options{Notifier: n})
		if err != nil {
			t.Fatalf("New = %v; want nil", err)
		}
		if r.Notifier() != n {
			t.Fatalf("Notifier() is not Options.Notifier")
		}
		if _, err := relay.New(relaytest.NewMemStore(8, nil), pub, relay.Options{Notifier: n}); err == nil || !strings.Contains(err.Error(), "Notifier") {
			t.Fatalf("second New with the same Notifier = %v; want an error naming Notifier", err)
		}
	})
}

func TestRelay(t *testing.T) {
	t.Run("publishes_and_marks_all", func(t *testing.T) {
		h := newHarness(t, relay.Options{}, nil)
		h.store.Add(msgs(20, "orders")...)
		h.start()
		h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
		if got := len(h.pub.Acknowledged()); got != 20 {
			t.Fatalf("acknowledged %d messages; want 20", got)
		}
	})

	t.Run("marks_only_the_acknowledged_prefix", func(t *testing.T) {
		h := newHarness(t, relay.Options{BucketCount: 1}, nil)
		h.store.Add(msgs(5, "t")...)
		all := ids(h.store.Pending(0))
		var once sync.Once
		h.pub.SetHandler(func(_ context.Context, b []*outbox.Message) relay.Result {
			res := relay.Result{Acknowledged: len(b)}
			once.Do(func() { res = relay.Result{Acknowledged: 2, Err: errBroker} })
			return res
		})
		h.start()
		h.waitFor("first publish", func() bool { return len(h.pub.Calls()) >= 1 })
		h.waitIdle()
		if got := ids(h.store.Pending(0)); !slices.Equal(got, all[2:]) {
			t.Fatalf("pending after a 2-of-5 acknowledgment = %v; want %v", got, all[2:])
		}
	})

	t.Run("failed_rows_are_retried_in_order", func(t *testing.T) {
		h := newHarness(t, relay.Options{BucketCount: 1}, nil)
		h.store.Add(msgs(5, "t")...)
		all := ids(h.store.Pending(0))
		var mu sync.Mutex
		failures := 2
		h.pub.SetHandler(func(_ context.Context, b []*outbox.Message) relay.Result {
			mu.Lock()
			defer mu.Unlock()
			if b[0].ID == all[2] && failures > 0 {
				failures--
				return relay.Result{Err: errBroker}
			}
			if len(b) > 2 && b[2].ID == all[2] && failures > 0 {
				failures--
				return relay.Result{Acknowledged: 2, Err: errBroker}
			}
			return relay.Result{Acknowledged: len(b)}
		})
		h.start()
		for h.store.Len() > 0 {
			h.advanceIdle(time.Second)
		}
		if got := ids(h.pub.Acknowledged()); !slices.Equal(got, all) {
			t.Fatalf("acknowledged order = %v; want %v", got, all)
		}
	})

	t.Run("publisher_failure_backs_off_and_recovers", func(t *testing.T) {
		h := newHarness(t, relay.Options{BucketCount: 1, ErrorBackoff: time.Second}, nil)
		h.store.Add(msgs(3, "t")...)
		var mu sync.Mutex
		fail := true
		h.pub.SetHandler(func(_ context.Context, b []*outbox.Message) relay.Result {
			mu.Lock()
			defer mu.Unlock()
			if fail {
				fail = false
				return relay.Result{Err: errBroker}
			}
			return relay.Result{Acknowledged: len(b)}
		})
		h.start()
		h.waitFor("first publish", func() bool { return len(h.pub.Calls()) == 1 })
		h.waitIdle()
		if got := len(h.pub.Calls()); got != 1 {
			t.Fatalf("publish calls before the backoff elapsed = %d; want 1", got)
		}
		h.clock.Advance(time.Second) // the jittered backoff is at most ErrorBackoff
		h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
	})

	t.Run("store_failure_backs_off_and_recovers", func(t *testing.T) {
		h := newHarness(t, relay.Options{BucketCount: 1, ErrorBackoff: 5 * time.Second}, nil)
		h.store.Add(msgs(3, "t")...)
		h.ops.failNext(relaytest.OpNextBatches, 1)
		// Twice: a failed delete is tried again at once, before the
		// bucket's next fetch; the bucket backs off when that fails too.
		h.ops.failNext(relaytest.OpMarkPublished, 2)
		h.start()
		h.waitIdle() // backing off after the NextBatch failure
		if got := len(h.pub.Calls()); got != 0 {
			t.Fatalf("publish calls after a failed NextBatch = %d; want 0", got)
		}
		h.advanceIdle(5 * time.Second) // publishes the head row alone; MarkPublished fails
		if got := h.store.Len(); got != 3 {
			t.Fatalf("pending after a failed MarkPublished = %d; want 3", got)
		}
		// The bucket's backoff doubles (jittered, capped at
		// LeaseRenewInterval 10s): a few more ErrorBackoffs reach it.
		for i := 0; h.store.Len() > 0; i++ {
			if i == 6 {
				t.Fatalf("rows still pending after %d backoffs", i)
			}
			h.advanceIdle(5 * time.Second)
		}
	})

	t.Run("one_batch_per_ready_bucket_per_sweep", func(t *testing.T) {
		// Read by heads, one bucket at a time: a store serving buckets
		// concurrently, one at a time (a serialising store reads its
		// groups in id order: TestSerialStoreReadsGroupsInIDOrder).
		h := newHarness(t, relay.Options{BucketCount: 2, BatchSize: 2, MaxConcurrentBuckets: 1}, asConcurrent)
		h.store.AddToBucket(0, msgs(10, "full")...)
		h.store.AddToBucket(1, msgs(2, "small")...)
		h.start()
		h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
		calls := h.pub.Calls()
		if len(calls) < 2 || calls[0][0].Bucket != 0 || calls[1][0].Bucket != 1 {
			t.Fatalf("first publishes went to buckets %v; want bucket 1 served right after bucket 0's first batch", bucketsOf(calls))
		}
	})

	t.Run("single_owned_bucket_drains_until_empty", func(t *testing.T) {
		h := newHarness(t, relay.Options{BucketCount: 1, BatchSize: 2}, nil)
		h.store.Add(msgs(10, "t")...)
		h.start()
		h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
		h.waitIdle()
		if got := len(h.pub.Calls()); got != 5 {
			t.Fatalf("publish calls = %d; want 5 batches of 2", got)
		}
		if got := h.ops.count(relaytest.OpBucketsWithPending); got != 1 {
			t.Fatalf("discovery queries while draining = %d; want 1", got)
		}
	})

	t.Run("slow_publish_renews_the_lease_past_its_original_expiry", func(t *testing.T) {
		h := newHarness(t, relay.Options{BucketCount: 1}, nil)
		h.store.Add(msgs(3, "t")...)
		release := make(chan struct{})
		h.pub.SetHandler(func(_ context.Context, b []*outbox.Message) relay.Result {
			<-release
			return relay.Result{Acknowledged: len(b)}
		})
		h.start()
		h.waitFor("publish started", func() bool { return len(h.pub.Calls()) == 1 })
		for i := 1; i <= 5; i++ { // 50 s, well past the 30 s lease
			h.clock.WaitForWaiters(context.Background(), 1)
			h.clock.Advance(10 * time.Second)
			h.waitFor("renewal", func() bool { return h.ops.count(relaytest.OpRenew) >= i })
		}
		peer, err := relaytest.Owned(h.store.AcquireBucketLeases(context.Background(), "peer", 1, 30*time.Second))
		if err != nil || len(peer) != 0 {
			t.Fatalf("peer acquisition during a renewed slow publish = %v, %v; want no buckets", peer, err)
		}
		close(release)
		h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
	})

	t.Run("pause_longer_than_the_lease_lets_a_peer_take_over_and_marks_nothing", func(t *testing.T) {
		h := newHarness(t, relay.Options{BucketCount: 1}, nil)
		h.store.Add(msgs(3, "t")...)
		h.ops.setBlock(relaytest.OpRenew, func(ctx context.Context) error { return errors.New("database unreachable") })
		release := make(chan struct{})
		h.pub.SetHandler(func(_ context.Context, b []*outbox.Message) relay.Result {
			<-release
			return relay.Result{Acknowledged: len(b)}
		})
		h.start()
		h.waitFor("publish started", func() bool { return len(h.pub.Calls()) == 1 })
		h.clock.Advance(31 * time.Second)
		peer, err := relaytest.Owned(h.store.AcquireBucketLeases(context.Background(), "peer", 1, 30*time.Second))
		if err != nil || !slices.Equal(peer, []int{0}) {
			t.Fatalf("peer acquisition after the pause = %v, %v; want [0]", peer, err)
		}
		close(release)
		h.waitIdle()
		if got := h.ops.count(relaytest.OpMarkPublished); got != 0 {
			t.Fatalf("MarkPublished calls after losing the lease = %d; want 0", got)
		}
		if got := h.store.Len(); got != 3 {
			t.Fatalf("pending after the paused publish = %d; want 3 (the peer's to publish)", got)
		}
	})

	t.Run("renewal_answer_after_the_old_lease_expired_counts_as_lost", func(t *testing.T) {
		renewing := make(chan struct{}, 1)
		answer := make(chan struct{})
		var late *lateRenewer
		h := newHarness(t, relay.Options{BucketCount: 1}, func(m *relaytest.MemStore) relay.Store {
			late = &lateRenewer{MemStore: m, renewing: renewing, answer: answer}
			return late
		})
		h.store.Add(msgs(3, "t")...)
		release := make(chan struct{})
		h.pub.SetHandler(func(_ context.Context, b []*outbox.Message) relay.Result {
			<-release
			return relay.Result{Acknowledged: len(b)}
		})
		h.start()
		h.waitFor("publish started", func() bool { return len(h.pub.Calls()) == 1 })
		h.clock.WaitForWaiters(context.Background(), 1)
		h.clock.Advance(10 * time.Second)
		<-renewing                        // the store renewed (true) at 10 s ...
		h.clock.Advance(21 * time.Second) // ... but the answer arrives at 31 s, after the old expiry
		close(answer)
		close(release)
		// Trusting the late answer would mark the first batch; dropping the
		// lease makes the relay reacquire and publish the rows again.
		h.waitFor("store empty", func() bool { return h.store.Len() == 0 })
		if got := len(h.pub.Calls()); got != 2 {
			t.Fatalf("publish calls = %d; want 2 (the batch under the late-renewed lease is not marked)", got)
		}
	})

	t.Run("publish_exceeding_max_publish_duration_is_fatal", func(t *testing.T) {
		h := newHarness(t, relay.Options{BucketCount: 1, MaxPublishDuration: 5 * time.Second}, nil)
		h.store.Add(msgs(3, "t")...)
		release := make(chan struct{})
		h.pub.SetHandler(func(_ context.Context, b []*outbox.Message) relay.Result {
			<-release
			return relay.Result{Acknowledged: len(b)}
		})
		h.start()
		h.waitFor("publish started", func() bool { return len(h.pub.Calls()) == 1 })
		h.clock.Advance(6 * time.Second)
		close(release)
		select {
		case err := <-h.done:
			h.done <- err
			if !errors.Is(err, relay.ErrMisconfigured) || !strings.Contains(err.Error(), "MaxPublishDuration") {
				t.Fatalf("Run = %v; want an ErrMisconfigured error naming MaxPublishDuration", err)
			}
		case <-time.After(waitLimit):
			t.Fatalf("Run did not return after a publish exceeded MaxPublishDuration")
		}
		if got := h.ops.count(relaytest.OpRelease); got != 1 {
			t.Fatalf("ReleaseBucketLeases calls after the fatal error = %d; want 1", got)
		}
	})

	t.Run("rows_in_an_unknown_bucket_are_fatal", func(t *testing.T) {
		h := newHarness(t, relay.Options{BucketCount: 2}, nil)
		h.store.AddToBucket(5, msgs(1, "t")...)
		h.start()
		select {
		case err := <-h.done:
			h.done <- err
			if !errors.Is(err, relay.ErrMisconfigured) {
				t.Fatalf("Run = %v; want an error wrapping ErrMisconfigured", err)
			}
		case <-time.After(waitLimit):
			t.Fatalf("Run did not return on misconfiguration")
		}
	})

	t.Run("poison_head_row_is_retried_alone_with_jittered_exponential_backoff", func(t *testing.T) {
		h := newHarness(t, relay.Options{BucketCount: 2, BatchSize: 2, ErrorBackoff: time.Second, LeaseRenewInterval: 8 * time.Second}, nil)
		poison := msgs(5, "poison")
		h.store.AddToBucket(0, poison...)
		h.pub.SetHandler(relaytest.FailWhere(func(m *outbox.Message) error {
			if m.ID == poison[0].ID {
				return errBroker
			}
			return nil
		}))
		h.start()
		h.waitFor("first attempt", func() bool { return len(h.pub.Calls()) == 1 })
		h.waitIdle()
		// Other buckets keep draining at full speed while bucket 0 backs off.
		h.store.AddToBucket(1, msgs(6, "healthy")...)
		h.r.Notifier().NotifyBucket(1)
		h.waitFor("bucket 1 drained", func() bool { return len(h.store.Pending(1)) == 0 })
		var attempts []time.Time
		attempts = append(attempts, h.clock.Now())
		for len(attempts) < 6 {
			before := len(poisonCalls(h.pub.Calls()))
			next, ok := h.clock.NextDeadline()
			if !ok {
				t.Fatalf("no timer while a head row backs off")
			}
			h.drainIdle()
			h.clock.Set(next)
			h.waitIdle()
			if pc := poisonCalls(h.pub.Calls()); len(pc) > before {
				attempts = append(attempts, h.clock.Now())
			}
		}
		for i, c := range poisonCalls(h.pub.Calls())[1:] {
			if len(c) != 1 || c[0].ID != poison[0].ID {
				t.Fatalf("retry %d sent %v; want the head row %d alone", i+1, ids(c), poison[0].ID)
			}
		}
		for i := 1; i < len(attempts); i++ {
			gap := attempts[i].Sub(attempts[i-1])
			cap := min(time.Second<<(i-1), 8*time.Second)
			if gap < cap/2 || gap > cap+time.Second { // +1 s: discovery ticks quantise the wake-up
				t.Fatalf("gap before retry %d = %v; want within [%v, %v]", i, gap, cap/2, cap)
			}
		}
	})

	t.Run("graceful_stop_waits_for_the_inflight_publish_marks_its_prefix_and_releases", func(t *testing.T) {
		h := newHarness(t, relay.Options{BucketCount: 1}, nil)
		h.store.Add(msgs(5, "t")...)
		all := ids(h.store.Pending(0))
		release := make(chan struct{})
		var pubErr error
		h.pub.SetHandler(func(ctx context.Context, b []*outbox.Message) relay.Result {
			<-release
			pubErr = ctx.Err()
			return relay.Result{Acknowledged: 3, Err: errBroker}
		})
		h.start()
		h.waitFor("publish started", func() bool { return len(h.pub.Calls()) == 1 })
		h.cancel()
		close(release)
		if err := h.stop(); err != nil {
			t.Fatalf("Run = %v; want nil after a graceful stop", err)
		}
		if pubErr != nil {
			t.Fatalf("publish context was cancelled by the stop (%v); want the in-flight publish awaited", pubErr)
		}
		if got := ids(h.store.Pending(0)); !slices.Equal(got, all[3:]) {
			t.Fatalf("pending after the stop = %v; want %v", got, all[3:])
		}
		peer, err := relaytest.Owned(h.store.AcquireBucketLeases(context.Background(), "peer", 1, 30*time.Second))
		if err != nil || !slices.Equal(peer, []int{0}) {
			t.Fatalf("peer acquisition right after the stop = %v, %v; want [0] at once", peer, err)
		}
	})

	t.Run("stop_during_the_delete_still_deletes_the_acknowledged_rows", func(t *testing.T) {
		h := newHarness(t, relay.Options{BucketCount: 1}, nil)
		h.store.Add(msgs(5, "t")...)
		deleting := make(chan struct{})
		stopped := make(chan struct{})
		var once sync.Once
		h.ops.setBlock(relaytest.OpMarkPublished, func(ctx context.Context) error {
			once.Do(func() {
				close(deleting)
				<-stopped // the stop arrives while the delete runs
			})
			return nil // the MemStore then fails the call if ctx is done
		})
		h.start()
		<-deleting
		h.cancel()
		close(stopped)
		if err := h.stop(); err != nil {
			t.Fatalf("Run = %v; want nil after a graceful stop", err)
		}
		if got := len(h.store.Pending(0)); got != 0 {
			t.Fatalf("pending after a stop during the delete = %d rows; want 0 (the next owner would republish them)", got)
		}
	})

	t.Run("a_failed_delete_is_retried_not_republished", func(t *testing.T) {
		h := newHarness(t, relay.Options{BucketCount: 1}, nil)
		h.store.Add(msgs(5, "t")...)
		var fails atomic.Int32
		h.ops.setBlock(relaytest.OpMarkPublished, func(context.Context) error {
			if fails.Add(1) <= 2 {
				return errors.New("lock wait timeout exceeded")
			}
			return nil
		})
		h.start()
		for i := 0; len(h.store.Pending(0)) > 0; i++ {
			if i == 10 {
				t.Fatalf("rows still pending after %d backoffs", i)
			}
			h.advanceIdle(time.Second) // ErrorBackoff
		}
		var published int
		for _, c := range h.pub.Calls() {
			published += len(c)
		}
		if published != 5 || fails.Load() != 3 {
			t.Fatalf("published %d records with %d MarkPublished calls; want 5 records (each once) and 3 calls (2 failed deletes retried)", published, fails.Load())
		}
	})

	t.Run("stop_timeout_bounds_the_whole_stop_not_each_step", func(t *testing.T) {
		// StopTimeout is far beyond waitLimit: only the manual clock can end
		// a step, so Run returns only if the three steps share one budget.
		const stopTimeout = time.Minute
		h := newHarness(t, relay.Options{BucketCount: 1, StopTimeout: stopTimeout, LeaseDuration: time.Hour}, nil)
		h.store.Add(msgs(5, "t")...)
		publishing, finish := make(chan struct{}), make(chan struct{})
		h.pub.SetHandler(func(ctx context.Context, b []*outbox.Message) relay.Result {
			close(publishing)
			<-finish
			return relay.Result{Acknowledged: 2, Err: errBroker}
		})
		marking, releasing := make(chan struct{}), make(chan struct{})
		blockUntilDone := func(entered chan struct{}) func(ctx context.Context) error {
			return func(ctx context.Context) error {
				close(entered)
				<-ctx.Done()
				return ctx.Err()
			}
		}
		h.ops.setBlock(relaytest.OpMarkPublished, blockUntilDone(marking))
		h.ops.setBlock(relaytest.OpRelease, blockUntilDone(releasing))
		h.start()
		<-publishing
		h.cancel()
		// Parked: the publish's renewal timer and the stop budget's timer.
		if !h.clock.WaitForWaiters(context.Background(), 2) {
			t.Fatal("no stop budget timer")
		}
		h.clock.Advance(stopTimeout / 3) // the in-flight publish takes a third
		close(finish)
		waitClosed(t, marking, "MarkPublished called")
		h.clock.Advance(stopTimeout - stopTimeout/3) // the rest of the budget
		if err := h.stop(); err != nil {
			t.Fatalf("Run = %v; want nil", err)
		}
		select {
		case <-releasing:
		default:
			t.Fatalf("ReleaseBucketLeases not called; want it within the budget")
		}
	})

	t.Run("release_keeps_a_quarter_of_the_stop_budget_after_a_publish_used_the_rest", func(t *testing.T) {
		const stopTimeout = time.Minute
		h := newHarness(t, relay.Options{BucketCount: 1, StopTimeout: stopTimeout}, nil)
		h.store.Add(msgs(5, "t")...)
		publishing := make(chan struct{})
		h.pub.SetHandler(func(ctx context.Context, b []*outbox.Message) relay.Result {
			close(publishing)
			<-ctx.Done() // a publish that only the stop budget ends
			return relay.Result{Err: ctx.Err()}
		})
		releasing := make(chan error, 1)
		h.ops.setBlock(relaytest.OpRelease, func(ctx context.Context) error {
			releasing <- ctx.Err()
			<-ctx.Done()
			return ctx.Err()
		})
		h.start()
		<-publishing
		h.cancel()
		if !h.clock.WaitForWaiters(context.Background(), 2) {
			t.Fatal("no stop budget timer")
		}
		h.clock.Advance(stopTimeout - stopTimeout/4)
		select {
		case err := <-releasing:
			if err != nil {
				t.Fatalf("release context at three quarters of the budget: %v; want a live context", err)
			}
		case <-time.After(waitLimit):
			t.Fatalf("publish not cancelled at three quarters of the stop budget; want the release started")
		}
		h.clock.Advance(stopTimeout / 4)
		if err := h.stop(); err != nil {
			t.Fatalf("Run = %v; want nil", err)
		}
	})

	t.Run("stop_before_the_first_acquisition_releases_nothing", func(t *testing.T) {
		h := newHarness(t, relay.Options{}, nil)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := h.r.Run(ctx); err != nil {
			t.Fatalf("Run(cancelled ctx) = %v; want nil", err)
		}
		if got := h.ops.count(relaytest.OpRelease); got != 0 {
			t.Fatalf("ReleaseBucketLeases calls = %d; want 0", got)
		}
	})

	t.Run("second_concurrent_run_is_an_error", func(t *testing.T) {
		h := newHarness(t, relay.Options{}, nil)
		h.start()
		h.waitIdle()
		if err := h.r.Run(context.Background()); err == nil {
			t.Fatalf("second Run = nil; want an error")
		}
	})

	t.Run("relay_owning_nothing_checks_the_fleet_and_discovers_nothing", func(t *testing.T) {
		h := newHarness(t, relay.Options{BucketCount: 1}, nil)
		if _, err := h.store.AcquireBucketLeases(context.Background(), "peer", 1, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		h.start()
		h.waitIdle()
		next, ok := h.clock.NextDeadline()
		if want := t0.Add(relay.DefaultPollInterval); !ok || !next.Equal(want) {
			t.Fatalf("idle deadline of a relay owning nothing = %v (%v); want the fleet check at %v", next, ok, want)
		}
		h.advanceIdle(relay.DefaultPollInterval)
		if got := h.ops.count(relaytest.OpFleet); got != 1 {
			t.Fatalf("fleet checks a poll interval after the round = %d; want 1", got)
		}
		if got := h.ops.count(relaytest.OpBucketsWithPending); got != 0 {
			t.Fatalf("discovery queries of a relay owning nothing = %d; want 0", got)
		}
	})
}

func TestNotifications(t *testing.T) {
	// setup: a peer holds buckets 0-3, the relay under test owns 4-7, and
	// polling is effectively off (an hour).
	setup := func(t *testing.T) *harness {
		h := newHarness(t, relay.Options{PollInterval: time.Hour}, nil)
		ctx := context.Background()
		if _, err := h.store.AcquireBucketLeases(ctx, "peer", 8, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		h.start()
		h.waitIdle() // owns nothing yet: the peer holds everything
		if _, err := h.store.AcquireBucketLeases(ctx, "peer", 8, 30*time.Second); err != nil {
			t.Fatal(err) // sheds 4-7
		}
		h.advanceIdle(10 * time.Second) // rebalance: takes 4-7
		if got := h.store.Owners(); got[4] != "relay-a" || got[0] != "peer" {
			t.Fatalf("owners = %v; want peer on 0-3, relay-a on 4-7", got)
		}
		return h
	}

	t.Run("hint_for_an_owned_bucket_wakes_the_relay_before_the_poll_interval", func(t *testing.T) {
		h := setup(t)
		h.store.AddToBucket(5, msgs(2, "t")...)
		h.r.Notifier().NotifyBucket(5)
		h.waitFor("bucket 5 published", func() bool { return len(h.store.Pending(5)) == 0 })
	})

	t.Run("hint_for_a_bucket_it_does_not_own_does_not_wake_it", func(t *testing.T) {
		h := setup(t)
		h.store.AddToBucket(1, msgs(2, "t")...)
		h.r.Notifier().NotifyBucket(1)
		h.r.Notifier().NotifyBuckets([]int{2, 3, 99})
		if relay.WakePending(h.r.Notifier()) {
			t.Fatalf("a hint for a peer's bucket left a wake-up pending; want none")
		}
	})

	t.Run("unknown_bucket_notification_triggers_discovery", func(t *testing.T) {
		h := setup(t)
		h.store.AddToBucket(6, msgs(2, "t")...)
		h.r.Notifier().NotifyCommitted()
		h.waitFor("bucket 6 published", func() bool { return len(h.store.Pending(6)) == 0 })
	})

	t.Run("notification_racing_the_idle_wait_is_not_lost", func(t *testing.T) {
		h := setup(t)
		h.store.AddToBucket(4, msgs(1, "first")...)
		entered := make(chan struct{})
		release := make(chan struct{})
		var once sync.Once
		h.pub.SetHandler(func(_ context.Context, b []*outbox.Message) relay.Result {
			once.Do(func() { close(entered); <-release })
			return relay.Result{Acknowledged: len(b)}
		})
		h.r.Notifier().NotifyBucket(4)
		<-entered
		// The relay is busy (not waiting) when the commit lands.
		h.store.AddToBucket(7, msgs(1, "second")...)
		h.r.Notifier().NotifyBucket(7)
		close(release)
		h.waitFor("bucket 7 published without a clock move", func() bool { return len(h.store.Pending(7)) == 0 })
	})

	t.Run("nil_and_unattached_notifiers_ignore_calls", func(t *testing.T) {
		setDefaultLogger(t) // the unattached notifier's warning
		var nilN *relay.Notifier
		nilN.NotifyCommitted()
		nilN.NotifyBucket(3)
		nilN.NotifyBuckets([]int{1})
		n := relay.NewNotifier()
		n.NotifyBucket(3)
		n.NotifyCommitted()
		if relay.WakePending(n) {
			t.Fatalf("an unattached notifier holds a wake-up; want none")
		}
	})
}

// waitClosed waits for ch to be closed by the relay's goroutine.
func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitLimit):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func bucketsOf(calls [][]*outbox.Message) []int32 {
	var out []int32
	for _, c := range calls {
		out = append(out, c[0].Bucket)
	}
	return out
}

func poisonCalls(calls [][]*outbox.Message) [][]*outbox.Message {
	var out [][]*outbox.Message
	for _, c := range calls {
		if c[0].Topic == "poison" {
			out = append(out, c)
		}
	}
	return out
}

// lateRenewer renews in the MemStore, then holds the (true) answer until
// the test releases it.
type lateRenewer struct {
	*relaytest.MemStore
	renewing chan<- struct{}
	answer   <-chan struct{}
}

func (l *lateRenewer) RenewBucketLeases(ctx context.Context, id string, buckets []int, d time.Duration) (bool, error) {
	ok, err := l.MemStore.RenewBucketLeases(ctx, id, buckets, d)
	l.renewing <- struct{}{}
	<-l.answer
	return ok, err
}
