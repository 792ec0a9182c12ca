package outbox_test

// Tests of write-path behaviour the README promises and no other test pins
// down: the bounds of Config, a caller-set message id, the topic length
// limit and the default table names.

import (
	"errors"
	"os"
	"slices"
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

// TestSetupSnippetIsTheSameInTheREADMEThePackageDocAndExampleSetup keeps
// the one setup snippet one: docs/writing.md's (Setup), the package
// documentation's (go doc outbox) and Example_setup's, which compiles and
// runs it, hold the same lines (indentation and alignment aside).
func TestSetupSnippetIsTheSameInTheREADMEThePackageDocAndExampleSetup(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	// between returns the lines of s after the first line containing from
	// (itself after after) up to the first containing to, each with its
	// indentation, a strip prefix and repeated spaces removed.
	between := func(s, after, from, to, strip string) []string {
		_, s, _ = strings.Cut(s, after)
		_, s, ok := strings.Cut(s, from)
		if !ok {
			t.Fatalf("no %q after %q", from, after)
		}
		_, s, _ = strings.Cut(s, "\n")
		s, _, ok = strings.Cut(s, to)
		if !ok {
			t.Fatalf("no %q after %q", to, from)
		}
		var out []string
		for line := range strings.Lines(s) {
			line = strings.TrimPrefix(strings.TrimSpace(line), strip)
			if line = strings.Join(strings.Fields(line), " "); line != "" {
				out = append(out, line)
			}
		}
		return out
	}
	readme := between(read("../../../docs/writing.md"), "\n## Setup\n", "```go", "```", "")
	doc := between(read("../../../outbox.go"), "Package outbox is", "same notifier", "// Then create", "//")
	example := between(read("../../../example_test.go"), "func Example_setup", "setup := func", "return nil\n", "")
	if len(readme) < 5 || !slices.Equal(readme, doc) || !slices.Equal(readme, example) {
		t.Fatalf("the setup snippets differ:\ndocs/writing.md:\n%s\npackage doc:\n%s\nExample_setup:\n%s",
			strings.Join(readme, "\n"), strings.Join(doc, "\n"), strings.Join(example, "\n"))
	}
}

// TestREADMEExampleIsExamplesReadme: the README's example is
// examples/readme/main.go, which the build compiles, character for
// character.
func TestREADMEExampleIsExamplesReadme(t *testing.T) {
	readme, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("../../../examples/readme/main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "\n## Example\n\n```go\n")
	block, _, closed := strings.Cut(block, "```")
	if !ok || !closed {
		t.Fatal("README.md has no go block under \"## Example\"")
	}
	if block != string(src) {
		t.Errorf("README.md's example differs from examples/readme/main.go:\nREADME:\n%s\nexamples/readme/main.go:\n%s", block, src)
	}
}
