package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// Backend is the shared state every relay's Store talks to: in a real
// store, the database (MongoDB, DynamoDB, Redis, …). Here it is memory
// behind a mutex; each method of Store marks the single statement or
// conditional write a database backend would use.
type Backend struct {
	buckets int

	mu       sync.Mutex
	nextID   int64
	window   time.Duration             // the latest round's lease duration: Fleet's liveness window
	rows     map[int][]*outbox.Message // bucket → pending rows in ID order
	leases   map[int]lease             // bucket → lease (rows outside the range may exist)
	relays   map[string]*heartbeat     // relay id → heartbeat
	failNext map[string]bool           // injected transient failures (tests)
}

type lease struct {
	owner   string
	expires time.Time
}

type heartbeat struct {
	lastSeen  time.Time
	stoppedAt time.Time // zero: live
}

// NewBackend returns an empty backend for bucketCount buckets.
func NewBackend(bucketCount int) *Backend {
	return &Backend{
		buckets:  bucketCount,
		rows:     map[int][]*outbox.Message{},
		leases:   map[int]lease{},
		relays:   map[string]*heartbeat{},
		failNext: map[string]bool{},
	}
}

// Insert is what a writer does: append rows to their bucket. Bucket and
// MessageID must be set (outbox.BucketOf); ID is assigned here.
func (b *Backend) Insert(msgs ...*outbox.Message) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range msgs {
		b.nextID++
		c := *m
		c.ID = b.nextID
		b.rows[int(c.Bucket)] = append(b.rows[int(c.Bucket)], &c)
	}
}

// Store is one relay's view of the Backend. It implements relay.Store,
// saying what it lacks through the contract: it cannot park rows
// (Fleet reports CanPark false: a row the broker never accepts stops its bucket)
// and has no clock of its own (its leases run on the relays' clocks). Each
// relay gets its own Store; now is its clock (injected so that the
// conformance kit can move time).
type Store struct {
	b   *Backend
	now func() time.Time
}

// NewStore returns a Store on b reading time from now (nil: time.Now).
func NewStore(b *Backend, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{b: b, now: now}
}

var _ relay.Store = (*Store)(nil)

// BucketCount implements relay.Store.
func (s *Store) BucketCount() int { return s.b.buckets }

// ClockOffset implements relay.Store: the leases run on the relays' clocks
// (now), so there is no offset to report.
func (s *Store) ClockOffset() (offset, uncertainty time.Duration, ok bool) { return 0, 0, false }

// Park implements relay.Store; the relay never calls it while Fleet
// reports CanPark false.
func (s *Store) Park(context.Context, string, int, int64, string) error {
	return errors.New("customstore: parking is not supported")
}

// AcquireBucketLeases implements relay.Store: one acquisition round.
func (s *Store) AcquireBucketLeases(ctx context.Context, relayID string, bucketCount int, leaseDuration time.Duration) (relay.Leases, error) {
	if err := ctx.Err(); err != nil {
		return relay.Leases{}, err
	}
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	// Misconfiguration is loud: a relay or a writer with another bucket count.
	if bucketCount != b.buckets {
		return relay.Leases{}, fmt.Errorf("customstore: bucket count %d, the backend's is %d: %w", bucketCount, b.buckets, relay.ErrMisconfigured)
	}
	for bucket, rows := range b.rows {
		if len(rows) > 0 && (bucket < 0 || bucket >= bucketCount) {
			return relay.Leases{}, fmt.Errorf("customstore: %d rows in bucket %d, outside [0, %d): %w", len(rows), bucket, bucketCount, relay.ErrMisconfigured)
		}
	}
	// 1. The fleet's bucket count is the lease rows' (0…N−1): seed an empty
	// lease table (INSERT … ON CONFLICT DO NOTHING), refuse another count,
	// both before the heartbeat, so that a refused relay is never a peer.
	top := -1
	for i := range b.leases {
		top = max(top, i)
	}
	switch {
	case top < 0:
		if b.fail("seed") {
			return relay.Leases{}, errors.New("customstore: seed: injected failure")
		}
		for i := range bucketCount {
			b.leases[i] = lease{}
		}
	case top+1 != bucketCount:
		return relay.Leases{}, fmt.Errorf("customstore: the lease table holds %d buckets and this relay's count is %d: %w", top+1, bucketCount, relay.ErrMisconfigured)
	}
	now := s.now()
	// 2. Heartbeat, unless the relay stopped after this statement began (a
	// late statement of a stopped relay must change nothing).
	if b.fail("heartbeat") {
		return relay.Leases{}, errors.New("customstore: heartbeat: injected failure")
	}
	hb := b.relays[relayID]
	if hb == nil {
		hb = &heartbeat{}
		b.relays[relayID] = hb
	}
	if !hb.stoppedAt.IsZero() && !now.After(hb.stoppedAt) {
		return relay.Leases{}, nil
	}
	hb.stoppedAt, hb.lastSeen = time.Time{}, now
	// 3. Count what each live relay holds (live: a heartbeat within one
	// lease duration), and this relay's fair share (relay.Shares).
	held := b.live(now, leaseDuration)
	var mine []int
	others := 0
	for i := range bucketCount {
		l := b.leases[i]
		if l.owner == "" || !now.Before(l.expires) {
			continue
		}
		if _, live := held[l.owner]; live {
			held[l.owner]++
			others++
		}
		if l.owner == relayID {
			mine = append(mine, i)
			others--
		}
	}
	share := relay.Shares(bucketCount, held)[relayID]
	// 4. Free the excess (UPDATE … WHERE owner = me), then claim free or
	// expired leases from this relay's own starting point (UPDATE … WHERE
	// expires <= now), and extend the ones kept — never backwards.
	for len(mine) > share {
		b.leases[mine[len(mine)-1]] = lease{}
		mine = mine[:len(mine)-1]
	}
	start := relay.ClaimStart(bucketCount, relayID, held)
	for i := 0; i < bucketCount && len(mine) < share; i++ {
		if l := b.leases[(start+i)%bucketCount]; l.owner == "" || !now.Before(l.expires) {
			mine = append(mine, (start+i)%bucketCount)
		}
	}
	slices.Sort(mine)
	for _, i := range mine {
		exp := now.Add(leaseDuration)
		if l := b.leases[i]; l.owner == relayID && l.expires.After(exp) {
			exp = l.expires
		}
		b.leases[i] = lease{owner: relayID, expires: exp}
	}
	b.window = leaseDuration
	return relay.Leases{Owned: mine, Share: share, Relays: len(held), Unowned: bucketCount - others - len(mine)}, nil
}

// live returns the relays with a heartbeat within window that have not
// stopped, each holding 0.
func (b *Backend) live(now time.Time, window time.Duration) map[string]int {
	held := map[string]int{}
	for id, r := range b.relays {
		if r.stoppedAt.IsZero() && now.Sub(r.lastSeen) < window {
			held[id] = 0
		}
	}
	return held
}

// Fleet implements relay.Store: the live relays; this store cannot park
// rows.
func (s *Store) Fleet(ctx context.Context) (relay.Fleet, error) {
	if err := ctx.Err(); err != nil {
		return relay.Fleet{}, err
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	return relay.Fleet{Relays: len(s.b.live(s.now(), s.b.window))}, nil
}

// RenewBucketLeases implements relay.Store: all or nothing.
func (s *Store) RenewBucketLeases(ctx context.Context, relayID string, buckets []int, leaseDuration time.Duration) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	now := s.now()
	hb := b.relays[relayID]
	if hb == nil || !hb.stoppedAt.IsZero() {
		return false, nil
	}
	for _, i := range buckets {
		if l := b.leases[i]; l.owner != relayID || !now.Before(l.expires) {
			return false, nil
		}
	}
	hb.lastSeen = now
	for _, i := range buckets {
		if exp := now.Add(leaseDuration); exp.After(b.leases[i].expires) {
			b.leases[i] = lease{owner: relayID, expires: exp}
		}
	}
	return true, nil
}

// ReleaseBucketLeases implements relay.Store: mark the relay
// stopped first, then free its leases.
func (s *Store) ReleaseBucketLeases(ctx context.Context, relayID string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	hb := b.relays[relayID]
	if hb == nil {
		hb = &heartbeat{}
		b.relays[relayID] = hb
	}
	hb.stoppedAt = s.now()
	for i, l := range b.leases {
		if l.owner == relayID {
			b.leases[i] = lease{}
		}
	}
	return nil
}

// BucketsWithPending implements relay.Store.
func (s *Store) BucketsWithPending(ctx context.Context, buckets []int) ([]int, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	var out []int
	for _, i := range buckets {
		if len(s.b.rows[i]) > 0 {
			out = append(out, i)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// NextBatches implements relay.Store: for each request, the oldest rows of
// its buckets that it does not leave out (SELECT … WHERE bucket IN (…) AND
// id NOT IN (…) ORDER BY id LIMIT ?), stopping after the row that crosses
// MaxBytes.
func (s *Store) NextBatches(ctx context.Context, reqs []relay.BatchRequest) ([]relay.BatchResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	out := make([]relay.BatchResult, len(reqs))
	for i, r := range reqs {
		var rows []*outbox.Message
		for _, bucket := range r.Buckets {
			rows = append(rows, s.b.rows[bucket]...)
		}
		slices.SortFunc(rows, func(x, y *outbox.Message) int { return cmp.Compare(x.ID, y.ID) })
		var size int64
		for _, m := range rows {
			if len(out[i].Rows) >= r.Limit || r.MaxBytes > 0 && size > r.MaxBytes {
				break
			}
			if !slices.ContainsFunc(r.Exclude, func(x *outbox.Message) bool { return x.ID == m.ID }) {
				c := *m
				out[i].Rows = append(out[i].Rows, &c)
				size += relay.MessageSize(m)
			}
		}
	}
	return out, nil
}

// MarkPublished implements relay.Store: delete the acknowledged rows, of
// any buckets, by ID (DELETE … WHERE id IN (…)).
func (s *Store) MarkPublished(ctx context.Context, published []*outbox.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	ids, buckets := make(map[int64]bool, len(published)), map[int]bool{}
	for _, m := range published {
		ids[m.ID], buckets[int(m.Bucket)] = true, true
	}
	for bucket := range buckets {
		s.b.rows[bucket] = slices.DeleteFunc(s.b.rows[bucket], func(m *outbox.Message) bool { return ids[m.ID] })
	}
	return nil
}

// PendingMetrics implements relay.Store.
func (s *Store) PendingMetrics(ctx context.Context) (*relay.Pending, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	p := &relay.Pending{}
	for _, rows := range s.b.rows {
		p.Count += int64(len(rows))
		for _, m := range rows {
			if p.Oldest.IsZero() || m.CreatedAt.Before(p.Oldest) {
				p.Oldest = m.CreatedAt
			}
		}
	}
	return p, nil
}

// fail reports (and consumes) an injected failure of step. b.mu is held.
func (b *Backend) fail(step string) bool {
	if b.failNext[step] {
		delete(b.failNext, step)
		return true
	}
	return false
}
