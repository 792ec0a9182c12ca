package kafkapub_test

import (
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/kafkapub"
)

// TestZeroConfigUsesTheDocumentedDefaults proves the figures the docs give
// for a Config whose fields are zero (the publisher's part of the README's
// defaults, which relay's TestZeroOptionsUseTheDocumentedDefaults pinned
// before the publisher left the engine).
func TestZeroConfigUsesTheDocumentedDefaults(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"DefaultMessageIDHeader", kafkapub.DefaultMessageIDHeader, "x-outbox-message-id"},
		{"DefaultBatchBytes", kafkapub.DefaultBatchBytes, 1 << 20},
		{"DefaultMaxBatchRecords", kafkapub.DefaultMaxBatchRecords, 1000},
		{"DefaultPublishTimeout", kafkapub.DefaultPublishTimeout, 10 * time.Second},
		{"DefaultTransactionalIDPrefix", kafkapub.DefaultTransactionalIDPrefix, "outbox-"},
		{"DefaultTransactionTimeout", kafkapub.DefaultTransactionTimeout, time.Minute},
		{"MaxPublishSpanLinks", kafkapub.MaxPublishSpanLinks, 128},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v; the docs document %v", c.name, c.got, c.want)
		}
	}
}
