package relaytest

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// memPark is the parked mark of a row.
type memPark struct {
	at     time.Time
	reason string
}

// memCorrupt is what makes a row undecodable.
type memCorrupt struct {
	messageID string // as stored
	err       error
}

// CorruptMessageID is the stored message id of the rows AddCorrupt adds.
const CorruptMessageID = "not-a-uuid"

// AddCorrupt enqueues into bucket a row the store cannot decode (its stored
// message id is CorruptMessageID, not a UUID), with key key (nil: keyless)
// and topic "corrupt", and returns its id. NextBatches returns the rows
// before it with a *relay.CorruptRowError naming it.
func (s *MemStore) AddCorrupt(bucket int, key []byte) int64 {
	m := &outbox.Message{Topic: "corrupt", Key: key, Bucket: int32(bucket)}
	s.add([]*outbox.Message{m})
	s.mu.Lock()
	defer s.mu.Unlock()
	s.corrupt[m.ID] = memCorrupt{messageID: CorruptMessageID, err: fmt.Errorf("message id %q is not a UUID", CorruptMessageID)}
	return m.ID
}

// Repair makes the corrupt row id decodable again, as an operator's fix of
// the stored row would; its parked mark is left as it is.
func (s *MemStore) Repair(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.corrupt, id)
}

// SetFleetCanPark sets what Fleet reports in CanPark (true until set otherwise).
func (s *MemStore) SetFleetCanPark(ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noFleet = !ok
}

// Parked returns every parked row in (bucket, id) order, as ListParked
// does, without calling the hook.
func (s *MemStore) Parked() []relay.ParkedRow {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listParkedLocked(0)
}

// ParkedIDs returns the ids of the parked rows of bucket, in id order.
func (s *MemStore) ParkedIDs(bucket int) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int64
	for _, m := range s.rows[bucket] {
		if s.isParked(m.ID) {
			out = append(out, m.ID)
		}
	}
	return out
}

func (s *MemStore) isParked(id int64) bool {
	_, ok := s.parked[id]
	return ok
}

// Fleet implements relay.Store: the live relays, CanPark true unless
// SetFleetCanPark(false).
func (s *MemStore) Fleet(ctx context.Context) (relay.Fleet, error) {
	if err := s.enter(ctx, OpFleet); err != nil {
		return relay.Fleet{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return relay.Fleet{Relays: len(s.liveLocked(s.now())), CanPark: !s.noFleet}, nil
}

// row returns row id of bucket, or nil.
func (s *MemStore) row(bucket int, id int64) *outbox.Message {
	rows := s.rows[bucket]
	i, ok := slices.BinarySearchFunc(rows, id, func(m *outbox.Message, id int64) int { return cmp.Compare(m.ID, id) })
	if !ok {
		return nil
	}
	return rows[i]
}

// Park implements relay.Store: the row is parked only while relayID holds
// bucket's lease unexpired on the store's clock.
func (s *MemStore) Park(ctx context.Context, relayID string, bucket int, id int64, reason string) error {
	if err := s.enter(ctx, OpPark); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if l := s.leases[bucket]; l.owner != relayID || !now.Before(l.expires) {
		return fmt.Errorf("relaytest: bucket %d: park row %d: %w", bucket, id, relay.ErrLeaseLost)
	}
	if s.row(bucket, id) != nil && !s.isParked(id) {
		s.parked[id] = memPark{at: now.UTC(), reason: reason}
	}
	return nil
}

// holds reports whether parked row p of a keyed row holds the later rows of
// its key (see relay.BatchRequest): unless it is corrupt.
func holds(p memPark) bool { return !strings.HasPrefix(p.reason, relay.CorruptReasonPrefix) }

// ListParked implements relay.ParkAdmin.
func (s *MemStore) ListParked(ctx context.Context, limit int) ([]relay.ParkedRow, error) {
	if err := s.enter(ctx, OpListParked); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listParkedLocked(limit), nil
}

func (s *MemStore) listParkedLocked(limit int) []relay.ParkedRow {
	var out []relay.ParkedRow
	for _, b := range slices.Sorted(mapKeys(s.rows)) {
		for _, m := range s.rows[b] {
			p, ok := s.parked[m.ID]
			if !ok {
				continue
			}
			if limit > 0 && len(out) == limit {
				return out
			}
			id := m.MessageID.String()
			if c, ok := s.corrupt[m.ID]; ok {
				id = c.messageID
			}
			out = append(out, relay.ParkedRow{
				ID: m.ID, MessageID: id, Bucket: b, Topic: m.Topic, Key: bytes.Clone(m.Key),
				Size: len(m.Value) + len(m.Key), CreatedAt: m.CreatedAt, ParkedAt: p.at, Reason: p.reason,
			})
		}
	}
	return out
}

func mapKeys[V any](m map[int]V) func(func(int) bool) {
	return func(yield func(int) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// chosen returns bucket → ids of the parked rows sel chooses
// (relay.ParkedSelector.Choose).
func (s *MemStore) chosen(sel relay.ParkedSelector) map[int][]int64 {
	out := map[int][]int64{}
	for _, r := range sel.Choose(s.listParkedLocked(0)) {
		out[r.Bucket] = append(out[r.Bucket], r.ID)
	}
	return out
}

// RequeueParked implements relay.ParkAdmin.
func (s *MemStore) RequeueParked(ctx context.Context, sel relay.ParkedSelector) (int64, error) {
	if err := sel.Validate(); err != nil {
		return 0, err
	}
	if err := s.enter(ctx, OpRequeueParked); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, ids := range s.chosen(sel) {
		for _, id := range ids {
			delete(s.parked, id)
			n++
		}
	}
	return n, nil
}

// DeleteParked implements relay.ParkAdmin.
func (s *MemStore) DeleteParked(ctx context.Context, sel relay.ParkedSelector) (int64, error) {
	if err := sel.Validate(); err != nil {
		return 0, err
	}
	if err := s.enter(ctx, OpDeleteParked); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for b, ids := range s.chosen(sel) {
		gone := map[int64]bool{}
		for _, id := range ids {
			gone[id] = true
			delete(s.parked, id)
			delete(s.corrupt, id)
			n++
		}
		s.rows[b] = slices.DeleteFunc(s.rows[b], func(m *outbox.Message) bool { return gone[m.ID] })
	}
	return n, nil
}
