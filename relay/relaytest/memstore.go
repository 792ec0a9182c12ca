package relaytest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// Operation names passed to MemStore.Hook.
const (
	OpAcquire            = "AcquireBucketLeases"
	OpRenew              = "RenewBucketLeases"
	OpRelease            = "ReleaseBucketLeases"
	OpBucketsWithPending = "BucketsWithPending"
	OpNextBatches        = "NextBatches"
	OpMarkPublished      = "MarkPublished"
	OpPendingMetrics     = "PendingMetrics"
	OpFleet              = "Fleet"
	OpPark               = "Park"
	OpListParked         = "ListParked"
	OpRequeueParked      = "RequeueParked"
	OpDeleteParked       = "DeleteParked"
)

// MemStore is an in-memory relay.Store and relay.ParkAdmin. It keeps
// leases, heartbeats and fair share (relay.Shares) like a database store,
// with expiry read from an injected clock. It is safe for concurrent use.
type MemStore struct {
	now func() time.Time
	n   int
	*memShared
}

// memShared is the state every view of a MemStore shares (see WithClock).
type memShared struct {
	mu     sync.Mutex
	hook   func(ctx context.Context, op string) error
	nextID int64
	rows   map[int][]*outbox.Message // bucket → rows in ID order
	leases map[int]memLease
	relays map[string]*memRelay

	parked  map[int64]memPark // parked rows by id
	corrupt map[int64]error   // why each undecodable row (AddCorrupt) cannot be decoded, by id
	noFleet bool              // Fleet reports CanPark false (see SetFleetCanPark)
	window  time.Duration     // the latest round's lease duration: Fleet's liveness window
}

type memLease struct {
	owner   string
	expires time.Time
}

type memRelay struct {
	lastSeen  time.Time
	stoppedAt time.Time // when it was released; zero: live
}

// NewMemStore returns an empty store for bucketCount buckets whose leases
// and heartbeats use now (nil means time.Now); tests pass a ManualClock's
// Now.
func NewMemStore(bucketCount int, now func() time.Time) *MemStore {
	if now == nil {
		now = time.Now
	}
	return &MemStore{now: now, n: bucketCount, memShared: &memShared{rows: map[int][]*outbox.Message{}, leases: map[int]memLease{}, relays: map[string]*memRelay{},
		parked: map[int64]memPark{}, corrupt: map[int64]error{}}}
}

// WithClock returns a view of s whose leases and heartbeats read now
// instead: the same rows, leases and relays, as another process with its
// own clock sees them (the conformance kit replays a late statement so).
func (s *MemStore) WithClock(now func() time.Time) *MemStore {
	return &MemStore{now: now, n: s.n, memShared: s.memShared}
}

// SetHook installs h, called at the start of every store call with the
// operation name (Op…): a non-nil error becomes the call's error, and h may
// block (honouring ctx) to simulate a slow database. Nil removes the hook.
func (s *MemStore) SetHook(h func(ctx context.Context, op string) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hook = h
}

// enter starts a store call: it runs the hook, then, unless the call fails,
// locks s for the caller to unlock.
func (s *MemStore) enter(ctx context.Context, op string) error {
	s.mu.Lock()
	h := s.hook
	s.mu.Unlock()
	if h != nil {
		if err := h(ctx, op); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	return nil
}

// Add enqueues msgs as outbox.Plugin would: it fills ID (increasing),
// MessageID (when zero), CreatedAt (when zero, from the store's clock) and
// Bucket (outbox.BucketOf). The store keeps the given pointers.
func (s *MemStore) Add(msgs ...*outbox.Message) {
	for _, m := range msgs {
		if m.MessageID.IsZero() {
			m.MessageID = outbox.NewUUID()
		}
		m.Bucket = outbox.BucketOf(m.Key, m.Partition, m.MessageID, s.n)
	}
	s.add(msgs)
}

// AddToBucket enqueues msgs into bucket, as a writer with another bucket
// count might (bucket may be out of range to simulate misconfiguration).
func (s *MemStore) AddToBucket(bucket int, msgs ...*outbox.Message) {
	for _, m := range msgs {
		if m.MessageID.IsZero() {
			m.MessageID = outbox.NewUUID()
		}
		m.Bucket = int32(bucket)
	}
	s.add(msgs)
}

func (s *MemStore) add(msgs []*outbox.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for _, m := range msgs {
		s.nextID++
		m.ID = s.nextID
		if m.CreatedAt.IsZero() {
			m.CreatedAt = now.UTC()
		}
		b := int(m.Bucket)
		s.rows[b] = append(s.rows[b], m)
	}
}

// Len returns the number of messages in all buckets, parked ones included
// (see Parked).
func (s *MemStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.rows {
		n += len(r)
	}
	return n
}

// Pending returns the messages of bucket in ID order, parked ones included
// (see Parked).
func (s *MemStore) Pending(bucket int) []*outbox.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.rows[bucket])
}

// Owners returns the owner of every bucket with an unexpired lease.
func (s *MemStore) Owners() map[int]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	out := map[int]string{}
	for b, l := range s.leases {
		if l.owner != "" && now.Before(l.expires) {
			out[b] = l.owner
		}
	}
	return out
}

// BucketCount implements relay.Store.
func (s *MemStore) BucketCount() int { return s.n }

// ClockOffset implements relay.Store: a MemStore's leases run on the clock
// it was given, so it reports none.
func (s *MemStore) ClockOffset() (offset, uncertainty time.Duration, ok bool) { return 0, 0, false }

// AcquireBucketLeases implements relay.Store: heartbeat, then take or keep
// relayID's fair share of free or expired leases, from its
// relay.ClaimStart on, freeing any excess. A relay that was released
// (stopped) gets nothing from a round that started before its release (by
// the store's clock); a later round is a restart.
func (s *MemStore) AcquireBucketLeases(ctx context.Context, relayID string, bucketCount int, leaseDuration time.Duration) (relay.Leases, error) {
	if err := s.enter(ctx, OpAcquire); err != nil {
		return relay.Leases{}, err
	}
	defer s.mu.Unlock()
	if bucketCount != s.n {
		return relay.Leases{}, fmt.Errorf("relaytest: bucket count %d, the store's is %d: %w", bucketCount, s.n, relay.ErrMisconfigured)
	}
	for b, rows := range s.rows {
		if len(rows) > 0 && (b < 0 || b >= bucketCount) {
			return relay.Leases{}, fmt.Errorf("relaytest: %d rows in bucket %d, outside [0, %d): %w", len(rows), b, bucketCount, relay.ErrMisconfigured)
		}
	}
	now := s.now()
	s.window = leaseDuration
	rel := s.relays[relayID]
	if rel == nil {
		rel = &memRelay{}
		s.relays[relayID] = rel
	}
	if !rel.stoppedAt.IsZero() && !now.After(rel.stoppedAt) {
		return relay.Leases{Owned: []int{}}, nil // a late statement of a stopped relay changes nothing
	}
	rel.stoppedAt, rel.lastSeen = time.Time{}, now // a later round is a restart
	held := s.liveLocked(now)
	var mine []int
	others := 0
	for b := 0; b < bucketCount; b++ {
		l := s.leases[b]
		if l.owner == "" || !now.Before(l.expires) {
			continue
		}
		if _, ok := held[l.owner]; ok {
			held[l.owner]++
			others++
		}
		if l.owner == relayID {
			mine = append(mine, b)
		}
	}
	others -= len(mine)
	share := relay.Shares(bucketCount, held)[relayID]
	for _, b := range mine[min(share, len(mine)):] {
		delete(s.leases, b)
	}
	mine = mine[:min(share, len(mine))]
	start := relay.ClaimStart(bucketCount, relayID, held)
	for i := 0; i < bucketCount && len(mine) < share; i++ {
		b := (start + i) % bucketCount
		l := s.leases[b]
		if l.owner == "" || !now.Before(l.expires) {
			mine = append(mine, b)
		}
	}
	slices.Sort(mine)
	for _, b := range mine {
		s.leases[b] = memLease{owner: relayID, expires: now.Add(leaseDuration)}
	}
	return relay.Leases{Owned: mine, Share: share, Relays: len(held), Unowned: bucketCount - others - len(mine)}, nil
}

// liveLocked returns the live relays (a heartbeat within the latest round's
// lease duration, not stopped), each with 0; s.mu is held.
func (s *MemStore) liveLocked(now time.Time) map[string]int {
	held := map[string]int{}
	for id, r := range s.relays {
		if r.stoppedAt.IsZero() && now.Sub(r.lastSeen) < s.window {
			held[id] = 0
		}
	}
	return held
}

// RenewBucketLeases implements relay.Store: all or nothing.
func (s *MemStore) RenewBucketLeases(ctx context.Context, relayID string, buckets []int, leaseDuration time.Duration) (bool, error) {
	if err := s.enter(ctx, OpRenew); err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	now := s.now()
	rel := s.relays[relayID]
	if rel == nil || !rel.stoppedAt.IsZero() {
		return false, nil
	}
	for _, b := range buckets {
		l := s.leases[b]
		if l.owner != relayID || !now.Before(l.expires) {
			return false, nil
		}
	}
	rel.lastSeen = now
	for _, b := range buckets {
		if e := now.Add(leaseDuration); e.After(s.leases[b].expires) {
			s.leases[b] = memLease{owner: relayID, expires: e}
		}
	}
	return true, nil
}

// ReleaseBucketLeases implements relay.Store: the relay is marked
// stopped, then its leases are freed.
func (s *MemStore) ReleaseBucketLeases(ctx context.Context, relayID string) error {
	if err := s.enter(ctx, OpRelease); err != nil {
		return err
	}
	defer s.mu.Unlock()
	rel := s.relays[relayID]
	if rel == nil {
		rel = &memRelay{}
		s.relays[relayID] = rel
	}
	rel.stoppedAt = s.now()
	for b, l := range s.leases {
		if l.owner == relayID {
			delete(s.leases, b)
		}
	}
	return nil
}

// BucketsWithPending implements relay.Store.
func (s *MemStore) BucketsWithPending(ctx context.Context, buckets []int) ([]int, error) {
	if err := s.enter(ctx, OpBucketsWithPending); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var out []int
	for _, b := range buckets {
		if slices.ContainsFunc(s.rows[b], func(m *outbox.Message) bool { return !s.isParked(m.ID) }) {
			out = append(out, b)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// NextBatches implements relay.Store (one OpNextBatches). It answers each
// request with copies of the stored messages of its buckets, oldest first
// across them, skipping parked rows, the rows behind a parked row of their
// key (see relay.BatchRequest) and those of Exclude (by ID), and stops
// after the row that brings the batch's relay.MessageSize total beyond
// MaxBytes (when MaxBytes > 0). A corrupt row (AddCorrupt) ends the
// answer, with its *relay.CorruptRowError.
func (s *MemStore) NextBatches(ctx context.Context, reqs []relay.BatchRequest) ([]relay.BatchResult, error) {
	if err := s.enter(ctx, OpNextBatches); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	out := make([]relay.BatchResult, len(reqs))
	for i, req := range reqs {
		gone := make(map[int64]bool, len(req.Exclude))
		for _, m := range req.Exclude {
			gone[m.ID] = true
		}
		var rows []*outbox.Message
		for _, b := range req.Buckets {
			rows = append(rows, s.scan(b, req.Limit, gone)...)
		}
		slices.SortFunc(rows, func(a, b *outbox.Message) int { return cmp.Compare(a.ID, b.ID) })
		var total int64
		for _, m := range rows {
			if len(out[i].Rows) >= req.Limit || req.MaxBytes > 0 && total > req.MaxBytes {
				break
			}
			if err := s.corrupt[m.ID]; err != nil {
				out[i].Err = &relay.CorruptRowError{ID: m.ID, Bucket: int(m.Bucket), Err: err}
				break
			}
			out[i].Rows = append(out[i].Rows, m)
			total += relay.MessageSize(m)
		}
	}
	return out, nil
}

// scan returns copies of up to limit rows of bucket that a fetch may
// return, without those of gone; a corrupt row ends them, as the last.
func (s *MemStore) scan(bucket, limit int, gone map[int64]bool) []*outbox.Message {
	var out []*outbox.Message
	held := map[string]bool{} // keys behind a parked row that holds them: one that is not corrupt
	for _, m := range s.rows[bucket] {
		if len(out) >= limit {
			break
		}
		if p, ok := s.parked[m.ID]; ok {
			if m.Key != nil && !strings.HasPrefix(p.reason, relay.CorruptReasonPrefix) {
				held[string(m.Key)] = true
			}
			continue
		}
		if m.Key != nil && held[string(m.Key)] || gone[m.ID] {
			continue
		}
		c := *m
		out = append(out, &c)
		if s.corrupt[m.ID] != nil {
			break
		}
	}
	return out
}

// MarkPublished implements relay.Store: it deletes the given messages, by
// ID, leaving parked rows alone.
func (s *MemStore) MarkPublished(ctx context.Context, published []*outbox.Message) error {
	if err := s.enter(ctx, OpMarkPublished); err != nil {
		return err
	}
	defer s.mu.Unlock()
	ids, buckets := make(map[int64]bool, len(published)), map[int]int{}
	for _, m := range published {
		ids[m.ID] = true
		buckets[int(m.Bucket)]++
	}
	del := func(m *outbox.Message) bool { return ids[m.ID] && !s.isParked(m.ID) }
	for b, n := range buckets {
		rows, k := s.rows[b], 0
		for k < n && k < len(rows) && del(rows[k]) { // the usual case: the head of the bucket
			k++
		}
		clear(rows[:k])
		if s.rows[b] = rows[k:]; k < n {
			s.rows[b] = slices.DeleteFunc(rows[k:], del)
		}
	}
	return nil
}

// PendingMetrics implements relay.Store.
func (s *MemStore) PendingMetrics(ctx context.Context) (*relay.Pending, error) {
	if err := s.enter(ctx, OpPendingMetrics); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	p := &relay.Pending{Parked: int64(len(s.parked))}
	for _, rows := range s.rows {
		for _, m := range rows {
			if s.isParked(m.ID) {
				continue
			}
			p.Count++
			if p.Oldest.IsZero() || m.CreatedAt.Before(p.Oldest) {
				p.Oldest = m.CreatedAt
			}
		}
	}
	return p, nil
}

var (
	_ relay.Store     = (*MemStore)(nil)
	_ relay.ParkAdmin = (*MemStore)(nil)
)

// Owned returns l.Owned and err: it reads the buckets an acquisition round
// granted, as in got, err := relaytest.Owned(s.AcquireBucketLeases(…)).
func Owned(l relay.Leases, err error) ([]int, error) { return l.Owned, err }
