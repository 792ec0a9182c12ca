package pgnotify_test

import (
	"context"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/pgnotify"
	"github.com/gorm-outbox/outbox/relay"
)

// The pgnotify blocks of docs/relays.md, compiled here: each function's body
// is a block of the guide, verbatim (TestDocsGoBlocksAreCompiledCode at the
// repository's root checks it).

func relayWithHintTransport(ctx context.Context, store relay.Store, pub relay.Publisher, notifier *relay.Notifier, pgDSN string) error {
	tr, err := pgnotify.New(pgnotify.Config{ConnString: pgDSN, Channel: "orders_outbox"})
	if err != nil {
		return err
	}
	defer tr.Close() // once Run has returned
	r, err := relay.New(store, pub, relay.Options{Notifier: notifier, HintTransport: tr})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

func writersWithSender(ctx context.Context, db *gorm.DB, tr *pgnotify.Transport) error {
	sender := tr.NewSender(pgnotify.SenderOptions{})
	go sender.Run(ctx) // until ctx is done
	return db.Use(outbox.Plugin{Notifier: sender})
}

var (
	_ = relayWithHintTransport
	_ = writersWithSender
)
