package relay_test

import (
	"context"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// The first code block of docs/relays.md, compiled here: the function's
// body is the block, verbatim (TestDocsGoBlocksAreCompiledCode at the
// repository's root checks it).

func runningInProcess(ctx context.Context, db *gorm.DB, cfg outbox.Config, notifier *relay.Notifier) error {
	store, err := gormstore.New(db, gormstore.Options{Config: cfg}) // the same cfg as the plugin
	if err != nil {
		return err
	}
	pub, err := kafkapub.New(kafkapub.Config{Brokers: []string{"kafka:9092"}})
	if err != nil {
		return err
	}
	defer pub.Close()
	r, err := relay.New(store, pub, relay.Options{Notifier: notifier, MetricsBacklog: true}) // the notifier given to the plugin
	if err != nil {
		return err
	}
	return r.Run(ctx) // until ctx is done; then it finishes its batches and releases its leases
}

var _ = runningInProcess
