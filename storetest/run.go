package storetest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
	"github.com/gorm-outbox/outbox/relay/relaytest"
)

// LeaseDuration is the lease duration the kit acquires with.
const LeaseDuration = 30 * time.Second

// Start is the manual clock's starting time in every scenario.
var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Run runs every Store scenario as a subtest of t, each on a fresh backend
// from newHarness. Scenarios that need a capability the store says it
// lacks (parking, backlog metrics, a clock of its own, a known bucket
// count: see relay.Store), relay.ParkAdmin, or a Harness hook left nil are
// skipped with a message naming it.
func Run(t *testing.T, newHarness Factory) {
	t.Helper()
	scenarios := []scenario{
		{"single_relay_gets_every_bucket", singleRelayGetsEveryBucket},
		{"renewal_extends_expiry", renewalExtendsExpiry},
		{"expired_leases_are_claimed_by_a_new_relay", expiredLeasesAreClaimed},
		{"two_relays_converge_to_halves_and_three_on_8_to_3_3_2_without_starving_the_joiner", threeRelaysConverge},
		{"more_relays_than_buckets_leave_the_extra_ones_with_none", moreRelaysThanBuckets},
		{"stopped_relay_late_statement_changes_nothing_and_a_peer_takes_all", stoppedRelayLateStatement},
		{"next_batch_returns_oldest_rows_of_one_bucket_in_id_order_and_buckets_with_pending_the_requested_ones_with_rows", nextBatchOrder},
		{"rows_outside_the_bucket_range_are_a_misconfiguration", rowsOutsideRange},
		{"a_lease_table_of_16_buckets_refuses_a_relay_of_8_uncounted", otherBucketCount(16)},
		{"a_lease_table_of_4_buckets_refuses_a_relay_of_8_uncounted", otherBucketCount(4)},
		{"relays_claim_free_buckets_from_their_own_starting_points", claimStarts},
		{"fleet_counts_the_live_relays_and_a_fleet_of_current_relays_can_park", fleetCountsLiveRelays},
		{"transient_heartbeat_failure_is_returned_and_the_next_round_works", transientFailure(StepHeartbeat)},
		{"transient_seed_failure_is_returned_and_the_next_round_works", transientFailure(StepSeed)},
		{"backlog_metrics_report_count_and_oldest", backlogMetrics},
		{"randomised_relays_never_share_a_live_bucket", randomisedRun},
		{"clock_offset_is_reported_after_an_acquisition", clockOffsetIsReportedAfterAnAcquisition},
	}
	scenarios = append(scenarios, parkScenarios...)
	scenarios = append(scenarios, multiScenarios...)
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) { sc.run(t, newHarness) })
	}
}

// scenario is a named check of a store, run as a subtest on a fresh backend.
type scenario struct {
	name string
	run  func(t *testing.T, f Factory)
}

// env is one scenario's backend, clock and context.
type env struct {
	t     *testing.T
	h     *Harness
	n     int
	clock *relaytest.ManualClock
	ctx   context.Context
	seq   int
}

func newEnv(t *testing.T, f Factory, n int) *env {
	t.Helper()
	h := f(t, n)
	if h == nil || h.NewStore == nil || h.Insert == nil {
		t.Fatal("storetest: the factory returned a Harness without NewStore or Insert")
	}
	return &env{t: t, h: h, n: n, clock: relaytest.NewManualClock(start), ctx: t.Context()}
}

// relayOf is one simulated relay: an id and its own store.
type relayOf struct {
	id string
	s  relay.Store
}

func (e *env) relay(id string) *relayOf {
	return &relayOf{id: id, s: e.h.NewStore(e.clock.Now)}
}

func (e *env) acquire(r *relayOf) []int {
	e.t.Helper()
	l, err := r.s.AcquireBucketLeases(e.ctx, r.id, e.n, LeaseDuration)
	if err != nil {
		e.t.Fatalf("AcquireBucketLeases(%s) error: %v", r.id, err)
	}
	if !slices.IsSorted(l.Owned) {
		e.t.Fatalf("AcquireBucketLeases(%s).Owned = %v; want ascending order", r.id, l.Owned)
	}
	if l.Relays < 0 || l.Share < 0 || l.Share > e.n || l.Unowned < 0 || l.Unowned+len(l.Owned) > e.n {
		e.t.Fatalf("AcquireBucketLeases(%s) = %+v; want 0 ≤ Share ≤ %d, Relays ≥ 0, Unowned ≥ 0 and at most the buckets it does not own", r.id, l, e.n)
	}
	return l.Owned
}

func (e *env) leases() map[int]Lease {
	e.t.Helper()
	ls, err := e.h.Leases(e.ctx)
	if err != nil {
		e.t.Fatalf("Harness.Leases: %v", err)
	}
	m := make(map[int]Lease, len(ls))
	for _, l := range ls {
		m[l.Bucket] = l
	}
	return m
}

func (e *env) msg(bucket int, created time.Time) *outbox.Message {
	e.seq++
	return &outbox.Message{
		MessageID: outbox.NewUUID(),
		Bucket:    int32(bucket),
		Topic:     "storetest",
		Key:       []byte("key-" + strconv.Itoa(e.seq)),
		Value:     []byte("value-" + strconv.Itoa(e.seq)),
		CreatedAt: created.UTC(),
	}
}

func (e *env) insert(msgs ...*outbox.Message) {
	e.t.Helper()
	if err := e.h.Insert(e.ctx, msgs); err != nil {
		e.t.Fatalf("Harness.Insert: %v", err)
	}
}

func all(n int) []int {
	b := make([]int, n)
	for i := range b {
		b[i] = i
	}
	return b
}

// converge runs rounds of rs in order, advancing the clock by a second
// between rounds, for cycles cycles, and returns each relay's last result.
func (e *env) converge(cycles int, rs ...*relayOf) map[string][]int {
	e.t.Helper()
	got := map[string][]int{}
	for range cycles {
		for _, r := range rs {
			got[r.id] = e.acquire(r)
			e.clock.Advance(time.Second)
		}
	}
	return got
}

// checkPartition fails unless owned are disjoint, cover all n buckets, and
// have the sizes wanted (by relay id).
func (e *env) checkPartition(owned map[string][]int, sizes map[string]int) {
	e.t.Helper()
	seen := map[int]string{}
	for id, bs := range owned {
		if len(bs) != sizes[id] {
			e.t.Errorf("relay %s owns %v (%d buckets); want %d buckets", id, bs, len(bs), sizes[id])
		}
		for _, b := range bs {
			if other, ok := seen[b]; ok {
				e.t.Errorf("bucket %d owned by both %s and %s; want one owner", b, other, id)
			}
			seen[b] = id
		}
	}
	if len(seen) != e.n {
		e.t.Errorf("relays own %d distinct buckets (%v); want all %d", len(seen), owned, e.n)
	}
}

func singleRelayGetsEveryBucket(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	a := e.relay("relay-a")
	if got := e.acquire(a); !slices.Equal(got, all(8)) {
		t.Fatalf("first round: AcquireBucketLeases = %v; want %v", got, all(8))
	}
	e.clock.Advance(LeaseDuration / 3)
	if got := e.acquire(a); !slices.Equal(got, all(8)) {
		t.Fatalf("second round: AcquireBucketLeases = %v; want %v", got, all(8))
	}
	if e.h.Leases != nil {
		want := e.clock.Now().Add(LeaseDuration)
		for b, l := range e.leases() {
			if b < 0 || b >= 8 {
				continue
			}
			if l.Owner != a.id || l.ExpiresAt.Before(want) {
				t.Errorf("lease %d = %s until %v; want %s until %v", b, l.Owner, l.ExpiresAt, a.id, want)
			}
		}
	}
}

func renewalExtendsExpiry(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	a := e.relay("relay-a")
	owned := e.acquire(a)
	e.clock.Advance(LeaseDuration / 2)
	renewedAt := e.clock.Now()
	if ok, err := a.s.RenewBucketLeases(e.ctx, a.id, owned, LeaseDuration); err != nil || !ok {
		t.Fatalf("RenewBucketLeases(held leases) = %v, %v; want true, nil", ok, err)
	}
	if e.h.Leases != nil {
		for _, b := range owned {
			if l := e.leases()[b]; l.Owner != a.id || l.ExpiresAt.Before(renewedAt.Add(LeaseDuration)) {
				t.Errorf("after renewal lease %d = %s until %v; want %s until %v", b, l.Owner, l.ExpiresAt, a.id, renewedAt.Add(LeaseDuration))
			}
		}
	}
	// Past the original expiry but within the renewed one: a peer gets nothing.
	e.clock.Set(start.Add(LeaseDuration + time.Second))
	b := e.relay("relay-b")
	if got := e.acquire(b); len(got) != 0 {
		t.Fatalf("peer after the original expiry: AcquireBucketLeases = %v; want none (renewed)", got)
	}
	// Past the renewed expiry the peer takes over and a's renewal reports loss.
	e.clock.Set(renewedAt.Add(LeaseDuration + time.Millisecond))
	if got := e.acquire(b); !slices.Equal(got, all(8)) {
		t.Fatalf("peer after the renewed expiry: AcquireBucketLeases = %v; want %v", got, all(8))
	}
	if ok, err := a.s.RenewBucketLeases(e.ctx, a.id, owned, LeaseDuration); err != nil || ok {
		t.Fatalf("RenewBucketLeases(lost leases) = %v, %v; want false, nil", ok, err)
	}
	// Partial: b renews its own buckets plus one of a peer's. (a's failed
	// renewal still refreshed its heartbeat: let it go quiet first.)
	e.clock.Advance(LeaseDuration + time.Millisecond)
	c := e.relay("relay-c")
	got := e.converge(3, b, c)
	e.checkPartition(got, map[string]int{b.id: 4, c.id: 4})
	partial := append(slices.Clone(got[b.id]), got[c.id][0])
	if ok, err := b.s.RenewBucketLeases(e.ctx, b.id, partial, LeaseDuration); err != nil || ok {
		t.Fatalf("RenewBucketLeases(own leases plus a peer's) = %v, %v; want false, nil", ok, err)
	}
	// Renewing at the instant of the acquisition changes no expiry and is
	// still a success.
	own := e.acquire(c)
	if ok, err := c.s.RenewBucketLeases(e.ctx, c.id, own, LeaseDuration); err != nil || !ok {
		t.Fatalf("RenewBucketLeases(at the acquisition instant) = %v, %v; want true, nil", ok, err)
	}
	// A lease that expired, even if nobody claimed it yet, is lost.
	e.clock.Advance(LeaseDuration)
	if ok, err := c.s.RenewBucketLeases(e.ctx, c.id, own, LeaseDuration); err != nil || ok {
		t.Fatalf("RenewBucketLeases(expired, unclaimed leases) = %v, %v; want false, nil", ok, err)
	}
}

func expiredLeasesAreClaimed(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	a, b := e.relay("relay-a"), e.relay("relay-b")
	e.acquire(a)
	e.clock.Advance(LeaseDuration - time.Millisecond)
	if got := e.acquire(b); len(got) != 0 {
		t.Fatalf("before expiry: AcquireBucketLeases(b) = %v; want none", got)
	}
	e.clock.Advance(2 * time.Millisecond)
	if got := e.acquire(b); !slices.Equal(got, all(8)) {
		t.Fatalf("after a's expiry: AcquireBucketLeases(b) = %v; want %v at once", got, all(8))
	}
	if got := e.acquire(a); len(got) != 0 {
		t.Fatalf("a returning after losing its leases: AcquireBucketLeases(a) = %v; want none until b releases", got)
	}
}

func threeRelaysConverge(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	a, b := e.relay("relay-a"), e.relay("relay-b")
	e.checkPartition(e.converge(3, a, b), map[string]int{a.id: 4, b.id: 4})
	// The joiner sorts first by id: the remainder still goes to incumbents.
	j := e.relay("relay-0")
	first := e.converge(1, j, a, b)
	if len(first[j.id]) != 0 {
		t.Fatalf("joiner's first round = %v; want none (all leases held)", first[j.id])
	}
	second := e.converge(1, j)
	if len(second[j.id]) == 0 {
		t.Fatalf("joiner's second round = none; want buckets released by the incumbents (starved)")
	}
	got := e.converge(3, j, a, b)
	e.checkPartition(got, map[string]int{j.id: 2, a.id: 3, b.id: 3})
}

func moreRelaysThanBuckets(t *testing.T, f Factory) {
	e := newEnv(t, f, 2)
	rs := []*relayOf{e.relay("relay-a"), e.relay("relay-b"), e.relay("relay-c")}
	got := e.converge(4, rs...)
	sizes := []int{len(got["relay-a"]), len(got["relay-b"]), len(got["relay-c"])}
	slices.Sort(sizes)
	if !slices.Equal(sizes, []int{0, 1, 1}) {
		t.Fatalf("3 relays on 2 buckets own %v; want sizes 0, 1, 1", got)
	}
	e.checkPartition(got, map[string]int{"relay-a": len(got["relay-a"]), "relay-b": len(got["relay-b"]), "relay-c": len(got["relay-c"])})
}

func stoppedRelayLateStatement(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	a, b := e.relay("relay-a"), e.relay("relay-b")
	e.converge(3, a, b)
	late := e.clock.Now() // a's next round started here, before its release
	e.clock.Advance(time.Second)
	if err := a.s.ReleaseBucketLeases(e.ctx, a.id); err != nil {
		t.Fatalf("ReleaseBucketLeases(a) error: %v", err)
	}
	var before map[int]Lease
	if e.h.Leases != nil {
		before = e.leases()
	}
	lateA := &relayOf{id: a.id, s: e.h.NewStore(func() time.Time { return late })}
	if got := e.acquire(lateA); len(got) != 0 {
		t.Fatalf("late round of the stopped relay = %v; want none", got)
	}
	if ok, err := lateA.s.RenewBucketLeases(e.ctx, a.id, []int{0}, LeaseDuration); err != nil || ok {
		t.Fatalf("late renewal of the stopped relay = %v, %v; want false, nil", ok, err)
	}
	if before != nil {
		if after := e.leases(); !maps.EqualFunc(before, after, func(v, w Lease) bool { return v.Owner == w.Owner && v.ExpiresAt.Equal(w.ExpiresAt) }) {
			t.Fatalf("late statements changed the leases: %v; want %v", after, before)
		}
	}
	if got := e.acquire(b); !slices.Equal(got, all(8)) {
		t.Fatalf("peer after the release: AcquireBucketLeases = %v; want %v at once", got, all(8))
	}
	// The same id started again later is a live relay again.
	e.clock.Advance(time.Second)
	got := e.converge(3, a, b)
	e.checkPartition(got, map[string]int{a.id: 4, b.id: 4})
}

// next reads bucket's batch (see answer).
func (e *env) next(s relay.Store, bucket, limit int, maxBytes int64) ([]*outbox.Message, error) {
	return e.answer(s, relay.BatchRequest{Buckets: []int{bucket}, Limit: limit, MaxBytes: maxBytes})
}

// answer is the rows and error of NextBatches' answer to req alone.
func (e *env) answer(s relay.Store, req relay.BatchRequest) ([]*outbox.Message, error) {
	res, err := s.NextBatches(e.ctx, []relay.BatchRequest{req})
	if err != nil || len(res) != 1 {
		return nil, cmp.Or(err, fmt.Errorf("NextBatches(1 request) = %d results", len(res)))
	}
	return res[0].Rows, res[0].Err
}

func ids(msgs []*outbox.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.MessageID.String()
	}
	return out
}

func nextBatchOrder(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	var one, two []*outbox.Message
	for i, b := range []int{1, 2, 1, 1, 2, 1, 1, 5} {
		m := e.msg(b, start.Add(time.Duration(i)*time.Second))
		e.insert(m)
		if b == 1 {
			one = append(one, m)
		} else if b == 2 {
			two = append(two, m)
		}
	}
	s := e.relay("relay-a").s
	got, err := e.next(s, 1, 3, 0)
	if err != nil {
		t.Fatalf("NextBatches(bucket 1, 3) error: %v", err)
	}
	if !slices.Equal(ids(got), ids(one[:3])) {
		t.Fatalf("NextBatches(bucket 1, 3) = %v; want the oldest three %v", ids(got), ids(one[:3]))
	}
	for i, m := range got {
		w := one[i]
		if m.Bucket != 1 || m.Topic != w.Topic || string(m.Key) != string(w.Key) || string(m.Value) != string(w.Value) {
			t.Errorf("NextBatches row %d = bucket %d topic %q key %q value %q; want bucket 1 topic %q key %q value %q",
				i, m.Bucket, m.Topic, m.Key, m.Value, w.Topic, w.Key, w.Value)
		}
	}
	if got, err := e.next(s, 1, 100, 0); err != nil || !slices.Equal(ids(got), ids(one)) {
		t.Fatalf("NextBatches(bucket 1, 100) = %v, %v; want %v", ids(got), err, ids(one))
	}
	if got, err := e.next(s, 2, 100, 0); err != nil || !slices.Equal(ids(got), ids(two)) {
		t.Fatalf("NextBatches(bucket 2, 100) = %v, %v; want %v", ids(got), err, ids(two))
	}
	if got, err := e.next(s, 3, 100, 0); err != nil || len(got) != 0 {
		t.Fatalf("NextBatches(empty bucket 3) = %d rows, %v; want 0", len(got), err)
	}
	for _, c := range []struct{ ask, want []int }{
		{[]int{0, 1, 2, 3}, []int{1, 2}},
		{[]int{7, 5}, []int{5}},
		{[]int{0, 3, 4}, nil},
		{nil, nil},
		{all(8), []int{1, 2, 5}},
	} {
		if got, err := s.BucketsWithPending(e.ctx, c.ask); err != nil || !slices.Equal(got, c.want) {
			t.Errorf("BucketsWithPending(%v) = %v, %v; want %v", c.ask, got, err, c.want)
		}
	}
}

func rowsOutsideRange(t *testing.T, f Factory) {
	for _, bad := range []int{11, 8, -1} {
		t.Run(fmt.Sprintf("bucket_%d", bad), func(t *testing.T) {
			e := newEnv(t, f, 8)
			e.insert(e.msg(3, start), e.msg(bad, start))
			a := e.relay("relay-a")
			_, err := a.s.AcquireBucketLeases(e.ctx, a.id, 8, LeaseDuration)
			if !errors.Is(err, relay.ErrMisconfigured) {
				t.Fatalf("AcquireBucketLeases with a row in bucket %d = %v; want an error wrapping relay.ErrMisconfigured", bad, err)
			}
			if msg := err.Error(); !strings.Contains(msg, strconv.Itoa(bad)) || !strings.Contains(msg, "8") {
				t.Errorf("error %q; want it to name bucket %d and the bucket count 8", msg, bad)
			}
		})
	}
	t.Run("bucket_count_argument_differs", func(t *testing.T) {
		e := newEnv(t, f, 8)
		a := e.relay("relay-a")
		if got := a.s.BucketCount(); got == 0 {
			t.Skip("storetest: the store does not know its bucket count (BucketCount() = 0)")
		} else if got != 8 {
			t.Fatalf("BucketCount() = %d; want 8", got)
		}
		if _, err := a.s.AcquireBucketLeases(e.ctx, a.id, 16, LeaseDuration); !errors.Is(err, relay.ErrMisconfigured) {
			t.Fatalf("AcquireBucketLeases(bucketCount 16) on an 8-bucket store = %v; want relay.ErrMisconfigured", err)
		}
	})
}

// otherBucketCount seeds the lease rows of a table of count buckets: a
// relay of 8 is refused, naming both counts, before it records a heartbeat.
func otherBucketCount(count int) func(t *testing.T, f Factory) {
	return func(t *testing.T, f Factory) {
		e := newEnv(t, f, 8)
		if e.h.SetLease == nil {
			t.Skip("storetest: Harness.SetLease is nil")
		}
		for b := range count {
			if err := e.h.SetLease(e.ctx, Lease{Bucket: b}); err != nil {
				t.Fatalf("Harness.SetLease(%d): %v", b, err)
			}
		}
		a := e.relay("relay-a")
		l, err := a.s.AcquireBucketLeases(e.ctx, a.id, 8, LeaseDuration)
		if !errors.Is(err, relay.ErrMisconfigured) || !strings.Contains(err.Error(), strconv.Itoa(count)) || !strings.Contains(err.Error(), "8") {
			t.Fatalf("AcquireBucketLeases(8) on a lease table of %d buckets = %+v, %v; want an error wrapping ErrMisconfigured naming %d and 8", count, l, err, count)
		}
		if fl, err := a.s.Fleet(e.ctx); err != nil || fl.Relays != 0 {
			t.Fatalf("Fleet after the refused round = %+v, %v; want 0 relays (a refused relay is no peer)", fl, err)
		}
	}
}

// claimStarts: relay-b and relay-c are live and every bucket is free;
// relay-c, second of two, claims its share from the middle.
func claimStarts(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	a, b, c := e.relay("relay-a"), e.relay("relay-b"), e.relay("relay-c")
	e.acquire(a)
	e.acquire(b)
	e.acquire(c)
	if err := a.s.ReleaseBucketLeases(e.ctx, a.id); err != nil {
		t.Fatalf("ReleaseBucketLeases(relay-a): %v", err)
	}
	e.clock.Advance(time.Second)
	if got := e.acquire(c); !slices.Equal(got, []int{4, 5, 6, 7}) {
		t.Fatalf("relay-c's round with relay-b live and every bucket free = %v; want [4 5 6 7] (relay.ClaimStart)", got)
	}
	if got := e.acquire(b); !slices.Equal(got, []int{0, 1, 2, 3}) {
		t.Fatalf("relay-b's round = %v; want [0 1 2 3]", got)
	}
}

// fleetCountsLiveRelays: Fleet counts relays with a recent heartbeat that
// have not stopped, as a round does; a store that can park with no relay
// alive can for a fleet of its own relays.
func fleetCountsLiveRelays(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	a, b := e.relay("relay-a"), e.relay("relay-b")
	fl, err := a.s.Fleet(e.ctx)
	if err != nil {
		t.Fatalf("Fleet: %v", err)
	}
	canPark := fl.CanPark
	fleet := func(want int, when string) {
		t.Helper()
		if fl, err := a.s.Fleet(e.ctx); err != nil || fl.Relays != want || fl.CanPark != canPark {
			t.Fatalf("Fleet %s = %+v, %v; want %d relays, CanPark %v", when, fl, err, want, canPark)
		}
	}
	e.acquire(a)
	fleet(1, "after relay-a's round")
	if l, err := b.s.AcquireBucketLeases(e.ctx, b.id, 8, LeaseDuration); err != nil || l.Relays != 2 || l.Share != 4 || len(l.Owned) != 0 || l.Unowned != 0 {
		t.Fatalf("relay-b's first round = %+v, %v; want 2 relays, share 4, none owned (relay-a holds all), none unowned", l, err)
	}
	fleet(2, "after relay-b's round")
	if err := b.s.ReleaseBucketLeases(e.ctx, b.id); err != nil {
		t.Fatalf("ReleaseBucketLeases(relay-b): %v", err)
	}
	fleet(1, "after relay-b's release")
	e.clock.Advance(LeaseDuration + time.Second)
	fleet(0, "a lease duration after relay-a's last round")
	if l, err := b.s.AcquireBucketLeases(e.ctx, b.id, 8, LeaseDuration); err != nil || l.Relays != 1 || len(l.Owned) != 8 || l.Unowned != 0 {
		t.Fatalf("relay-b's round once relay-a's leases expired = %+v, %v; want 1 relay, all 8 owned, none unowned", l, err)
	}
}

func transientFailure(step Step) func(t *testing.T, f Factory) {
	return func(t *testing.T, f Factory) {
		e := newEnv(t, f, 8)
		if e.h.FailNext == nil {
			t.Skip("storetest: Harness.FailNext is nil")
		}
		a := e.relay("relay-a")
		if step != StepSeed {
			e.acquire(a)
			e.clock.Advance(time.Second)
		}
		e.h.FailNext(step)
		if got, err := a.s.AcquireBucketLeases(e.ctx, a.id, 8, LeaseDuration); err == nil {
			t.Fatalf("AcquireBucketLeases with a failing %s = %v, nil; want the error", step, got)
		} else if errors.Is(err, relay.ErrMisconfigured) {
			t.Fatalf("AcquireBucketLeases with a failing %s = %v; want a transient error, not ErrMisconfigured", step, err)
		}
		if got := e.acquire(a); !slices.Equal(got, all(8)) {
			t.Fatalf("round after the failure: AcquireBucketLeases = %v; want %v", got, all(8))
		}
	}
}

func backlogMetrics(t *testing.T, f Factory) {
	e := newEnv(t, f, 8)
	s := e.relay("relay-a").s
	got, err := s.PendingMetrics(e.ctx)
	if err == nil && got == nil {
		t.Skip("storetest: the store has no backlog metrics (PendingMetrics returns nil)")
	}
	if err != nil || got == nil || got.Count != 0 || !got.Oldest.IsZero() {
		t.Fatalf("PendingMetrics(empty) = %+v, %v; want count 0, zero oldest", got, err)
	}
	oldest := start.Add(-2 * time.Hour)
	e.insert(e.msg(1, start.Add(-time.Hour)), e.msg(3, oldest), e.msg(1, start.Add(-30*time.Minute)))
	got, err = s.PendingMetrics(e.ctx)
	if err != nil || got == nil || got.Count != 3 || !got.Oldest.Equal(oldest) {
		t.Fatalf("PendingMetrics = %+v, %v; want count 3, oldest %v", got, err, oldest)
	}
	batch, err := e.next(s, 3, 10, 0)
	if err != nil || len(batch) != 1 {
		t.Fatalf("NextBatches(bucket 3) = %d rows, %v; want 1", len(batch), err)
	}
	if err := s.MarkPublished(e.ctx, batch); err != nil {
		t.Fatalf("MarkPublished(bucket 3) error: %v", err)
	}
	got, err = s.PendingMetrics(e.ctx)
	if want := start.Add(-time.Hour); err != nil || got == nil || got.Count != 2 || !got.Oldest.Equal(want) {
		t.Fatalf("PendingMetrics after publishing the oldest = %+v, %v; want count 2, oldest %v", got, err, want)
	}
}
