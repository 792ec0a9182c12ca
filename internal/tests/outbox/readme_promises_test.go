package outbox_test

// Tests of write-path behaviour the README promises and no other test pins
// down: the bounds of Config, a caller-set message id, the topic length
// limit and the default table names. The tests that the documents' snippets
// are the code the build compiles are in the root's readme_promises_test.go.

import (
	"errors"
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"gorm.io/gorm"
)

// TestConfigBoundsAreTheDocumentedOnes proves the README's configuration
// table: BucketCount 1–65536 (0 meaning 8), names matching
// [A-Za-z_][A-Za-z0-9_]{0,62}, and an invalid value failing db.Use with an
// error naming the field.
func TestConfigBoundsAreTheDocumentedOnes(t *testing.T) {
	o := testenv.Databases(t)[0]
	name63 := "_" + strings.Repeat("a", 61) + "9"
	valid := []outbox.Config{
		{},
		{BucketCount: 1},
		{BucketCount: 65536},
		{MessagesTable: name63, LeasesTable: "L", RelaysTable: "_r2"},
		{Schema: "Billing_2", MessagesTable: "m", LeasesTable: "l", RelaysTable: "r"},
	}
	for _, cfg := range valid {
		if err := o.Open(t, nil).Use(outbox.Plugin{Config: cfg}); err != nil {
			t.Errorf("db.Use(Plugin{%+v}) = %v; want nil", cfg, err)
		}
	}
	if outbox.MaxBucketCount != 65536 || outbox.DefaultBucketCount != 8 {
		t.Errorf("MaxBucketCount, DefaultBucketCount = %d, %d; the README documents 65536 and 8", outbox.MaxBucketCount, outbox.DefaultBucketCount)
	}
	invalid := []struct {
		cfg   outbox.Config
		field string
	}{
		{outbox.Config{BucketCount: 65537}, "BucketCount"},
		{outbox.Config{BucketCount: -8}, "BucketCount"},
		{outbox.Config{MessagesTable: name63 + "x"}, "MessagesTable"}, // 64 characters
		{outbox.Config{LeasesTable: "9leases"}, "LeasesTable"},
		{outbox.Config{RelaysTable: "relays-1"}, "RelaysTable"},
		{outbox.Config{Schema: "schéma"}, "Schema"},
		{outbox.Config{Schema: strings.Repeat("s", 64)}, "Schema"},
	}
	for _, c := range invalid {
		err := o.Open(t, nil).Use(outbox.Plugin{Config: c.cfg})
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("db.Use(Plugin{%+v}) = %v; want an error naming %s", c.cfg, err, c.field)
		}
	}
}

// TestDocumentedWriteDefaults proves the README's Setup and Enqueueing
// sections on every database: Config{} creates outbox_messages,
// outbox_leases and outbox_relays; a message id set by the caller is
// stored as is (only a zero one is generated); a 249-character topic is
// accepted and a 250-character one is not.
func TestDocumentedWriteDefaults(t *testing.T) {
	for _, o := range testenv.Databases(t) {
		t.Run(o.Name, func(t *testing.T) {
			db := setup(t, o, outbox.Config{}, nil)
			for _, table := range []string{"outbox_messages", "outbox_leases", "outbox_relays"} {
				if !db.Migrator().HasTable(table) {
					t.Errorf("AutoMigrate(Config{}) did not create %s", table)
				}
			}

			id := outbox.NewUUID()
			mine := &outbox.Message{MessageID: id, Topic: "orders", Value: []byte("v")}
			generated := &outbox.Message{Topic: "orders", Value: []byte("w")}
			if err := db.Transaction(func(tx *gorm.DB) error { return outbox.Enqueue(tx, mine, generated) }); err != nil {
				t.Fatal(err)
			}
			if mine.MessageID != id || generated.MessageID.IsZero() || generated.MessageID == id {
				t.Fatalf("message ids after Enqueue: %s (set %s), %s (unset); want the caller's kept and a fresh one generated", mine.MessageID, id, generated.MessageID)
			}
			var stored outbox.Message
			if err := db.First(&stored, mine.ID).Error; err != nil {
				t.Fatal(err)
			}
			if stored.MessageID != id {
				t.Fatalf("stored message id %s; want the caller's %s", stored.MessageID, id)
			}
			var text string
			if err := db.Table(outbox.DefaultMessagesTable).Where("id = ?", mine.ID).Pluck("message_id", &text).Error; err != nil {
				t.Fatal(err)
			}
			if text != id.String() || len(text) != 36 || text != strings.ToLower(text) {
				t.Fatalf("message_id column reads %q; want the 36-char lowercase %q", text, id.String())
			}

			if err := db.Create(&outbox.Message{Topic: strings.Repeat("t", outbox.MaxTopicLength)}).Error; err != nil {
				t.Fatalf("Create with a %d-character topic = %v; want nil", outbox.MaxTopicLength, err)
			}
			if err := db.Create(&outbox.Message{Topic: strings.Repeat("t", outbox.MaxTopicLength+1)}).Error; !errors.Is(err, outbox.ErrInvalidMessage) {
				t.Fatalf("Create with a %d-character topic = %v; want ErrInvalidMessage", outbox.MaxTopicLength+1, err)
			}
			if outbox.MaxTopicLength != 249 {
				t.Fatalf("MaxTopicLength = %d; the README documents 249", outbox.MaxTopicLength)
			}
		})
	}
}
