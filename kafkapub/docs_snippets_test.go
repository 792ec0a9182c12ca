package kafkapub_test

import (
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/relay"
)

// The code block of docs/fenced-publishing.md, compiled here: the
// function's body is the block, verbatim (TestDocsGoBlocksAreCompiledCode at
// the repository's root checks it).

func fencedPublishing(store relay.Store, brokers []string) (*relay.Relay, error) {
	pub, err := kafkapub.New(kafkapub.Config{
		Brokers: brokers,
		// transactional ids "outbox-orders-0" … "outbox-orders-7": unique to this outbox in the cluster
		Transactions: &kafkapub.Transactions{Outbox: "orders"},
	})
	if err != nil {
		return nil, err
	}
	return relay.New(store, pub, relay.Options{}) // the relay tells pub which buckets it owns
}

var _ = fencedPublishing
