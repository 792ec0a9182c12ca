package outboxtest_test

import (
	"errors"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/outboxtest"
)

type order struct {
	ID string `gorm:"primaryKey"`
}

// TestEnvPublishesCommittedRowsOnly: in an Env, a committed transaction's
// record reaches the topic with its message id, a rolled-back one's never
// does, and the outbox table ends empty.
func TestEnvPublishesCommittedRowsOnly(t *testing.T) {
	env := outboxtest.New(t, outboxtest.Options{})
	if err := env.DB.AutoMigrate(&order{}); err != nil {
		t.Fatal(err)
	}
	topic := env.Topic(t, 2)
	place := func(id string, fail bool) error {
		return env.DB.Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&order{ID: id}).Error; err != nil {
				return err
			}
			if err := outbox.Enqueue(tx, outbox.NewStringMessage(topic, id, "placed")); err != nil {
				return err
			}
			if fail {
				return errors.New("rolled back on purpose")
			}
			return nil
		})
	}
	if err := place("o-1", true); err == nil {
		t.Fatal("the failing transaction committed")
	}
	if err := place("o-2", false); err != nil {
		t.Fatal(err)
	}
	recs := env.Records(t, topic, 1)
	if len(recs) != 1 || string(recs[0].Key) != "o-2" {
		t.Fatalf("records = %v; want the committed order's only", recs)
	}
	var id string
	for _, h := range recs[0].Headers {
		if h.Key == kafkapub.DefaultMessageIDHeader {
			id = string(h.Value)
		}
	}
	if len(id) != 36 {
		t.Errorf("message id header = %q; want a UUID", id)
	}
	var n int64
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if err := env.DB.Table(env.Config.MessagesTableName()).Count(&n).Error; err == nil && n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still in the outbox 30 s after their record was read", n)
		}
	}
}
