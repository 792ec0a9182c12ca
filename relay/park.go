// Parking: its contract, and the relay's strikes of a failing head row.

package relay

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gorm-outbox/outbox"
)

var (
	// ErrUnpublishable is wrapped by a publish error that will recur for the
	// row as stored, never a transient one; the default ParkPolicy parks it.
	ErrUnpublishable = errors.New("the broker will never accept this row as stored")
	// ErrLeaseLost is wrapped by the error of Store.Park when the relay no
	// longer holds the bucket's lease: the relay drops the bucket.
	ErrLeaseLost = errors.New("the relay no longer holds the bucket's lease")
)

const (
	// CorruptReasonPrefix starts the reason of a row parked because the
	// store could not decode it; such a row holds no later rows of its key.
	CorruptReasonPrefix = "corrupt row: "
	// HeldReasonPrefix starts the reason of a row that an earlier release
	// parked behind a parked row of its key (whose id follows).
	HeldReasonPrefix = "held behind parked row "
)

// CorruptRowError is returned by Store.NextBatches (BatchResult.Err) for a
// row that cannot be decoded. The relay parks it, once it is its bucket's
// head, with a reason starting with CorruptReasonPrefix.
type CorruptRowError struct {
	ID     int64
	Bucket int
	Err    error // the decoding error
}

func (e *CorruptRowError) Error() string {
	return fmt.Sprintf("bucket %d: row %d cannot be decoded: %v", e.Bucket, e.ID, e.Err)
}

func (e *CorruptRowError) Unwrap() error { return e.Err }

// ParkPolicy says which publish failures park a row (see Options.ParkPolicy).
type ParkPolicy int

const (
	// ParkUnpublishable, the default, parks a row that failed ParkAfter
	// times with ErrUnpublishable: a broker outage parks nothing.
	ParkUnpublishable ParkPolicy = iota
	// ParkNever parks no failing row: one the broker never accepts stops
	// its bucket. Corrupt rows are still parked.
	ParkNever
	// ParkAnyFailure parks a row after ParkAfter failures of any kind.
	ParkAnyFailure
)

func (p ParkPolicy) String() string {
	if names := []string{"unpublishable", "never", "any-failure"}; p >= 0 && int(p) < len(names) {
		return names[p]
	}
	return fmt.Sprintf("ParkPolicy(%d)", int(p))
}

// ParkedRow is a parked row as ParkAdmin lists it.
type ParkedRow struct {
	ID        int64
	MessageID string // as stored (a corrupt row's may not be a UUID)
	Bucket    int
	Topic     string
	Key       []byte
	Size      int // of the value plus the key, in bytes
	CreatedAt time.Time
	ParkedAt  time.Time
	Reason    string
}

// ParkedSelector chooses parked rows (see Choose); exactly one field is set.
type ParkedSelector struct {
	// ID chooses one row. A corrupt (reason starting with
	// CorruptReasonPrefix) or keyless row is chosen alone; any other row
	// chooses every parked row of its key in its bucket that is not
	// corrupt, so that the key's order is kept.
	ID int64
	// Key chooses every parked row of this key (an empty non-nil key is a
	// key), in every bucket, corrupt ones included.
	Key []byte
	All bool // chooses every parked row
}

// Choose returns the rows of parked (all the store's) that s chooses, in order.
func (s ParkedSelector) Choose(parked []ParkedRow) []ParkedRow {
	var out []ParkedRow
	switch {
	case s.All:
		return slices.Clone(parked)
	case s.Key != nil:
		for _, r := range parked {
			if r.Key != nil && bytes.Equal(r.Key, s.Key) {
				out = append(out, r)
			}
		}
		return out
	}
	i := slices.IndexFunc(parked, func(r ParkedRow) bool { return r.ID == s.ID })
	if i < 0 {
		return nil
	}
	chosen := parked[i]
	if chosen.parkedAlone() {
		return []ParkedRow{chosen}
	}
	for _, r := range parked {
		if r.Bucket == chosen.Bucket && r.Key != nil && bytes.Equal(r.Key, chosen.Key) && !r.parkedAlone() {
			out = append(out, r)
		}
	}
	return out
}

func (r ParkedRow) parkedAlone() bool {
	return r.Key == nil || strings.HasPrefix(r.Reason, CorruptReasonPrefix)
}

// Validate reports an error when not exactly one field of s is set.
func (s ParkedSelector) Validate() error {
	n := 0
	for _, set := range []bool{s.ID != 0, s.Key != nil, s.All} {
		if set {
			n++
		}
	}
	if n != 1 || s.ID < 0 {
		return errors.New("relay: a ParkedSelector needs exactly one of ID (> 0), Key or All")
	}
	return nil
}

// ParkAdmin lists, requeues and deletes parked rows, safe while relays
// run; requeued rows flow again ahead of later rows of their key.
type ParkAdmin interface {
	// ListParked returns up to limit parked rows (≤ 0: all) by (bucket, id).
	ListParked(ctx context.Context, limit int) ([]ParkedRow, error)
	// RequeueParked unparks the chosen rows and returns how many it did.
	RequeueParked(ctx context.Context, sel ParkedSelector) (int64, error)
	// DeleteParked deletes the chosen parked rows and returns how many.
	DeleteParked(ctx context.Context, sel ParkedSelector) (int64, error)
}

// strike counts the failures of a head row published alone that the ParkPolicy counts.
type strike struct {
	id       int64 // the row
	n        int
	deferred bool // "parking deferred" was logged for this row
}

// parkCorrupt parks an undecodable head row when the fleet can park; else it is a store error.
func (bk *bucket) parkCorrupt(ctx context.Context, ce *CorruptRowError) error {
	cause := ce.Error()
	if ce.Err != nil {
		cause = ce.Err.Error()
	}
	reason := CorruptReasonPrefix + cause
	parked, can, err := bk.park(ctx, ce.ID, reason)
	switch {
	case err != nil:
		return err
	case !can:
		return bk.errorf("next batch: %w", ce) // a live relay predates parking: back off as before
	case !parked:
		return nil
	}
	bk.r.m.countParked(ParkReasonCorrupt, 1)
	bk.r.log.WarnContext(ctx, "corrupt row parked; the rest of its bucket goes on", "bucket", bk.id, "id", ce.ID, "reason", reason)
	bk.ready = true
	return nil
}

// park parks row id when the fleet can and the relay owns the bucket; can is false when it cannot.
func (bk *bucket) park(ctx context.Context, id int64, reason string) (parked, can bool, err error) {
	r := bk.r
	if !bk.owned() {
		return false, true, nil
	}
	if f, err := r.store.Fleet(ctx); err != nil || !f.CanPark {
		if err != nil {
			err = bk.errorf("can the fleet park: %w", err)
		}
		return false, f.CanPark, err
	}
	if !bk.owned() {
		return false, true, nil
	}
	failpoint("relay/before-park")
	if err := r.store.Park(ctx, r.opts.RelayID, bk.id, id, reason); err != nil {
		return false, true, bk.errorf("park row %d: %w", id, err)
	}
	bk.settled()
	return true, true, nil
}

// strike counts a failure of a row published alone, and parks it at ParkAfter; parked: do not back off.
func (bk *bucket) strike(ctx context.Context, batch []*outbox.Message, ack int, pubErr error) (parked bool, err error) {
	if len(batch) != 1 || ack != 0 {
		return false, nil // only a row published alone is judged
	}
	r, row := bk.r, batch[0]
	s := bk.strikes
	if s == nil || s.id != row.ID {
		s = &strike{id: row.ID}
		bk.strikes = s
	}
	// A stop's cancellation never gets here.
	if p := r.opts.ParkPolicy; p != ParkAnyFailure && (p != ParkUnpublishable || !errors.Is(pubErr, ErrUnpublishable)) {
		s.n = 0
		return false, nil
	}
	s.n++
	if s.n < r.opts.ParkAfter {
		return false, nil
	}
	reason := pubErr.Error()
	parked, can, err := bk.park(ctx, row.ID, reason)
	switch {
	case err != nil:
		return false, err
	case !can:
		if !s.deferred {
			s.deferred = true
			r.log.WarnContext(ctx, "parking deferred: a live relay predates parking; retrying the row", "bucket", bk.id, "id", row.ID, "message_id", row.MessageID.String(), "topic", row.Topic, "attempts", s.n, "error", pubErr)
		}
		return false, nil
	case !parked:
		return true, nil
	}
	class := ParkReasonFailure
	if errors.Is(pubErr, ErrUnpublishable) {
		class = ParkReasonUnpublishable
	}
	r.m.countParked(class, 1)
	r.log.WarnContext(ctx, "row parked; later rows of its key wait until it is requeued", "bucket", bk.id, "id", row.ID, "message_id", row.MessageID.String(), "topic", row.Topic, "key", printableKey(row.Key), "reason", reason, "attempts", s.n)
	return true, nil
}

const maxLoggedKey = 64

// printableKey renders a key for a log line, as text or hex, at most maxLoggedKey bytes.
func printableKey(k []byte) string {
	if k == nil {
		return "<nil>"
	}
	printable := utf8.Valid(k) && strings.IndexFunc(string(k), func(c rune) bool { return !unicode.IsPrint(c) }) < 0
	s := string(k)
	if !printable {
		s = "0x" + hex.EncodeToString(k)
	}
	if len(s) > maxLoggedKey {
		cut := maxLoggedKey
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
