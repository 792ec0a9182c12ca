package chaos

import (
	"context"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/relay"
)

// The poison key's head is a record larger than the relays' BatchBytes (1
// MiB), which they park as unpublishable; poisonRows rows follow it.
const (
	poisonKey  = "poison"
	poisonRows = 20
)

var poisonHead = "head:" + strings.Repeat("x", 2<<20)

// poison writes poisonKey's head, then one row every WriteFor/poisonRows,
// and halfway through WriteFor repairs and requeues the head (see
// repairPoison); the key's rows must then arrive in commit order like any
// other key's. It returns whether the head was seen parked and how many
// rows the requeue changed.
func poison(ctx context.Context, db *gorm.DB, topic string, cfg RunConfig, led *ledger) (parked bool, requeued int64, err error) {
	commit := func(value string) (int64, error) {
		m := outbox.NewStringMessage(topic, poisonKey, value)
		if err := outbox.Enqueue(db.WithContext(ctx), m); err != nil {
			return 0, fmt.Errorf("chaos: enqueue a poison row: %w", err)
		}
		led.mu.Lock()
		led.written++
		led.committed++
		led.perKey[poisonKey] = append(led.perKey[poisonKey], m.MessageID.String())
		led.mu.Unlock()
		return m.ID, nil
	}
	head, err := commit(poisonHead)
	if err != nil {
		return false, 0, err
	}
	start := time.Now()
	repaired := false
	for i := 1; i <= poisonRows && ctx.Err() == nil; i++ {
		due := time.Duration(float64(cfg.WriteFor) * float64(i) / float64(poisonRows+1))
		if el := time.Since(start); el < due {
			time.Sleep(due - el)
		}
		if !repaired && time.Since(start) >= cfg.WriteFor/2 {
			repaired = true
			if parked, requeued, err = repairPoison(ctx, db, head); err != nil {
				return parked, requeued, err
			}
		}
		if _, err := commit(fmt.Sprint(i)); err != nil {
			return parked, requeued, err
		}
	}
	return parked, requeued, nil
}

// repairPoison waits (at most 30 s) for the poison head to be parked,
// repairs it (a small value) and requeues the key, as an operator would.
func repairPoison(ctx context.Context, db *gorm.DB, head int64) (parked bool, requeued int64, err error) {
	for end := time.Now().Add(30 * time.Second); !parked && time.Now().Before(end) && ctx.Err() == nil; time.Sleep(100 * time.Millisecond) {
		var n int64
		if err := db.Model(&outbox.Message{}).Where("id = ? AND parked_at_ms IS NOT NULL", head).Count(&n).Error; err == nil && n == 1 {
			parked = true
		}
	}
	if err := db.Model(&outbox.Message{}).Where("id = ?", head).Update("record_value", []byte("head:repaired")).Error; err != nil {
		return parked, 0, fmt.Errorf("chaos: repair the poison row: %w", err)
	}
	store, err := gormstore.New(db, gormstore.Options{})
	if err == nil {
		requeued, err = store.RequeueParked(ctx, relay.ParkedSelector{Key: []byte(poisonKey)})
	}
	if err != nil {
		return parked, requeued, fmt.Errorf("chaos: requeue the poison key: %w", err)
	}
	return parked, requeued, nil
}
