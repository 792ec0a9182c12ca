package outbox_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// TestErrorsReadOnce: every error the package returns names its origin once
// ("outbox: " at the start, never again inside) and says its sentinel's
// words once, wherever it surfaces: the plugin's Create, Enqueue, a
// message created without the plugin, ValidateTopic, Config.Validate and
// DecodeHeaders. Each still matches its sentinel with errors.Is.
func TestErrorsReadOnce(t *testing.T) {
	o := testenv.Databases(t)[0] // SQLite: the messages never reach a server
	db := setup(t, o, outbox.Config{}, nil)
	plain := o.Open(t, nil) // no plugin: Message.BeforeCreate prepares
	if err := outbox.AutoMigrate(plain, outbox.Config{}); err != nil {
		t.Fatal(err)
	}
	bad := outbox.Config{BucketCount: -3}
	cases := []struct {
		name     string
		err      error
		sentinel error
		words    string
	}{
		{"plugin create, empty topic", db.Create(outbox.NewStringMessage("", "k", "v")).Error, outbox.ErrInvalidMessage, "invalid message"},
		{"plugin create, invalid scope", db.Scopes(outbox.WithConfig(bad)).Create(outbox.NewStringMessage("t", "k", "v")).Error, nil, "Config.BucketCount"},
		{"enqueue, empty topic", outbox.Enqueue(db, outbox.NewStringMessage("", "k", "v")), outbox.ErrInvalidMessage, "invalid message"},
		{"enqueue, nil message", outbox.Enqueue(db, nil), outbox.ErrInvalidMessage, "invalid message"},
		{"enqueue, invalid scope", outbox.Enqueue(db.Scopes(outbox.WithConfig(bad)), outbox.NewStringMessage("t", "k", "v")), nil, "Config.BucketCount"},
		{"create without the plugin", plain.WithContext(context.Background()).Create(outbox.NewStringMessage("a b", "k", "v")).Error, outbox.ErrInvalidMessage, "invalid message"},
		{"ValidateTopic", outbox.ValidateTopic(".."), outbox.ErrInvalidMessage, "invalid message"},
		{"Config.Validate", bad.Validate(), nil, "Config.BucketCount"},
		{"DecodeHeaders", func() error { _, err := outbox.DecodeHeaders([]byte{9}); return err }(), outbox.ErrCorruptHeaders, "corrupt headers"},
	}
	for _, c := range cases {
		if c.err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		msg := c.err.Error()
		if !strings.HasPrefix(msg, "outbox: ") || strings.Count(msg, "outbox: ") != 1 {
			t.Errorf("%s: %q; want one \"outbox: \", at the start", c.name, msg)
		}
		if strings.Count(msg, c.words) != 1 {
			t.Errorf("%s: %q; want %q once", c.name, msg, c.words)
		}
		if c.sentinel != nil && !errors.Is(c.err, c.sentinel) {
			t.Errorf("%s: %q does not match %v", c.name, msg, c.sentinel)
		}
	}
}

// TestASecondRegistrationFailsWithErrRegistered: a *gorm.DB takes one
// Plugin. GORM refuses a second db.Use by name with its own ErrRegistered;
// a second registration GORM lets through (the Plugin in gorm.Config.Plugins
// under another key, then db.Use) fails with an error wrapping it that says
// what happened, and the first registration keeps working.
func TestASecondRegistrationFailsWithErrRegistered(t *testing.T) {
	o := testenv.Databases(t)[0]
	db := o.Open(t, nil)
	if err := db.Use(outbox.Plugin{}); err != nil {
		t.Fatal(err)
	}
	if err := db.Use(outbox.Plugin{}); !errors.Is(err, gorm.ErrRegistered) {
		t.Fatalf("a second db.Use = %v; want gorm.ErrRegistered", err)
	}

	rec := &recorder{}
	db = o.Open(t, &gorm.Config{Plugins: map[string]gorm.Plugin{"orders-outbox": outbox.Plugin{Notifier: rec}}})
	err := db.Use(outbox.Plugin{})
	if !errors.Is(err, gorm.ErrRegistered) || !strings.Contains(err.Error(), "outbox: Plugin already registered on this *gorm.DB") {
		t.Fatalf("db.Use after gorm.Config.Plugins registered the plugin = %v; want an error wrapping gorm.ErrRegistered saying the plugin is already registered", err)
	}
	if err := outbox.AutoMigrate(db, outbox.Config{}); err != nil {
		t.Fatal(err)
	}
	if err := db.Create(inBucket(2)).Error; err != nil {
		t.Fatal(err)
	}
	if got := rec.take(); len(got) != 1 || !slices.Equal(got[0], []int{2}) {
		t.Fatalf("notifications after the refused registration = %v; want [[2]] from the first", got)
	}
}
