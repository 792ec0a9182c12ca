package inbox

import (
	"context"
	"fmt"
	"time"
)

// Purge deletes the processed ids older than Options.Retention, in
// statements of at most Options.PurgeBatchSize rows that each commit, until
// none is left or ctx is done, and returns how many it deleted. It is safe
// to run alongside Handle and from several processes at once.
func (ib *Inbox) Purge(ctx context.Context) (int64, error) {
	cutoff := ib.clock.Now().Add(-ib.opts.Retention).UnixMilli()
	var total int64
	for {
		res := ib.db.WithContext(ctx).Exec(ib.sql.purge, cutoff)
		if err := res.Error; err != nil {
			return total, fmt.Errorf("inbox: purge %s: %w", ib.table, err)
		}
		total += res.RowsAffected
		if res.RowsAffected > 0 {
			ib.m.purged.Add(context.WithoutCancel(ctx), res.RowsAffected, ib.m.tableAttrs)
		}
		if res.RowsAffected < int64(ib.opts.PurgeBatchSize) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("inbox: purge %s: %w", ib.table, err)
		}
	}
}

// RunPurge runs Purge at once and then every Options.PurgeInterval until ctx
// is done, then returns nil; a failed purge is logged and retried later.
func (ib *Inbox) RunPurge(ctx context.Context) error {
	for {
		start := ib.clock.Now()
		n, err := ib.Purge(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			ib.log.Warn("purge failed; retrying at the next interval", "purged", n, "next", ib.opts.PurgeInterval, "error", err)
		case n > 0:
			ib.log.Info("purged processed ids", "purged", n, "retention", ib.opts.Retention, "took", ib.clock.Now().Sub(start).Round(time.Millisecond))
		default:
			ib.log.Debug("nothing to purge", "retention", ib.opts.Retention)
		}
		if !sleep(ctx, ib.clock, ib.opts.PurgeInterval) {
			return nil
		}
	}
}
