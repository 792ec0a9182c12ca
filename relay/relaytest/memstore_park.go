package relaytest

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/relay"
)

// memPark is the parked mark of a row.
type memPark struct {
	at     time.Time
	reason string
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
	s.corrupt[m.ID] = fmt.Errorf("message id %q is not a UUID", CorruptMessageID)
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
	defer s.mu.Unlock()
	return relay.Fleet{Relays: len(s.liveLocked(s.now())), CanPark: !s.noFleet}, nil
}

// Park implements relay.Store: the row is parked only while relayID holds
// bucket's lease unexpired on the store's clock.
func (s *MemStore) Park(ctx context.Context, relayID string, bucket int, id int64, reason string) error {
	if err := s.enter(ctx, OpPark); err != nil {
		return err
	}
	defer s.mu.Unlock()
	now := s.now()
	if l := s.leases[bucket]; l.owner != relayID || !now.Before(l.expires) {
		return fmt.Errorf("relaytest: bucket %d: park row %d: %w", bucket, id, relay.ErrLeaseLost)
	}
	_, found := slices.BinarySearchFunc(s.rows[bucket], id, func(m *outbox.Message, id int64) int { return cmp.Compare(m.ID, id) })
	if found && !s.isParked(id) {
		s.parked[id] = memPark{at: now.UTC(), reason: reason}
	}
	return nil
}

// ListParked implements relay.ParkAdmin.
func (s *MemStore) ListParked(ctx context.Context, limit int) ([]relay.ParkedRow, error) {
	if err := s.enter(ctx, OpListParked); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	return s.listParkedLocked(limit), nil
}

func (s *MemStore) listParkedLocked(limit int) []relay.ParkedRow {
	var out []relay.ParkedRow
	for _, b := range slices.Sorted(maps.Keys(s.rows)) {
		for _, m := range s.rows[b] {
			p, ok := s.parked[m.ID]
			if !ok {
				continue
			}
			if limit > 0 && len(out) == limit {
				return out
			}
			id := m.MessageID.String()
			if s.corrupt[m.ID] != nil {
				id = CorruptMessageID
			}
			out = append(out, relay.ParkedRow{
				ID: m.ID, MessageID: id, Bucket: b, Topic: m.Topic, Key: bytes.Clone(m.Key),
				Size: len(m.Value) + len(m.Key), CreatedAt: m.CreatedAt, ParkedAt: p.at, Reason: p.reason,
			})
		}
	}
	return out
}

// RequeueParked implements relay.ParkAdmin.
func (s *MemStore) RequeueParked(ctx context.Context, sel relay.ParkedSelector) (int64, error) {
	return s.unpark(ctx, OpRequeueParked, sel, false)
}

// DeleteParked implements relay.ParkAdmin.
func (s *MemStore) DeleteParked(ctx context.Context, sel relay.ParkedSelector) (int64, error) {
	return s.unpark(ctx, OpDeleteParked, sel, true)
}

// unpark clears the parked mark of the rows sel chooses, deleting them too
// when del is set.
func (s *MemStore) unpark(ctx context.Context, op string, sel relay.ParkedSelector, del bool) (int64, error) {
	if err := sel.Validate(); err != nil {
		return 0, err
	}
	if err := s.enter(ctx, op); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	chosen := sel.Choose(s.listParkedLocked(0))
	for _, r := range chosen {
		delete(s.parked, r.ID)
		if del {
			delete(s.corrupt, r.ID)
			s.rows[r.Bucket] = slices.DeleteFunc(s.rows[r.Bucket], func(m *outbox.Message) bool { return m.ID == r.ID })
		}
	}
	return int64(len(chosen)), nil
}
